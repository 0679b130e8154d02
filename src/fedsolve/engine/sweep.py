"""A sweep as one batch: runs of one config that differ in seed and scalar hyper-parameters, trained together.

Each run is its own :class:`~fedsolve.engine.loop.Simulation` (its seed, sampling, server state, evaluations,
checkpoints and run folder), run in a thread of its own through the engine's one loop. They share a
:class:`SweepTransport`: every round each run samples and broadcasts as it would alone, then waits at the
transport until every live run has its round's local work ready; the local updates of all runs' selected clients
then go to ONE call of the stacked kernels, clients x runs as rows (different data per seed, one step size,
proximal coefficient and weight decay per row), and each run aggregates its own uploads. So a run's metrics are
its separate run's on the same executor, up to the float round-off of how the kernels group rows.

This applies where every run states its round's update as plain local SGD that the batched executor runs (a
``Descend`` statement, ``core/statements.py``: FedAvg, FedProx, SCAFFOLD, FedADMM, Local, FPFC on MLPs and small
CNNs); a run whose round is not stated so runs on its own executor in the same round, so a mixed sweep is still
correct, only not batched. ``run_sweep`` runs the simulations and returns their results in order; ``batches(sim)``
tells whether a simulation's executor can join the batched call. ``fedsolve suite`` and ``fedsolve compare`` group
their runs into such sweeps by themselves (``fedsolve.experiments.runs``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedsolve.core.batched_mlp import BatchedMLPExecutor
from fedsolve.core.linear import stacks
from fedsolve.core.plans import Plan, build_plans
from fedsolve.core.statements import Solved, stated
from fedsolve.engine.transport import InProcess

Record = dict[str, Tensor]


class SweepInterrupted(KeyboardInterrupt):
    """Raised in every run's thread when the sweep is stopped (Ctrl-C in the main thread, or a run that failed
    while the others waited for it): each run keeps its last checkpoint and resumes with ``--resume``."""


@dataclass
class _Request:
    sim: Any
    t: int
    ids: Tensor
    msgs: Record
    plans: dict[str, Plan]
    rows: Record
    stmt: Any = None
    result: tuple | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class _Pool:
    """The runs' training data concatenated once (a run's rows at ``offsets[i]``; runs that share one data
    object share its rows); it stands for a data object in ``BatchedMLPExecutor.sgd``."""

    train_x: Tensor
    train_y: Tensor
    offsets: list[int] = field(default_factory=list)


class SweepTransport(InProcess):
    """The transport the runs of a sweep share (module docstring)."""

    name = "sweep"

    def __init__(self):
        #: the baton: a run's thread computes only while it holds this (re-entrant) lock (:meth:`start`)
        self._cond = threading.Condition(threading.RLock())
        self._holders: set[int] = set()
        self._active: set[int] = set()
        self._pending: dict[int, _Request] = {}
        self._abort: BaseException | None = None
        self._pool: _Pool | None = None
        self._kernel: BatchedMLPExecutor | None = None
        self._score_lock = threading.Lock()
        self._sims: list = []
        #: rounds whose work went to one batched call, and rows in them (for tests and benchmarks)
        self.batched_rounds = 0

    # ------------------------------------------------------------------ the runs
    def runs(self, sims: list) -> None:
        """The sweep's runs, in order (their data are pooled in this order)."""
        self._sims = list(sims)
        with self._cond:
            self._active = {id(s) for s in sims}

    def start(self, sim) -> None:
        """The run's thread takes the baton: it computes only while it holds the transport's lock, which it gives
        up only while it waits for its round's batched call (:meth:`train`) and when it leaves, so no two runs
        compute at once. Every torch operation then has the process's whole thread pool, and a sweep's numbers do
        not depend on how its threads interleave (the same sweep gives the same numbers bit for bit)."""
        self._cond.acquire()
        self._holders.add(threading.get_ident())

    def leave(self, sim) -> None:
        with self._cond:
            self._active.discard(id(sim))
            self._pending.pop(id(sim), None)
            if self._pending and len(self._pending) == len(self._active):
                self._work()
        if threading.get_ident() in self._holders:  # the run's thread gives the baton back
            self._holders.discard(threading.get_ident())
            self._cond.release()

    def stop(self, reason: BaseException) -> None:
        with self._cond:
            self._abort = reason
            self._cond.notify_all()

    # ------------------------------------------------------------------ the transport
    def train(self, sim, t, ids, msgs, scale):
        algo, data = sim.algo, sim.problem.data
        rows = sim.clients.gather(ids)
        solved = stated(algo, rows, msgs, t)
        if isinstance(solved, Solved):  # closed form from the rows: nothing to batch, no plan
            sim.clients.scatter(ids, solved.rows)
            return None, solved.upload, torch.zeros(ids.numel(), dtype=torch.float32)
        plans = build_plans(algo.work(t), data.train_offsets, ids.cpu(), sim.rngs, t, scale, data.row_groups)
        req = _Request(sim, t, ids, msgs, plans, rows)
        with self._cond:
            if self._abort is not None:
                raise SweepInterrupted(str(self._abort))
            self._pending[id(sim)] = req
            if len(self._pending) == len(self._active):
                self._work()
            while not req.done and self._abort is None:
                self._cond.wait()
            if not req.done:
                raise SweepInterrupted(str(self._abort))
        if req.error is not None:
            raise req.error
        assert req.result is not None, "a finished request holds its result or its error"
        new_rows, uploads, losses = req.result
        sim.clients.scatter(ids, new_rows)
        return None, uploads, losses

    def score(self, sim, round_):
        with self._score_lock:  # runs may share a problem object (its module's train/eval flag)
            return super().score(sim, round_)

    # ------------------------------------------------------------------ one round of every run
    def _work(self) -> None:
        """Run every pending request (the caller holds the condition): the stated plain-SGD ones in one batched
        call, the others on their own executors; then wake the runs."""
        order = {id(sim): i for i, sim in enumerate(self._sims)}
        reqs = sorted(self._pending.values(), key=lambda r: order.get(id(r.sim), len(order)))  # not arrival order
        self._pending.clear()
        batch = []
        for r in reqs:
            if isinstance(r.sim.executor, BatchedMLPExecutor):
                r.stmt = stated(r.sim.algo, r.rows, r.msgs, r.t)
                if stacks(r.stmt, r.plans):
                    batch.append(r)
                    continue
            self._alone(r)
        if len(batch) == 1:
            self._alone(batch[0])
        elif batch:
            try:
                self._together(batch)
            except BaseException as e:  # noqa: BLE001  (every waiting run gets the error)
                for r in batch:
                    r.error, r.done = e, True
        self._cond.notify_all()

    @staticmethod
    def _alone(r: _Request) -> None:
        try:
            with r.sim.on_device():
                r.result = r.sim.executor.run(r.sim.algo, r.rows, r.msgs, r.ids, r.plans, r.sim.problem.data, r.t)
        except BaseException as e:  # noqa: BLE001
            r.error = e
        r.done = True

    def _together(self, batch: list[_Request]) -> None:
        pool = self._pool_of()
        if self._kernel is None:
            self._kernel = BatchedMLPExecutor(batch[0].sim.problem)
        phase = batch[0].stmt.phase
        plan = _stack_plans([r.plans[phase] for r in batch], [pool.offsets[self._sims.index(r.sim)] for r in batch])
        stmts = [r.stmt for r in batch]
        start = torch.cat([s.start for s in stmts])
        sizes = [s.start.shape[0] for s in stmts]
        per_row = lambda f: _per_row([getattr(s, f) for s in stmts], sizes, start)
        anchor = _rows_or_none([s.anchor if s.prox != 0 else None for s in stmts], sizes, start)
        linear = _rows_or_none([s.linear for s in stmts], sizes, start)
        with batch[0].sim.on_device():
            P, losses = self._kernel.sgd(
                start, per_row("lr"), plan, pool, anchor, per_row("prox"), per_row("weight_decay"), linear
            )
        self.batched_rounds += 1
        a = 0
        for r, s, k in zip(batch, stmts, sizes):
            steps = r.plans[phase].active.sum(-1).to(s.start.dtype)
            new_rows, uploads = s.then(P[a : a + k].to(s.start.dtype), steps)
            r.result, r.done = (new_rows, uploads, losses[a : a + k].to(torch.float32)), True
            a += k

    def _pool_of(self) -> _Pool:
        """Every run's training rows in one tensor (built once: a sweep's data do not change)."""
        if self._pool is None:
            xs, ys, offsets, seen = [], [], [], {}
            n = 0
            for s in self._sims:
                d = s.problem.data
                if id(d) not in seen:
                    seen[id(d)] = n
                    xs.append(d.train_x)
                    ys.append(d.train_y)
                    n += d.train_x.shape[0]
                offsets.append(seen[id(d)])
            self._pool = _Pool(torch.cat(xs), torch.cat(ys), offsets)
        return self._pool


