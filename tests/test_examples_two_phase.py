"""examples/two_phase_linesearch.py: a protocol with phases in server state runs unchanged in Simulation and under
the Flower adapter, its search round takes the best step size, and with one step size of 1 it is FedAvg."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsolve.engine.metrics import evaluate

ROOT = Path(__file__).resolve().parents[1]


def _example():
    name = "two_phase_linesearch"
    if name not in sys.modules:   # registers fedavg_linesearch once per process
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(autouse=True, scope="module")
def _unregister_after():
    """The example registers ``fedavg_linesearch`` in this process; later tests see the registry as it was."""
    yield
    from fedsolve.families import ALGORITHMS

    ALGORITHMS.pop("fedavg_linesearch", None)
    sys.modules.pop("two_phase_linesearch", None)


def test_sequential_and_vectorized_executors_agree():
    ex = _example()
    prob = ex.tiny_problem()
    params = {"lr": 0.05, "batch_size": 16}
    sims = [ex.simulation(prob, "fedavg_linesearch", params, 6, executor) for executor in ("sequential", "vectorized")]
    for s in sims:
        s.run()
    for k in ("w", "d", "phase"):
        torch.testing.assert_close(sims[0].server[k], sims[1].server[k], rtol=1e-5, atol=1e-6)
    assert sims[0].ledger.uplink_bytes == sims[1].ledger.uplink_bytes


def test_search_round_moves_to_the_best_step_size():
    """After a train round the server holds d = (weighted mean of the uploads) - w; the search round's w is
    w + eta* d with eta* minimizing the participants' p_i-weighted full-batch training loss (computed here
    independently of the algorithm)."""
    ex = _example()
    prob = ex.tiny_problem()
    steps = (0.25, 1.0, 3.0, 8.0)
    sim = ex.simulation(prob, "fedavg_linesearch", {"lr": 0.05, "batch_size": 16, "step_sizes": steps}, 8)
    seen = set()
    while sim.round < 8:
        server, _ = sim.state()
        phase, w, d = ex.PHASES.current(server), server["w"].clone(), server["d"].clone()
        info = sim.step()
        after = sim.state()[0]
        assert ex.PHASES.current(after) == {"train": "search", "search": "train"}[phase]   # the phases alternate
        if phase == "train":
            assert torch.equal(after["w"], w) and after["d"].norm() > 0  # a train round only proposes d
            continue
        ids = info["ids"]
        p = prob.data.weights[ids].double()
        p = p / p.sum()
        L = []
        for eta in steps:
            _, per = evaluate(prob, (w + eta * d).unsqueeze(0).expand(prob.num_clients, -1), True, (), split="train")
            L.append(float(sum(pi * per[i]["loss"] for pi, i in zip(p.tolist(), ids.tolist()))))
        best = steps[int(np.argmin(L))]
        seen.add(best)
        torch.testing.assert_close(after["w"], w + best * d, rtol=1e-6, atol=1e-7)
    assert len(seen) >= 1


def test_one_step_size_of_one_is_fedavg_every_two_rounds():
    ex = _example()
    prob = ex.tiny_problem()
    gd = {"lr": 0.1, "batch_size": None, "local_epochs": 2}
    two = ex.simulation(prob, "fedavg_linesearch", {**gd, "step_sizes": (1.0,)}, 6, fraction=1.0)
    one = ex.simulation(prob, "fedavg", gd, 3, fraction=1.0)
    two.run()
    one.run()
    torch.testing.assert_close(two.server["w"], one.server["w"], rtol=1e-5, atol=1e-6)


def test_runs_under_the_flower_adapter_with_the_simulation_numbers(tmp_path):
    pytest.importorskip("flwr", reason="needs the flower extra")
    _example()
    from fedsolve.flower.replay import simulate_with_participation
    from fedsolve.flower.task import load_task
    from test_flower_adapter import EXPERIMENT, _compare, _run

    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT.replace("rounds: 3", "rounds: 4"))
    rc = {"experiment": str(exp), "overrides": "algorithm.name=fedavg_linesearch", "wait-for-nodes": 5.0,
          "round-timeout": 5.0, "eval-timeout": 5.0}
    task = load_task(rc)
    _, _, run, hist = _run(rc)
    assert [len(p["participants"]) for p in run.participation] == [3, 3, 3, 3]
    res, _ = simulate_with_participation(task)
    _compare(hist, res.history)
    assert hist[-1]["round"] == 4 and hist[-1]["test_loss"] < hist[0]["test_loss"]


def test_doc_shows_the_example_code():
    doc = (ROOT / "docs" / "writing-an-algorithm.md").read_text()
    example = (ROOT / "examples" / "two_phase_linesearch.py").read_text()
    start = doc.index("PHASES = PhaseTable(")
    block = doc[start:doc.index("```", start)]
    for part in block.strip().split("\n\n\n"):   # the phase table and the algorithm, as in the file
        assert part.strip() in example, "the two-phase example in docs/writing-an-algorithm.md differs from the file"
