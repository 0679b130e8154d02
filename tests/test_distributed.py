"""Client-sharded simulation on torch.distributed (engine/distributed.py, experiments/distributed.py): 2 and 4 gloo
processes started by torchrun on this machine give the single-process metrics for FedAvg, FedAPM and FPFC with
partial participation; a distributed checkpoint resumes in one process and a single-process one distributed; a
checkpoint between evaluations holds every client's rows; a rank that stops before the run stops every rank with
one line; outside torchrun ``--distributed`` is one line, exit 2.

Tolerance: relative 1e-6 (absolute 1e-7 for values near zero). The sequential, batched and linear executors give
bit-identical numbers here; the vectorized executor batches fewer clients per ``vmap`` call on each rank (and
the evaluation scores fewer clients per call), so its float32 products round differently: FPFC's train loss moved
by 4e-8 relative in 6 rounds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedsolve.engine.distributed import DistributedTransport, shard_clients
from fedsolve.experiments.config import ConfigError, load_config
from fedsolve.experiments.distributed import run_distributed
from fedsolve.experiments.runner import build_algorithm, build_problem, run_one

WORKER = Path(__file__).with_name("distributed_worker.py")

DIGITS = """\
name: dist_{name}
seeds: [3]
threads: 1
data:
  dataset: digits
  num_clients: 8
  partition: dirichlet
  partition_params: {{alpha: 0.5, min_size: 20}}
model:
  name: mlp
  params: {{hidden: [16]}}
  personalization: output
simulation:
  rounds: 4
  eval_every: 2
  sampling: {{clients_per_round: 3}}
  executor: {executor}
defaults: {{lr: 0.5, local_epochs: 1, batch_size: 32}}
algorithm: {algorithm}
"""
FPFC = """\
name: dist_fpfc
seeds: [1]
threads: 1
data:
  dataset: synthetic_fpfc
  num_clients: null
  params: {scenario: [3, 3, 2, 2], size_scale: 0.2}
model:
  name: logreg
simulation:
  rounds: 4
  eval_every: 2
  sampling: {clients_per_round: 6}
  executor: vectorized
  metrics: []
defaults: {lr: 0.1, local_epochs: 3, batch_size: null}
algorithm: {name: fpfc, params: {lam: 0.6, rho: 1.0, a: 3.7, xi: 1.0e-4, nu: 0.1, init_std: 0.1}}
"""
CONFIGS = {
    "fedavg": DIGITS.format(name="fedavg", executor="batched", algorithm="{name: fedavg}"),
    "fedapm": DIGITS.format(name="fedapm", executor="vectorized", algorithm="{name: fedapm, params: {rho: 0.3}}"),
    "fpfc": FPFC,
}
#: FedAPM with checkpoints every round and no evaluation between round 0 and the last
SPARSE = ["simulation.eval_every=10", "simulation.checkpoint_every=1"]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)


def same_history(got: list[dict], want: list[dict]) -> None:
    assert [r["round"] for r in got] == [r["round"] for r in want]
    for g, w in zip(got, want):
        assert set(g) == set(w)
        bad = {k: (g[k], w[k]) for k in w if not close(g[k], w[k])}
        assert not bad, (w["round"], bad)


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def client_rows(path: Path, m: int) -> dict[str, torch.Tensor]:
    from fedsolve.core.states import ClientStates

    ck = torch.load(path, weights_only=False)
    states = ClientStates.load(ck["clients"], m)
    return {k: states[k] for k in states.keys()}


def single(cfgs: dict[str, Path], base: Path, name: str, sets: list[str] = (), resume: bool = False,
           out: Path | None = None) -> Path:
    """A single-process run of config ``name`` (in this process), into ``out`` (default ``base/name``)."""
    cfg = load_config(cfgs[name], list(sets))
    out = out or base / name
    run_one(cfg, cfg.algorithm, cfg.seeds[0], out, resume=resume, progress=False, write_report=False)
    return out


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("configs")
    for name, text in CONFIGS.items():
        (d / f"{name}.yaml").write_text(text)
    return {name: d / f"{name}.yaml" for name in CONFIGS}


@pytest.fixture(scope="module")
def reference(configs, tmp_path_factory) -> Path:
    """The single-process runs: each config, FedAPM's first 2 rounds (resumed distributed below), FedAPM with a
    checkpoint every round (its checkpoint after round 2 kept as copy.pt)."""
    base = tmp_path_factory.mktemp("single")
    for name in CONFIGS:
        single(configs, base, name)
    single(configs, base, "fedapm", ["simulation.rounds=2"], out=base / "fedapm_first2")
    cfg = load_config(configs["fedapm"], SPARSE)
    problem = build_problem(cfg, 3)
    sys.path.insert(0, str(WORKER.parent))
    try:
        from distributed_worker import CopyCheckpoint
    finally:
        sys.path.remove(str(WORKER.parent))
    from fedsolve.engine.loop import JsonlLogger, Simulation

    (base / "copy").mkdir()
    Simulation(problem, build_algorithm(cfg, cfg.algorithm, problem), cfg.simulation, 3, out_dir=base / "copy",
               callbacks=[CopyCheckpoint(2, base / "copy" / "copy.pt"), JsonlLogger(base / "copy" / "metrics.jsonl")]
               ).run()
    return base


def torchrun(n: int, configs: dict[str, Path], reference: Path, out: Path) -> dict[int, dict]:
    """The distributed jobs with ``n`` gloo processes; returns each rank's log ({job: None or its error})."""
    import shutil

    shutil.copytree(reference / "fedapm_first2", out / "resumed")
    jobs = [{"name": name, "config": str(configs[name]), "out": str(out / name)} for name in CONFIGS]
    jobs += [{"name": "refused", "config": str(configs["fedavg"]), "out": str(out / "fedavg")},
             {"name": "first2", "config": str(configs["fedapm"]), "set": ["simulation.rounds=2"],
              "out": str(out / "first2")},
             {"name": "resumed", "config": str(configs["fedapm"]), "out": str(out / "resumed"), "resume": True},
             {"name": "copy", "config": str(configs["fedapm"]), "set": SPARSE, "out": str(out / "copy"),
              "copy_at": 2}]
    (out / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "FEDSOLVE_CALIBRATE": "0"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                        str(WORKER), str(out / "jobs.json")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(n)}