def _stack_plans(plans: list[Plan], offsets: list[int]) -> Plan:
    """The runs' plans of one phase as one plan: row indices shifted to each run's rows in the pool, padded to the
    longest steps and widest batch (weight 0, inactive)."""
    S = max(p.idx.shape[1] for p in plans)
    B = max(p.idx.shape[2] for p in plans)
    idx, w, act = [], [], []
    for p, off in zip(plans, offsets):
        K, s, b = p.idx.shape
        i = torch.full((K, S, B), off, dtype=p.idx.dtype)
        i[:, :s, :b] = p.idx + off
        ww = torch.zeros((K, S, B), dtype=p.w.dtype)
        ww[:, :s, :b] = p.w
        a = torch.zeros((K, S), dtype=p.active.dtype)
        a[:, :s] = p.active
        idx.append(i)
        w.append(ww)
        act.append(a)
    return Plan(torch.cat(idx), torch.cat(w), torch.cat(act), fixed=all(p.fixed for p in plans))


def _per_row(values: list, sizes: list[int], like: Tensor):
    """One number when the runs agree, else one value per row ``[K]``."""
    nums = [float(v) for v in values]
    if all(v == nums[0] for v in nums):
        return nums[0]
    return torch.cat([torch.full((k,), v, dtype=like.dtype, device=like.device) for v, k in zip(nums, sizes)])


