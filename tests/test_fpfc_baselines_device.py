"""FPFC's clustering baselines (IFCA, CFL, PACFL) on a GPU: their diagnostics and read-outs move tensors to the
CPU before ``.numpy()``. Checked on a machine without a GPU through ``tests/fake_cuda.py`` (tensors "on cuda" are
tagged CPU tensors, and ``.numpy()`` of one fails as on CUDA), in a subprocess so the stand-in stays there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import fake_cuda
fake_cuda.install()
import torch
from test_clustering_baselines import regression
from fedsolve.families.clustered.baselines import CFL, IFCA, PACFL
from fedsolve.engine import Simulation, SimulationConfig

cases = {"ifca": (IFCA, {"num_clusters": 2, "lr": 0.1}),
         # a split in the first rounds: the cosine-distance matrix of the updates goes to sklearn
         "cfl": (CFL, {"eps1": 100.0, "eps2": 0.0, "warmup_rounds": 1, "lr": 0.1, "local_epochs": 1.0}),
         "pacfl": (PACFL, {"threshold": 4.0, "local_epochs": 1.0})}
for name, (cls, params) in cases.items():
    prob = regression()
    algo = cls(params, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=4, eval_every=2, executor="sequential", device="cuda",
                                                  metrics=[]), seed=0)
    res = sim.run()
    assert sim.device.type == "cuda" and fake_cuda.tagged(next(iter(sim.server.values()))), name
    assert "ari" in res.extras and res.extras["num_clusters"] >= 1, (name, res.extras)
    if name == "cfl":
        assert res.extras["num_clusters"] >= 2, res.extras   # the split ran
    print(name, res.extras["num_clusters"], res.extras["ari"])
print("ok")
"""


def test_clustering_baselines_diagnostics_run_with_tensors_on_cuda():
    here = Path(__file__).resolve().parent
    import fake_cuda

    if not fake_cuda.available():
        pytest.skip("this torch lacks the internals tests/fake_cuda.py uses")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                       cwd=here.parent)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout + r.stderr)[-3000:]
