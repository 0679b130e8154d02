"""Executors: how the selected clients' ``local_update`` runs — one by one or all at once.

The algorithm writes ``local_update`` for ONE client. Before it runs, the executor draws
each client's minibatch *plan* (global row indices into the pooled training tensors, sample
weights, and which steps are active) from the client's own RNG stream, so both executors see
exactly the same minibatches:

* ``sequential`` calls ``local_update`` client by client (any model, batch-norm included);
* ``vectorized`` runs it for all selected clients at once with ``torch.func.vmap`` over the
  stacked state rows, messages and plans (``functional_call`` on the shared module);
* ``batched`` (``core/batched_mlp.py``) runs stacked MLPs with hand-written ``bmm`` passes;
* ``auto`` picks the fastest by a calibration cached per machine and model (``core/batched_mlp.py``).

Variable amounts of local work are inactive (masked) steps, so every client in a vmapped
batch runs the same program.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from fedsolve.core.rng import RngStreams

Record = dict[str, Tensor]


@dataclass(frozen=True)
class Work:
    """How much local work one phase of ``local_update`` does.

    ``steps`` (a fixed number of minibatch steps) takes precedence over ``epochs`` (passes over
    the client's data). ``batch_size=None`` means full-batch gradient steps.
    """

    epochs: float | None = 1.0
    steps: int | None = None
    batch_size: int | None = None
    #: draw this phase's minibatches from the client's rows of one named row group only
    #: (``FederatedData.train_groups``: e.g. a bilevel upper/lower split, labelled source vs target rows);
    #: epochs count passes over that group. None: all of the client's rows.
    group: str | None = None

    def __post_init__(self) -> None:
        if self.steps is None and (self.epochs is None or self.epochs <= 0):
            raise ValueError("Work: give steps >= 1 or epochs > 0")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"Work.steps must be >= 1, got {self.steps}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"Work.batch_size must be >= 1 or None (full batch), got {self.batch_size}")


class Plan:
    """Stacked minibatch plan for K clients: ``idx``/``w`` ``[K, S, B]``, ``active`` ``[K, S]``.

    ``idx`` and ``w`` may be built lazily (``build`` returns both): an executor that needs only the
    step counts (FPFC's batched full-batch executor) never pays for the ``[K, S, n_max]`` index.
    ``fixed``: every step uses the same batch (full-batch gradient descent), so a context may
    gather it once per round instead of once per step.
    """

    __slots__ = ("_idx", "_w", "active", "_build", "fixed", "_lengths")

    def __init__(self, idx: Tensor | None, w: Tensor | None, active: Tensor,
                 build: Callable[[], tuple[Tensor, Tensor]] | None = None, fixed: bool = False):
        if (idx is None or w is None) and build is None:
            raise ValueError("Plan: give idx and w, or a build function")
        self._idx, self._w, self.active, self._build = idx, w, active, build
        self.fixed = bool(fixed)
        self._lengths: list[int] | None = None

    def _materialize(self) -> None:
        if self._idx is None:
            self._idx, self._w = self._build()
            self._build = None

    @property
    def idx(self) -> Tensor:
        self._materialize()
        return self._idx

    @property
    def w(self) -> Tensor:
        self._materialize()
        return self._w

    def row(self, k: int) -> "Plan":
        return Plan(self.idx[k], self.w[k], self.active[k], fixed=self.fixed)

    def to(self, device: torch.device | str) -> "Plan":
        """The same plan on ``device`` (a plan is drawn on the CPU; an executor moves it to the data once per
        round). A lazy plan stays lazy: its index is built on the CPU and moved when first needed."""
        if self._idx is not None:
            return Plan(self._idx.to(device), self._w.to(device), self.active.to(device), fixed=self.fixed)
        build = self._build
        return Plan(None, None, self.active.to(device), fixed=self.fixed,
                    build=lambda: tuple(t.to(device) for t in build()))

    def length(self, step: int) -> int:
        """One client's plan (``w`` ``[S, B]``): how many leading samples of minibatch ``step`` can carry
        weight. Batches are padded at the end with weight-0 rows (a short last batch of an epoch, or a
        client with less data than the largest of the round); the rows past this length are all padding."""
        if self._lengths is None:
            nz = self.w > 0
            B = nz.shape[-1]
            self._lengths = torch.where(nz.any(-1), B - nz.flip(-1).to(torch.uint8).argmax(-1), 0).tolist()
        return self._lengths[step]


def _stack_plan(per_client: list) -> tuple[Tensor, Tensor]:
    """``(idx, w)`` ``[K, S, B]`` from per-client ``(start, batch size, list of batches)``."""
    S = max(len(b) for _, _, b in per_client)
    B = max(bs for _, bs, _ in per_client)
    K = len(per_client)
    idx = np.zeros((K, S, B), dtype=np.int64)
    w = np.zeros((K, S, B), dtype=np.float32)
    for k, (a, bs, batches) in enumerate(per_client):
        for s, b in enumerate(batches):
            idx[k, s, :len(b)] = a + b
            idx[k, s, len(b):] = a
            w[k, s, :len(b)] = 1.0 / len(b)
    return torch.from_numpy(idx), torch.from_numpy(w)


def _group_rows(groups: tuple[Tensor, Sequence[str]] | None, phase: str, name: str, a: int, n: int,
                cid: int) -> np.ndarray:
    """The client-relative rows of row group ``name`` among the client's rows ``a:a+n``."""
    if groups is None:
        raise ValueError(f"work phase {phase!r} draws from row group {name!r}, but the data has no train_groups")
    gids, names = groups
    if name not in names:
        raise ValueError(f"work phase {phase!r}: unknown row group {name!r}; allowed: {list(names)}")
    rows = torch.nonzero(gids[a:a + n] == names.index(name)).flatten().numpy()
    if rows.size == 0:
        raise ValueError(f"client {cid} has no training samples in row group {name!r} (phase {phase!r})")
    return rows


def build_plans(work: Mapping[str, Work], offsets: Tensor, ids: Tensor, rngs: RngStreams, round_: int,
                scale: Tensor | None = None, groups: tuple[Tensor, Sequence[str]] | None = None
                ) -> dict[str, Plan]:
    """Draw every selected client's minibatch plan for every phase (deterministic per client).

    ``groups``: ``(train_groups, group_names)`` of the data, aligned with ``offsets``, for phases whose
    ``Work.group`` names a row group."""
    ids = ids.cpu()
    sizes = (offsets[1:] - offsets[:-1])[ids].tolist()
    starts = offsets[:-1][ids].tolist()
    cids = ids.tolist()
    plans: dict[str, Plan] = {}
    for phase, wk in work.items():
        per_client, fixed = [], True
        for k, (cid, n_all, a) in enumerate(zip(cids, sizes, starts)):
            if n_all <= 0:
                raise ValueError(f"client {cid} has no training samples")
            rows = None if wk.group is None else _group_rows(groups, phase, wk.group, a, n_all, cid)
            n = n_all if rows is None else int(rows.size)
            bs = n if wk.batch_size is None else min(wk.batch_size, n)
            per_epoch = math.ceil(n / bs)
            steps = wk.steps if wk.steps is not None else max(1, math.ceil(wk.epochs * per_epoch))
            if scale is not None:
                steps = max(1, int(round(steps * float(scale[k]))))
            if bs == n:  # full batch: no randomness, the same (shared) index array every step
                batches = [np.arange(n) if rows is None else rows] * steps
            else:
                g = rngs.numpy("batches", round_, cid, phase)
                batches = []
                while len(batches) < steps:  # epoch-aligned: each pass is split into ceil(n/bs) batches
                    order = g.permutation(n)
                    batches.extend(order[b0:b0 + bs] for b0 in range(0, n, bs))
                batches = batches[:steps]
                if rows is not None:
                    batches = [rows[b] for b in batches]
            fixed = fixed and bs == n
            per_client.append((a, bs, batches))
        S = max(len(b) for _, _, b in per_client)
        act = torch.zeros((len(per_client), S), dtype=torch.bool)
        for k, (_, _, batches) in enumerate(per_client):
            act[k, :len(batches)] = True
        plans[phase] = Plan(None, None, act, build=lambda pc=per_client: _stack_plan(pc), fixed=fixed)
    return plans


class LocalContext:
    """What ``local_update`` may use: gradients on its planned minibatches and local SGD loops.

    Inside the vectorized executor every tensor here is one client's slice of a batched tensor,
    so ``local_update`` code is written for one client and never sees the client dimension.
    """

    def __init__(self, problem, plans: Mapping[str, Plan], n: Tensor, weight: Tensor, client: Tensor,
                 train_x: Tensor, train_y: Tensor, round_: int = 0):
        self._problem = problem
        self._model = problem.model
        self._layout = problem.layout
        self._loss = problem.loss_fn
        self.plans = plans
        self.n = n
        self.weight = weight
        self.client = client
        #: the communication round (a Python int, the same for every client of a vectorized call)
        self.round = int(round_)
        self._x = train_x
        self._y = train_y
        self._loss_sum = torch.zeros((), dtype=torch.float32)
        self._loss_cnt = torch.zeros((), dtype=torch.float32)
        self._fixed_batches: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        #: True in the sequential executor: plain autograd on one client (no torch.func overhead)
        self.eager = False

    # -------------------------------------------------------------- gradients
    def loss_on(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted mean loss of the model with flat ``params`` on ``(x, y)``."""
        out = functional_call(self._model, self._layout.unflatten(params), (x,))
        return (self._loss(out, y) * w).sum()

    def loss_grad(self, params: Tensor, phase: str = "train", step: int = 0,
                  loss: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """``(loss, grad)`` on minibatch ``step`` of ``phase`` (weighted mean over its samples).

        ``loss(params, x, y, w)`` replaces the model loss (e.g. a bilevel or adversarial objective).
        """
        x, y, w = self._batch(phase, step)
        if loss is None:
            return self._model_loss_grad(params, x, y, w)
        if self.eager:   # one client: plain autograd (torch.func's transform costs about 2x on small models)
            q = params.detach().requires_grad_(True)
            with torch.enable_grad():
                v = loss(q, x, y, w)
                g, = torch.autograd.grad(v, q)
            return v.detach(), g
        g, v = grad_and_value(lambda q: loss(q, x, y, w))(params)
        return v, g

    def loss(self, params: Tensor, phase: str = "train", step: int = 0) -> Tensor:
        """The model's weighted mean loss on minibatch ``step`` of ``phase``, without a gradient (a forward
        pass only: e.g. IFCA scoring each cluster model)."""
        x, y, w = self._batch(phase, step)
        with torch.no_grad():
            return self.loss_on(params, x, y, w)

    def batch(self, phase: str, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, w)`` of minibatch ``step`` of ``phase`` (for losses that need more than a gradient,
        e.g. a bilevel method's Hessian-vector products)."""
        return self._batch(phase, step)

    def _batch(self, phase: str, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, w)`` of minibatch ``step`` of ``phase``."""
        p = self.plans[phase]
        if p.fixed:  # full batch: gather once; every step (inactive ones too) sees the whole data
            if phase not in self._fixed_batches:
                ix, w = self._trimmed(p, 0)
                self._fixed_batches[phase] = (self._x[ix], self._y[ix], w)
            return self._fixed_batches[phase]
        ix, w = self._trimmed(p, step)
        return self._x[ix], self._y[ix], w

    def _trimmed(self, p: Plan, step: int) -> tuple[Tensor, Tensor]:
        """Rows and weights of minibatch ``step``; run one client at a time (``eager``), without the weight-0
        padding that only makes the clients of a vectorized call the same shape."""
        ix, w = p.idx[step], p.w[step]
        if self.eager:
            c = max(p.length(step), 1)
            ix, w = ix[:c], w[:c]
        return ix, w

    def _model_loss_grad(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """Gradient w.r.t. the per-parameter tensors, concatenated (no slice-backward over ``[d]``)."""
        lay, model, lossf = self._layout, self._model, self._loss

        def f(pd):
            return (lossf(functional_call(model, pd, (x,)), y) * w).sum()

        if self.eager:
            leaves = {k: t.detach().requires_grad_(True) for k, t in lay.unflatten(params).items()}
            with torch.enable_grad():
                v = f(leaves)
                gs = torch.autograd.grad(v, list(leaves.values()))
            return v.detach(), torch.cat([g.reshape(-1) for g in gs])
        gd, v = grad_and_value(f)(lay.unflatten(params))
        return v, torch.cat([gd[e.name].reshape(-1) for e in lay.entries])

    def num_steps(self, phase: str = "train") -> Tensor:
        """Number of active local steps of this client in ``phase`` (a tensor)."""
        return self.plans[phase].active.sum().to(torch.float32)

    def max_steps(self, phase: str = "train") -> int:
        return int(self.plans[phase].active.shape[-1])

    def is_active(self, phase: str, step: int) -> Tensor:
        return self.plans[phase].active[step]

    def record_loss(self, loss: Tensor, active: Tensor) -> None:
        a = active.to(torch.float32)
        self._loss_sum = self._loss_sum + loss.detach() * a
        self._loss_cnt = self._loss_cnt + a

    @property
    def train_loss(self) -> Tensor:
        return self._loss_sum / self._loss_cnt.clamp_min(1.0)

    # -------------------------------------------------------------- loops
    def sgd(self, params: Tensor, lr: float | Tensor, phase: str = "train",
            extra: Callable[[Tensor], Tensor] | None = None, mask: Tensor | None = None,
            scale: float | Tensor = 1.0, until: Callable[[Tensor, Tensor], Tensor] | None = None,
            loss: Callable | None = None) -> Tensor:
        """Plain (minibatch) gradient descent over the planned steps of ``phase``.

        Each step: ``g = scale * grad f(params) + extra(params)``; ``g *= mask``;
        ``params -= lr * g``. Inactive steps (variable local work) leave ``params`` unchanged.
        ``until(params, g) -> bool`` stops this client for good once true (inexactness rules).
        """
        steps = self.max_steps(phase)
        done = torch.zeros((), dtype=torch.bool)
        for s in range(steps):
            fval, g = self.loss_grad(params, phase, s, loss)
            if not (isinstance(scale, (int, float)) and scale == 1.0):
                g = g * scale
            if extra is not None:
                g = g + extra(params)
            if mask is not None:
                g = g * mask
            live = self.plans[phase].active[s]
            if until is not None:
                done = done | until(params, g)
                live = live & ~done
            self.record_loss(fval, live)
            # one fused pass over the [d] vector: params - lr * g on active steps, unchanged otherwise
            params = torch.addcmul(params, g, live.to(params.dtype) * (-lr))
        return params


# ------------------------------------------------------------------ executors
class Executor:
    name = "base"

    def run(self, algo, rows: Record, msgs: Record, ids: Tensor, plans: Mapping[str, Plan], data,
            round_: int = 0) -> tuple[Record, Record, Tensor]:
        raise NotImplementedError


def _ctx_inputs(data, ids: Tensor):
    ids, dev = ids.cpu(), data.train_x.device   # sizes and weights stay on the CPU (they plan and sample)
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
            return run(self, algo, rows, msgs, ids.to(dev), {p: pl.to(dev) for p, pl in plans.items()}, data,
                       round_)

    return wrapped


class SequentialExecutor(Executor):
    """Runs ``local_update`` client by client."""

    name = "sequential"

    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        n, wt = _ctx_inputs(data, ids)
        outs_s, outs_u, losses = [], [], []
        for k in range(ids.numel()):
            ctx = LocalContext(algo.problem, {p: pl.row(k) for p, pl in plans.items()}, n[k], wt[k], ids[k],
                               data.train_x, data.train_y, round_)
            ctx.eager = True
            s, u = algo.local_update({a: b[k] for a, b in rows.items()}, {a: b[k] for a, b in msgs.items()}, ctx)
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
    """

    name = "vectorized"

    def __init__(self, chunk_size: int | None = None, bucket_ratio: float = 2.0):
        self.chunk_size = chunk_size
        self.bucket_ratio = bucket_ratio

    def buckets(self, plans: Mapping[str, Plan], K: int) -> list[Tensor]:
        """Client positions grouped by work, largest first (each bucket within ``bucket_ratio``)."""
        cost = torch.zeros(K, dtype=torch.float64)
        for pl in plans.values():
            bsz = (pl.w > 0).sum(-1).amax(-1).clamp_min(1)
            cost += pl.active.sum(-1).clamp_min(1) * bsz
        order = torch.argsort(cost, descending=True, stable=True)
        groups, cur, first = [], [], None
        cap = self.chunk_size or K
        costs = cost.tolist()   # one transfer (not one per client on a GPU)
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
            raise ValueError("executor: 'vectorized' needs a model without buffers (e.g. no batch-norm running "
                             "stats); use executor: sequential or auto")
        n, wt = _ctx_inputs(data, ids)
        tx, ty = data.train_x, data.train_y
        phases = list(plans)

        def one(row, msg, idxs, ws, acts, n_, w_, cid):
            pl = {p: Plan(i, w, a, fixed=plans[p].fixed) for p, i, w, a in zip(phases, idxs, ws, acts)}
            ctx = LocalContext(algo.problem, pl, n_, w_, cid, tx, ty, round_)
            s, u = algo.local_update(row, msg, ctx)
            return s, u, ctx.train_loss

        f = vmap(one, in_dims=(0, 0, 0, 0, 0, 0, 0, 0), randomness="error")
        K = ids.numel()
        groups = self.buckets(plans, K)
        whole = len(groups) == 1 and torch.equal(groups[0], torch.arange(K))
        outs = []
        for g in groups:
            take = (lambda v: v) if whole else (lambda v, g=g: v[g])   # one bucket of every client: no row copies
            idxs, ws, acts = [], [], []
            for p in phases:
                pl = plans[p]
                a = pl.active[g]
                S = max(int(a.sum(-1).max()), 1)
                B = max(int((pl.w[g] > 0).sum(-1).max()), 1)
                idxs.append(take(pl.idx)[:, :S, :B])
                ws.append(take(pl.w)[:, :S, :B])
                acts.append(a[:, :S])
            outs.append(f({k: take(v) for k, v in rows.items()}, {k: take(v) for k, v in msgs.items()}, idxs, ws,
                          acts, take(n), take(wt), take(ids)))
        if whole:
            return outs[0]
        inv = torch.empty(K, dtype=torch.long)
        inv[torch.cat(groups)] = torch.arange(K)
        cat = lambda i: {k: torch.cat([o[i][k] for o in outs])[inv] for k in outs[0][i]}
        return cat(0), cat(1), torch.cat([o[2] for o in outs])[inv]


def linear_gd_owner_ok(algorithm) -> bool:
    """``algorithm`` declares its GD form with this configuration (``supports_linear_gd()`` -> True and
    ``linear_gd``), and ``linear_gd`` is defined by the class that defines ``local_update``."""
    supports = getattr(algorithm, "supports_linear_gd", None)
    if supports is None or not hasattr(algorithm, "linear_gd") or not supports():
        return False
    owner = lambda attr: next(k for k in type(algorithm).__mro__ if attr in k.__dict__)  # noqa: E731
    return owner("local_update") is owner("linear_gd")