def _rows_or_none(values: list[Tensor | None], sizes: list[int], like: Tensor) -> Tensor | None:
    if all(v is None for v in values):
        return None
    return torch.cat([v if v is not None else like.new_zeros(k, like.shape[1]) for v, k in zip(values, sizes)])


def batches(sim) -> bool:
    """Whether ``sim``'s rounds can join a sweep's batched kernel call: its executor is the batched one (stacked
    MLPs and small CNNs, ``simulation.executor: batched`` or what ``auto`` chose)."""
    return isinstance(sim.executor, BatchedMLPExecutor)


def run_sweep(sims: list, resume: bool = False) -> list:
    """Run ``sims`` (Simulations built with one shared :class:`SweepTransport`) together, each in a thread of its
    own; returns their results (a run's exception in its place). Ctrl-C stops every run at its next round with
    its last checkpoint kept."""
    transports = {id(s.transport) for s in sims}
    if len(transports) != 1 or not isinstance(sims[0].transport, SweepTransport):
        raise ValueError(
            "run_sweep: every simulation must share one SweepTransport (Simulation(..., transport=shared))"
        )
    tr: SweepTransport = sims[0].transport
    tr.runs(sims)
    results: list[Any] = [None] * len(sims)

    def one(i: int) -> None:
        try:
            results[i] = sims[i].run(resume=resume)
        except BaseException as e:  # noqa: BLE001  (kept in the run's place)
            results[i] = e
        finally:
            tr.leave(sims[i])

    threads = [threading.Thread(target=one, args=(i,), name=f"sweep-run-{i}", daemon=True) for i in range(len(sims))]
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    except KeyboardInterrupt as e:
        tr.stop(e)
        for th in threads:
            th.join()
        raise
    return results
