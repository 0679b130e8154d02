"""What the family benchmarks (``families.py``) share: the round schedule every contender follows, the timed run
of a fedsolve ``Simulation``, and the agreement check.

A family module (``family_<name>.py``) builds a :class:`Family`: its workload, a fedsolve contender that runs the
algorithm through the engine, and references written in plain torch that take the same data, the same initial
state and the same :class:`Schedule` (clients of every round and their minibatches, read from fedsolve's random
streams, as ``mlp_fedavg.py`` does) and must end in the same state. Every contender returns a :class:`Result`:
the seconds of each round and the state to compare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from fedsolve.core.executor import build_plans
from fedsolve.engine import Simulation
from fedsolve.engine.sampling import sample_clients


@dataclass
class Result:
    """One contender's run: seconds of every round (round 0 is the warm-up) and its final state."""

    round_s: list[float]
    state: dict[str, Tensor]
    config: str = ""


@dataclass
class Family:
    """One family's workload and its contenders (name -> function running it once from scratch).

    ``unit``: ``round`` (median seconds of the rounds after the first) or ``run`` (seconds of all rounds: a
    run to a stopping test). ``tol``: the largest accepted ``max |a - b| / max(1, max |a|)`` over the state
    tensors, fedsolve's state ``a`` against a reference's ``b``."""

    name: str
    workload: str
    contenders: dict[str, Callable[[], Result]]
    tol: float
    unit: str = "round"
    notes: list[str] = field(default_factory=list)


@dataclass
class Round:
    """Round ``t``'s participants (sorted client ids) and, per work phase, each participant's minibatches
    (global row indices of the pooled training tensors, one tensor per local step, padding removed)."""

    ids: list[int]
    batches: dict[str, list[list[Tensor]]]


Schedule = list[Round]


