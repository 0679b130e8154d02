"""Executors: how the selected clients' ``local_update`` runs — one by one or all at once.

The algorithm writes ``local_update`` for ONE client (:class:`~fedsolve.core.context.LocalContext`).
Before it runs, the engine draws each client's minibatch *plan* (``core/plans.py``: global row indices
into the pooled training tensors, sample weights, and which steps are active) from the client's own RNG
stream, so every executor sees exactly the same minibatches:

* ``sequential`` calls ``local_update`` client by client (any model, batch-norm included);
* ``vectorized`` runs it for all selected clients at once with ``torch.func.vmap`` over the
  stacked state rows, messages and plans (``functional_call`` on the shared module); a round stated as a
  :class:`~fedsolve.core.statements.Solved` (closed form, batch-agnostic) is the statement computed once on the
  stacked rows, and a :class:`~fedsolve.core.statements.Minimize` (Newton to each client's tolerance) runs once on
  the stacked clients and their full batches (:func:`minimize_stacked`);
* ``batched`` (``core/batched_mlp.py``) runs stacked MLPs with hand-written ``bmm`` passes;
* ``auto`` picks the fastest by a calibration cached per machine and model (``core/batched_mlp.py``).

Variable amounts of local work are inactive (masked) steps, so every client in a vmapped
batch runs the same program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.func import grad, vmap

from fedsolve.core.allocator import keep_freed_memory
from fedsolve.core.context import LocalContext, full_batches
from fedsolve.core.newton import newton
from fedsolve.core.plans import Plan, Work, build_plans
from fedsolve.core.statements import Minimize, Solved, is_statement, stated

__all__ = [
    "Executor",
    "SequentialExecutor",
    "VectorizedExecutor",
    "LocalContext",
    "Plan",
    "Work",
    "build_plans",
    "on_data_device",
    "carry_out",
]

Record = dict[str, Tensor]


# ------------------------------------------------------------------ executors
class Executor:
    name = "base"

    def run(
        self, algo, rows: Record, msgs: Record, ids: Tensor, plans: Mapping[str, Plan], data, round_: int = 0
    ) -> tuple[Record, Record, Tensor]:
        raise NotImplementedError


def _ctx_inputs(data, ids: Tensor):
    ids, dev = ids.cpu(), data.train_x.device  # sizes and weights stay on the CPU (they plan and sample)
    n = data.train_sizes[ids].to(dev, torch.float32)
    w = data.weights[ids].to(dev, torch.float32)
    return n, w


def on_data_device(run):
    """Decorator of ``Executor.run``: on a GPU (training data not on the CPU), the round's plans and client ids
    are moved to the data's device once and the run creates its new tensors there (``torch.device``
    context); on the CPU it changes nothing."""

    @functools.wraps(run)
    def wrapped(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        dev = data.train_x.device
        if dev.type == "cpu":
            return run(self, algo, rows, msgs, ids, plans, data, round_)
        with torch.device(dev):
            return run(self, algo, rows, msgs, ids.to(dev), {p: pl.to(dev) for p, pl in plans.items()}, data, round_)

    return wrapped


class SequentialExecutor(Executor):
    """Runs ``local_update`` client by client."""

    name = "sequential"

    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        n, wt = _ctx_inputs(data, ids)
        outs_s, outs_u, losses = [], [], []
        for k in range(ids.numel()):
            ctx = LocalContext(
                algo.problem,
                {p: pl.row(k) for p, pl in plans.items()},
                n[k],
                wt[k],
                ids[k],
                data.train_x,
                data.train_y,
                round_,
            )
            ctx.eager = True
            s, u = carry_out(
                algo.local_update({a: b[k] for a, b in rows.items()}, {a: b[k] for a, b in msgs.items()}, ctx), ctx
            )
            outs_s.append(s)
            outs_u.append(u)
            losses.append(ctx.train_loss)
        stack = lambda lst: {key: torch.stack([d[key] for d in lst]) for key in (lst[0] if lst else {})}
        return stack(outs_s), stack(outs_u), torch.stack(losses)


class VectorizedExecutor(Executor):
    """Runs ``local_update`` for all selected clients at once (``torch.func.vmap``).

    Clients are grouped into *buckets* of similar work (steps x batch size) so that a client
    with 250 samples is not padded to one with 25,000: each bucket's plans are trimmed to its
    own longest step count and batch, and each bucket is one vmapped call (at most
    ``chunk_size`` clients). Padded samples carry zero weight and trailing steps are inactive,
    so trimming changes no number.

    ``tune_malloc``: call :func:`~fedsolve.core.allocator.keep_freed_memory` when the first round runs
    (process-wide). A round's stacked minibatches and per-client uploads are megabytes each; without it glibc
    maps and zero-fills them page by page every round (SimFBO's MNIST round: about 1,200 page faults and 27%
    of its time on 2 cores, ``docs/performance.md``).
    """

    name = "vectorized"

    def __init__(self, chunk_size: int | None = None, bucket_ratio: float = 2.0, tune_malloc: bool = True):
        self.chunk_size = chunk_size
        self.bucket_ratio = bucket_ratio
        self.tune_malloc = tune_malloc

    def buckets(self, plans: Mapping[str, Plan], K: int) -> list[Tensor]:
        """Client positions grouped by work, largest first (each bucket within ``bucket_ratio``)."""
        cost = torch.zeros(K, dtype=torch.float64)
        for pl in plans.values():
            bsz = (pl.w > 0).sum(-1).amax(-1).clamp_min(1)
            cost += pl.active.sum(-1).clamp_min(1) * bsz
        order = torch.argsort(cost, descending=True, stable=True)
        groups: list[Tensor] = []
        cur: list[int] = []
        first = None
        cap = self.chunk_size or K
        costs = cost.tolist()  # one transfer (not one per client on a GPU)
        for pos in order.tolist():
            c = costs[pos]
            if cur and (len(cur) >= cap or c * self.bucket_ratio < first):
                groups.append(torch.tensor(cur))
                cur = []
            if not cur:
                first = c
            cur.append(pos)
        if cur:
            groups.append(torch.tensor(cur))
        return groups

    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        if not algo.problem.vmappable:
            raise ValueError(
                "executor: 'vectorized' needs a model whose only buffers are BatchNorm running "
                "statistics (which the engine keeps per client or averaged); use executor: sequential "
                "or auto"
            )
        if self.tune_malloc:  # the process-wide allocator setting, when the first round runs
            keep_freed_memory()
        probe = stated(algo, rows, msgs, round_)  # the update stated for the stacked rows, or None
        if isinstance(probe, Solved):  # closed form, batch-agnostic: the probe computed every client's update
            return probe.rows, probe.upload, torch.zeros(ids.numel(), dtype=torch.float32)
        if isinstance(probe, Minimize):  # Newton on the stacked clients, each until its own tolerance is met
            s, u = minimize_stacked(probe, plans, data)
            return s, u, torch.zeros(ids.numel(), dtype=torch.float32)
        n, wt = _ctx_inputs(data, ids)
        tx, ty = data.train_x, data.train_y
        phases = list(plans)

        def one(row, msg, idxs, ws, acts, n_, w_, cid):
            pl = {p: Plan(i, w, a, fixed=plans[p].fixed) for p, i, w, a in zip(phases, idxs, ws, acts)}
            ctx = LocalContext(algo.problem, pl, n_, w_, cid, tx, ty, round_)
            s, u = carry_out(algo.local_update(row, msg, ctx), ctx)
            return s, u, ctx.train_loss

        # a message that is one server tensor sent to every client goes in once, unbatched: its products with the
        # clients' batched data are then single matrix products over all of them
        shared = {k: _one_row_repeated(v) for k, v in msgs.items()}
        f = vmap(
            one, in_dims=(0, {k: None if s else 0 for k, s in shared.items()}, 0, 0, 0, 0, 0, 0), randomness="error"
        )
        K = ids.numel()
        groups = self.buckets(plans, K)
        whole = len(groups) == 1 and torch.equal(groups[0], torch.arange(K))
        outs = []
        for g in groups:
            # one bucket of every client: no row copies
            take: Callable[..., Tensor] = (lambda v: v) if whole else (lambda v, g=g: v[g])
            idxs, ws, acts = [], [], []
            for p in phases:
                pl = plans[p]
                a = pl.active[g]
                S = max(int(a.sum(-1).max()), 1)
                B = max(int((pl.w[g] > 0).sum(-1).max()), 1)
                idxs.append(take(pl.idx)[:, :S, :B])
                ws.append(take(pl.w)[:, :S, :B])
                acts.append(a[:, :S])
            outs.append(
                f(
                    {k: take(v) for k, v in rows.items()},
                    {k: v[0] if shared[k] else take(v) for k, v in msgs.items()},
                    idxs,
                    ws,
                    acts,
                    take(n),
                    take(wt),
                    take(ids),
                )
            )
        if whole:  # an output computed from shared messages alone comes back expanded: give every client its own row
            own = lambda r: {k: v.contiguous() if _one_row_repeated(v) else v for k, v in r.items()}
            return own(outs[0][0]), own(outs[0][1]), outs[0][2]
        inv = torch.empty(K, dtype=torch.long)
        inv[torch.cat(groups)] = torch.arange(K)
        cat = lambda i: {k: torch.cat([o[i][k] for o in outs])[inv] for k in outs[0][i]}
        return cat(0), cat(1), torch.cat([o[2] for o in outs])[inv]


def _one_row_repeated(v: Tensor) -> bool:
    """``v`` is one row seen by every client (an ``expand``: stride 0 over the clients' dimension)."""
    return v.dim() > 0 and v.shape[0] > 1 and v.stride(0) == 0


def minimize_stacked(s: Minimize, plans: Mapping[str, Plan], data) -> tuple[Record, Record]:
    """A :class:`~fedsolve.core.statements.Minimize` stated for the stacked clients (rows ``[K, ...]``): Newton on
    their stacked full batches, its function vmapped and its loops in Python until every client has met its own
    tolerance (``core/newton.py``: the numbers of solving them one by one), then ``s.then`` once on the stacked
    solutions."""
    plan = plans[s.phase]
    if not plan.fixed:
        raise ValueError(f"Minimize: phase {s.phase!r} must be planned as one full batch (Work(batch_size=None))")
    x, y, w = full_batches(plan, data.train_x, data.train_y)
    u, res, _ = newton(s.fun, s.start, s.tol, s.max_iter, args=(x, y, w, *s.args), stacked=True, modified=s.modified)
    return s.then(u, res, lambda fn, v, *fargs: vmap(grad(fn))(v, x, y, w, *fargs))


def carry_out(out, ctx: LocalContext):
    """``(new rows, upload)`` from what ``local_update`` returned: a statement is carried out in ``ctx``."""
    return ctx.run(out) if is_statement(out) else out