@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=["2ranks", "4ranks"])
def launched(request, configs, reference, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ranks{request.param}")
    return request.param, torchrun(request.param, configs, reference, out), out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_distributed_metrics_equal_one_process(launched, reference, name):
    n, logs, out = launched
    assert all(log[name] is None for log in logs.values())
    same_history(metrics(out / name), metrics(reference / name))
    got, want = (json.loads((f / "per_client.json").read_text()) for f in (out / name, reference / name))
    assert len(got) == len(want) and all(close(g[k], w[k]) for g, w in zip(got, want) for k in w)
    m = len(want)
    rows, ref = client_rows(out / name / "checkpoint.pt", m), client_rows(reference / name / "checkpoint.pt", m)
    assert set(rows) == set(ref)
    for k in ref:   # rank 0's checkpoint holds every client's rows, those the other ranks trained included
        torch.testing.assert_close(rows[k], ref[k], rtol=1e-6, atol=1e-7)


def test_a_rank_that_stops_before_the_run_stops_every_rank(launched):
    n, logs, out = launched
    assert "already holds a run" in logs[0]["refused"]
    for r in range(1, n):
        assert logs[r]["refused"].startswith("--distributed: rank 0 stopped before the run (ConfigError:")
    assert all("\n" not in log["refused"] for log in logs.values())


def test_distributed_checkpoint_resumes_in_one_process(launched, configs, reference):
    n, _, out = launched
    resumed = single(configs, out, "fedapm", resume=True, out=out / "first2")
    same_history(metrics(resumed), metrics(reference / "fedapm"))


def test_one_process_checkpoint_resumes_distributed(launched, reference):
    n, logs, out = launched
    assert logs[0]["resumed"] is None
    same_history(metrics(out / "resumed"), metrics(reference / "fedapm"))


def test_checkpoint_between_evaluations_holds_every_clients_rows(launched, reference):
    """Round 2 is not evaluated: the rows the other ranks trained in rounds 1-2 reach rank 0 before its checkpoint
    (CheckpointSync), so it equals the single-process checkpoint."""
    n, _, out = launched
    ck = torch.load(out / "copy" / "copy.pt", weights_only=False)
    assert ck["round"] == 2 and [r["round"] for r in ck["history"]] == [0]
    rows, ref = client_rows(out / "copy" / "copy.pt", 8), client_rows(reference / "copy" / "copy.pt", 8)
    for k in ref:
        torch.testing.assert_close(rows[k], ref[k], rtol=1e-6, atol=1e-7)
    same_history(metrics(out / "copy"), metrics(reference / "copy"))


def test_shard_clients_contiguous_and_balanced_by_samples():
    sizes = torch.tensor([100, 10, 10, 10, 10, 10, 10, 40])   # 200 samples: 100 on each rank
    assert shard_clients(sizes, 2).tolist() == [0, 1, 1, 1, 1, 1, 1, 1]
    owner = shard_clients(torch.tensor([5, 5, 5, 5, 5, 5, 5, 5, 5, 5]), 4)
    assert owner.tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]   # in order, every rank 2 or 3 clients
    assert shard_clients(torch.tensor([3, 3]), 4).tolist() == [1, 3]   # fewer clients than ranks: some own none
    assert shard_clients(torch.zeros(4, dtype=torch.long), 2).tolist() == [0, 0, 1, 1]   # by count


def test_outside_torchrun_distributed_is_one_line_exit_2(configs, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, "-m", "fedsolve", "run", str(configs["fedavg"]), "--out", str(tmp_path / "o"),
                        "--distributed"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "config error: --distributed: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set (this is not a torchrun "
        "process); launch with: torchrun --nproc-per-node N -m fedsolve run CONFIG --distributed"]
    assert not (tmp_path / "o").exists()


def test_tune_and_schedules_are_refused_in_one_line(configs, tmp_path):
    cfg = load_config(configs["fedavg"], ["algorithm.tune={param: lr, grid: [0.1, 0.2]}"])
    with pytest.raises(ConfigError, match=r"^algorithm.tune: not with --distributed"):
        run_distributed(cfg, cfg.algorithm, 3, tmp_path / "o")


def test_transport_needs_a_process_group():
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        DistributedTransport()