def clock() -> float:
    """``time.perf_counter()`` once the GPU's queued work has finished (a GPU runs asynchronously: without the
    synchronization a round's time would be the time to queue it); on a CPU just ``perf_counter()``."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def on(device: str, fn: Callable[[], Result]) -> Callable[[], Result]:
    """``fn`` run with the tensors it creates placed on ``device`` (the reference loops are written without device
    arguments: ``torch.zeros(m, d)``, ``nn.Linear(...)``; their data come already placed)."""

    def run() -> Result:
        with torch.device(device):
            return fn()

    return run


def perturbed(value: float, perturb) -> dict[str, float]:
    """``value`` for each reference loop (``plain``, ``fastest``), 1% larger for those named in ``perturb``: the
    ``--perturb`` check that a reference which computes something else is refused its ratio."""
    return {who: value * (1.01 if who in perturb else 1.0) for who in ("plain", "fastest")}


def schedule(sim: Simulation, rounds: int) -> Schedule:
    """The clients and minibatches of rounds ``0..rounds-1`` of ``sim`` (drawn from its random streams exactly as
    ``Simulation.run_round`` draws them; the streams are keyed, so nothing of ``sim`` changes)."""
    data, m = sim.problem.data, sim.problem.num_clients
    dev = data.train_x.device  # the minibatches where the data are (a GPU's index_select wants its indices there)
    out = []
    for t in range(rounds):
        ids = sample_clients(sim.cfg.sampling, m, data.weights, sim.rngs.numpy("sampling", t))
        plans = build_plans(sim.algo.work(t), data.train_offsets, ids, sim.rngs, t, None, data.row_groups)
        batches = {}
        for phase, plan in plans.items():
            per = []
            for k in range(ids.numel()):
                row = plan.row(k)
                steps = int(row.active.sum())
                per.append([row.idx[s][:max(row.length(s), 1)].clone().to(dev) for s in range(steps)])
            batches[phase] = per
        out.append(Round(ids.tolist(), batches))
    return out


def run_simulation(make: Callable[[], Simulation], rounds: int, executor: str,
                   state: Callable[[Simulation], dict[str, Tensor]],
                   trace: Callable[[Simulation], Tensor] | None = None) -> Result:
    """``rounds`` rounds of a fresh simulation (``make()``, built before the clock starts) with ``executor``; each
    round timed by itself (it draws its clients and minibatches and aggregates inside the round). ``trace(sim)``,
    read after every round outside the clock, is stacked into the state as ``trace`` (a whole trajectory to
    compare, where the final state alone would not tell runs apart, e.g. a run that converges to one optimum)."""
    sim = make()
    sim.use_executor(executor)
    times, path = [], []
    with torch.enable_grad():
        for t in range(rounds):
            t0 = clock()
            sim.run_round(t)
            times.append(clock() - t0)
            if trace is not None:
                path.append(trace(sim).detach().clone())
    chosen = getattr(sim.executor, "name", executor)
    out = {k: v.detach().clone() for k, v in state(sim).items()}
    if trace is not None:
        out["trace"] = torch.stack(path)
    return Result(times, out, f"executor {executor} ({chosen}), {torch.get_num_threads()} thread(s)")


def fedsolve_contenders(make: Callable[[], Simulation], rounds: int,
                        state: Callable[[Simulation], dict[str, Tensor]],
                        trace: Callable[[Simulation], Tensor] | None = None,
                        executors: tuple[str, ...] = ("auto", "vectorized")) -> dict[str, Callable[[], Result]]:
    """fedsolve with each of ``executors`` (the first is the headline figure), leaving out an executor that is the
    one ``auto`` picks (it would time the same thing twice)."""
    probe = make()
    probe.use_executor("auto")
    picked = probe.executor.name
    out = {}
    for j, e in enumerate(executors):
        if j and (e == picked and "auto" in executors or f"fedsolve[{e}]" in out):
            continue
        out[f"fedsolve[{e}]"] = lambda e=e: run_simulation(make, rounds, e, state, trace)
    return out


def load_flat(params, vec: Tensor) -> None:
    """Copy the flat vector ``vec`` into the tensors ``params`` in order (a copy: ``vector_to_parameters`` alone
    would leave them views of ``vec``)."""
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(vec.clone(), params)


def flat(tensors) -> Tensor:
    """The tensors' values as one flat vector (detached)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def rel_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """``max |a - b| / max(1, max |a|)`` over the tensors of ``a`` (inf when ``b`` lacks one or a shape
    differs, or when anything is not finite)."""
    worst = 0.0
    for k, x in a.items():
        y = b.get(k)
        if y is None or tuple(y.shape) != tuple(x.shape):
            return float("inf")
        x, y = x.double().cpu(), y.double().cpu()
        if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
            return float("inf")
        scale = max(1.0, float(x.abs().max())) if x.numel() else 1.0
        worst = max(worst, float((x - y).abs().max()) / scale if x.numel() else 0.0)
    return worst


def machine_profile() -> dict:
    """What makes the ratios differ from machine to machine, measured at one thread: the CPU's model name, the
    cost of one small torch op (``a + b`` on 100 floats: the dispatch cost that dominates a millisecond round) and
    the rate of a 512 x 512 float32 matrix product. The plain loops pay more per op than fedsolve does, the
    fastest loops less; the families whose rounds are small (the constrained QP, FedMM) move most with the
    per-op cost, so a ratio is read beside these figures."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(100), torch.randn(100)
        m1, m2 = torch.randn(512, 512), torch.randn(512, 512)
        op, mm = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(2000):
                a + b
            op.append((time.perf_counter() - t0) / 2000)
            t0 = time.perf_counter()
            for _ in range(10):
                m1 @ m2
            mm.append((time.perf_counter() - t0) / 10)
    finally:
        torch.set_num_threads(threads)
    return {"cpu_model": model, "small_op_us": round(min(op) * 1e6, 2),
            "matmul512_gflops": round(2 * 512 ** 3 / min(mm) / 1e9, 1)}
