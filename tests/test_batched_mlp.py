"""The ``batched`` executor (core/batched_mlp.py) against the sequential executor, and ``auto``'s calibration."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from fedsolve.families import get_algorithm
from fedsolve.core import batched_mlp as bm
from fedsolve.core.batched_mlp import BatchedMLPExecutor, mlp_layers
from fedsolve.core.context import ParamBlock
from fedsolve.core.executor import Work, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.selection import make_executor
from fedsolve.data.federated import FederatedData
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

SIZES = [37, 50, 23, 61, 12]  # unequal clients; with batch 10 most epochs end in a short batch


def data(sizes=SIZES, classes=4, shape=(1, 5, 5), seed=0, regression=False):
    g = torch.Generator().manual_seed(seed)
    N = sum(sizes)
    x = torch.randn(N, *shape, generator=g)
    y = torch.randn(N, 2, generator=g) if regression else torch.randint(0, classes, (N,), generator=g)
    off = torch.cumsum(torch.tensor([0] + list(sizes)), 0)
    m = len(sizes)
    return FederatedData(
        x,
        y,
        off,
        x[: 2 * m],
        y[: 2 * m],
        torch.arange(0, 2 * m + 1, 2),
        num_classes=None if regression else classes,
        name="tiny",
    )


class TanhNet(nn.Module):  # a chain built from nn.Sequential with other activations
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(25, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 4, bias=False)
        )

    def forward(self, x):
        return self.net(x)


PROBLEMS = {
    "mlp": lambda: FederatedProblem(data(), build_model_fn("mlp", (1, 5, 5), 4, hidden=(7, 6))),
    "logreg": lambda: FederatedProblem(data(), build_model_fn("logreg", (1, 5, 5), 4)),
    "tanh": lambda: FederatedProblem(data(), TanhNet),
    "mlp_sq": lambda: FederatedProblem(
        data(regression=True), build_model_fn("mlp", (1, 5, 5), 2, hidden=(6,)), loss="squared_error"
    ),
}
CASES = {
    "fedavg": dict(lr=0.1, batch_size=10, local_epochs=2),
    "fedavg_full": dict(lr=0.1, batch_size=None, local_steps=3),
    "fedprox": dict(lr=0.1, batch_size=10, local_epochs=1.5, mu=0.3, weight_decay=0.01),
    "local": dict(lr=0.1, batch_size=10, local_steps=4, weight_decay=0.02),
    "scaffold": dict(lr=0.1, batch_size=10, local_epochs=1.5, weight_decay=0.01),
    "fedadmm": dict(lr=0.1, batch_size=10, local_steps=3, rho=0.2, weight_decay=0.01),
}


def run_rounds(prob, algo, executor, rounds=3, variable=True, fraction=0.6):
    """``rounds`` engine rounds of ``algo`` on ``executor`` on the CPU (sampling ``fraction``, variable local work):
    ``(simulation, train losses, final server and client states)``, for comparing executors."""
    cfg = SimulationConfig(
        rounds=rounds,
        eval_every=rounds,
        executor="sequential",
        metrics=[],
        device="cpu",
        sampling={"fraction": fraction},
        work={"variable": "uniform"} if variable else {},
    )
    sim = Simulation(prob, algo, cfg, seed=2)
    sim.use_executor(executor)
    losses = [sim.run_round(t)["train_loss"] for t in range(rounds)]
    state = {k: v.clone() for k, v in sim.server.items() if v.is_floating_point()}
    state.update({f"client.{k}": v.clone() for k, v in sim.clients.items()})
    return sim, losses, state


def _run(prob, case, executor, rounds=3, variable=True):
    return run_rounds(prob, get_algorithm(case.split("_")[0])(CASES[case], prob), executor, rounds, variable)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("model", sorted(PROBLEMS))
def test_batched_matches_sequential(case, model):
    prob = PROBLEMS[model]()
    sim_b, loss_b, st_b = _run(prob, case, "batched")
    _, loss_s, st_s = _run(prob, case, "sequential")
    assert sim_b.executor.name == "batched"
    assert loss_b == pytest.approx(loss_s, rel=1e-5, abs=1e-6)
    assert st_b.keys() == st_s.keys() and st_b
    for k in st_s:
        torch.testing.assert_close(st_b[k], st_s[k], rtol=1e-5, atol=1e-6)
    # the run moved: the comparison is not between two untouched copies of the start
    x0 = prob.layout.flatten(prob.model).detach()
    moved = next(st_b[k] for k in ("w", "x", "z", "client.w") if k in st_b)
    assert (moved - x0).abs().max() > 1e-3


# updates that run a phase themselves (ctx.descend) on one block of the model, then state the other block's phase
PARTIAL = {
    "fedapm_output": (
        "fedapm",
        dict(
            lr=0.2,
            rho=0.05,
            sigma=0.02,
            personalization="output",
            batch_size=10,
            local_epochs=1.5,
            log_stationarity=False,
        ),
    ),
    "fedapm_input": (
        "fedapm",
        dict(
            lr=0.2,
            rho=0.05,
            sigma=0.02,
            personalization="input",
            v_shared="server",
            warm_start="local",
            batch_size=10,
            local_steps=3,
            personal_steps=2,
            log_stationarity=False,
            alpha="one",
        ),
    ),
    "fedalt_output": (
        "fedalt",
        dict(lr=0.2, personalization="output", batch_size=10, local_epochs=1, weight_decay=0.01),
    ),
    "fedrep": ("fedrep", dict(lr=0.2, batch_size=10, local_steps=2, personal_steps=3, personalization="output")),
}


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_block_phases_run_batched(case):
    """A personal phase run by the update itself (``ctx.descend`` of a block step) and the shared phase it states
    both run on the stacked kernels (only the block's layers get a gradient): the same rows, server state and
    training loss (over both phases) as the sequential executor."""
    name, cfg = PARTIAL[case]
    prob = PROBLEMS["mlp"]()
    sim_b, loss_b, st_b = run_rounds(prob, get_algorithm(name)(cfg, prob), "batched")
    _, loss_s, st_s = run_rounds(prob, get_algorithm(name)(cfg, prob), "sequential")
    assert sim_b.executor.name == "batched" and sim_b.executor.fallback is None  # no round fell back
    assert loss_b == pytest.approx(loss_s, rel=1e-5, abs=1e-6)
    assert st_b.keys() == st_s.keys()
    for k in st_s:
        torch.testing.assert_close(st_b[k], st_s[k], rtol=1e-5, atol=1e-6)
    v0 = sim_b.algo.split(prob.layout.flatten(prob.model).detach())[0]
    assert (st_b["client.v"] - v0).abs().max() > 1e-3  # the personal phase moved the personal rows


def test_block_step_gradient_only_for_its_layers():
    """A block step asks the MLP kernel for its layers' gradient only: the output layer's (nothing propagated
    below it) or the first layer's (propagated down to it); the update moves the block's coordinates only."""
    prob = PROBLEMS["mlp"]()
    ex = BatchedMLPExecutor(prob)
    ls = ex.kernel.layers
    d = prob.layout.dim
    last = torch.zeros(d, dtype=torch.bool)
    last[ls[-1].w[0] :] = True
    assert ex._block(ParamBlock(prob.layout, last), 1.0).layers == frozenset({len(ls) - 1})
    first = torch.zeros(d, dtype=torch.bool)
    first[: ls[0].w[1] * ls[0].w[2]] = True  # the first layer's weight only
    blk = ex._block(ParamBlock(prob.layout, first), 0.5)
    assert blk.layers == frozenset({0}) and blk.ranges == ((0, ls[0].w[1] * ls[0].w[2]),)
    P, G = torch.randn(3, d), torch.randn(3, d)
    P0, G0 = P.clone(), G.clone()
    blk.step(P, G, torch.ones(3, dtype=torch.bool), True, 0.1, 0.0, None, {})  # G is scratch: used in place
    a, b = blk.ranges[0]
    torch.testing.assert_close(P[:, a:b], P0[:, a:b] - 0.1 * 0.5 * G0[:, a:b])
    assert torch.equal(P[:, b:], P0[:, b:])


def test_block_phases_with_a_stopping_rule_do_not_run_batched(monkeypatch):
    """FedAPM's xi_controlled phases stop each client by a rule: the stacked kernels do not take them, so an explicit
    ``batched`` is refused with one line and ``auto`` runs a generic executor."""
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    prob = PROBLEMS["mlp"]()
    algo = get_algorithm("fedapm")({"lr": 0.1, "personalization": "output", "solver": "xi_controlled"}, prob)
    with pytest.raises(ValueError, match=r"'batched' does not run fedapm"):
        executor_for(algo, "batched")
    assert executor_for(algo).name in ("vectorized", "sequential")
    assert isinstance(
        executor_for(get_algorithm("fedapm")({"lr": 0.1, "personalization": "output"}, prob)), BatchedMLPExecutor
    )


def test_chunks_and_threads_give_the_same_numbers():
    prob = PROBLEMS["mlp"]()
    algo = get_algorithm("fedprox")(CASES["fedprox"], prob)
    cfg = SimulationConfig(rounds=1, executor="sequential", metrics=[])
    sim = Simulation(prob, algo, cfg, seed=0)

    ids = torch.arange(prob.num_clients)
    plan = build_plans({"train": Work(epochs=2, batch_size=10)}, prob.data.train_offsets, ids, sim.rngs, 0)["train"]
    start = prob.layout.flatten(prob.model).detach().repeat(len(ids), 1)
    ref, lref = BatchedMLPExecutor(prob, chunk=len(ids)).sgd(start, 0.1, plan, prob.data, start, 0.3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out, lout = BatchedMLPExecutor(prob, chunk=2).sgd(start, 0.1, plan, prob.data, start, 0.3)
        assert torch.get_num_threads() == 2  # restored after the pool
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lout, lref)


def test_layers_detected():
    prob = PROBLEMS["tanh"]()
    ls = mlp_layers(prob)
    assert [(ly.w[1:], ly.b is not None, ly.act) for ly in ls] == [
        ((6, 25), True, "tanh"),
        ((5, 6), True, "sigmoid"),
        ((4, 5), False, None),
    ]


def executor_for(algo, name: str = "auto"):
    """The executor a simulation of ``algo`` picks under ``simulation.executor: name``."""
    return Simulation(algo.problem, algo, SimulationConfig(rounds=1, executor=name, metrics=[]), seed=0).executor


def test_runs_every_update_stated_as_plain_sgd_and_refuses_the_others(monkeypatch):
    """The solvers whose update is a plain ``Descend`` statement get the batched executor under ``auto`` without
    declaring anything; a masked update (FedAvg's shared_only) or one written with the context (pFedMe)
    is refused by an explicit ``batched`` with one line, and runs on a generic executor under ``auto``."""
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    prob = PROBLEMS["mlp"]()
    for name in ("fedavg", "fedprox", "scaffold", "fedadmm", "local"):
        assert isinstance(executor_for(get_algorithm(name)({"lr": 0.1}, prob)), BatchedMLPExecutor), name
    fedavg = get_algorithm("fedavg")(
        {"lr": 0.1, "shared_only": True},
        FederatedProblem(data(), build_model_fn("mlp", (1, 5, 5), 4, hidden=(7,)), blocks={"personal": ["out.*"]}),
    )
    for algo in [fedavg, get_algorithm("pfedme")({"lr": 0.1}, prob)]:
        with pytest.raises(ValueError, match=rf"'batched' does not run {algo.name}"):
            executor_for(algo, "batched")
        assert executor_for(algo).name in ("vectorized", "sequential")


def test_calibration_written_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FEDSOLVE_CALIBRATE", raising=False)
    calls = []
    real = bm.measure

    def counting(*a, **kw):
        out = real(*a, **kw)
        calls.append(out)
        return out

    monkeypatch.setattr(bm, "measure", counting)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # one thread: no 'batched:1' candidate
    prob = PROBLEMS["mlp"]()
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    first = make_executor("auto", prob, algorithm=algo)
    path = tmp_path / "executor_calibration.json"
    assert len(calls) == 1 and path.exists()
    cache = json.loads(path.read_text())
    ((key, entry),) = cache.items()
    chunked = {"batched@2", "batched@4", "batched@5"}  # 5 clients: chunks of 2, 4 and all
    assert set(entry["seconds"]) == chunked | {"vectorized", "sequential"}
    assert first.name == min(entry["seconds"], key=entry["seconds"].get).split("@")[0]
    assert f"threads {torch.get_num_threads()}" in key and "batch 10" in key
    again = make_executor("auto", prob, algorithm=algo)
    assert len(calls) == 1 and again.name == first.name  # read from the cache, not measured again
    # a forced choice in the cache is obeyed (the cache is what decides)
    entry["seconds"] = {"batched@2": 3.0, "batched@4": 3.5, "batched@5": 4.0, "vectorized": 1.0, "sequential": 2.0}
    path.write_text(json.dumps({key: entry}))
    assert make_executor("auto", prob, algorithm=algo).name == "vectorized"
    # ... and so is its fastest chunk size: the batched executor runs chunks of that many clients
    entry["seconds"] = {"batched@2": 3.0, "batched@4": 0.5, "batched@5": 4.0, "vectorized": 1.0, "sequential": 2.0}
    path.write_text(json.dumps({key: entry}))
    ex = make_executor("auto", prob, algorithm=algo)
    assert ex.name == "batched" and bm.calibrated_chunk(prob, 10, None) == 4
    sizes = []
    chunks = ex.chunks
    monkeypatch.setattr(ex, "chunks", lambda active, size, n: sizes.append(size) or chunks(active, size, n))
    ids = torch.arange(prob.num_clients)
    plan = build_plans({"train": Work(epochs=1, batch_size=10)}, prob.data.train_offsets, ids, RngStreams(0), 0)
    ex.sgd(prob.layout.flatten(prob.model).detach().repeat(len(ids), 1), 0.1, plan["train"], prob.data)
    assert sizes == [4]
    # another batch size is another workload: measured once more
    algo2 = get_algorithm("fedavg")({**CASES["fedavg"], "batch_size": 7}, prob)
    make_executor("auto", prob, algorithm=algo2)
    assert len(calls) == 2 and len(json.loads(path.read_text())) == 2
    # several threads: also the chunks one after another ('batched:1'), a key of its own
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    ex = make_executor("auto", prob, algorithm=algo)
    ((key2, entry2),) = [(k, v) for k, v in json.loads(path.read_text()).items() if "threads 2|" in k]
    assert len(calls) == 3 and set(entry2["seconds"]) == chunked | {
        c.replace("batched", "batched:1") for c in chunked
    } | {"vectorized", "sequential"}
    best = min(entry2["seconds"], key=entry2["seconds"].get)
    assert ex.name == best.split(":")[0].split("@")[0]
    assert (getattr(ex, "workers", None) == 1) == best.startswith("batched:1")
    monkeypatch.undo()
    torch.set_num_threads(threads)  # the executor restored the patched count


def test_calibration_off_and_explicit_names(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    prob = PROBLEMS["mlp"]()
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    assert make_executor("auto", prob, algorithm=algo).name == "batched"
    pfa = get_algorithm("pfedme")({"lr": 0.1}, prob)  # written with the context
    assert make_executor("auto", prob, algorithm=pfa).name == "vectorized"
    monkeypatch.delenv("FEDSOLVE_CALIBRATE")
    for name in ("sequential", "vectorized", "batched"):
        assert make_executor(name, prob, algorithm=algo).name == name
    assert not (tmp_path / "executor_calibration.json").exists()  # explicit names never calibrate


def test_calibration_says_that_it_measures(tmp_path, monkeypatch, capfd):
    """The first run of a model on a machine times the executors (a pause of seconds): it says so on stderr, with
    the time it took; a cached calibration says nothing."""
    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FEDSOLVE_CALIBRATE", raising=False)
    prob = PROBLEMS["mlp"]()
    algo = get_algorithm("fedavg")(CASES["fedavg"], prob)
    capfd.readouterr()
    make_executor("auto", prob, algorithm=algo)
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == (
        "[fedsolve] timing the executors for this model on this machine (once; cached in "
        f"{tmp_path / 'executor_calibration.json'}) ..."
    )
    assert re.fullmatch(r"\[fedsolve\] executors timed in \d+\.\d s", lines[1]) and len(lines) == 2, lines
    make_executor("auto", prob, algorithm=algo)
    assert capfd.readouterr().err == ""
