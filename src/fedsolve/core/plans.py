"""Minibatch plans: which rows each selected client uses at each local step, drawn before ``local_update``
runs from the client's own RNG stream, so every executor (and a Flower client) sees the same minibatches.

* :class:`Work` -- how much local work one phase of ``local_update`` does (steps or epochs, batch size, row
  group);
* :class:`Plan` -- the stacked plan of K clients (row indices, sample weights, active steps);
* :func:`build_plans` -- draws every selected client's plan for every phase (deterministic per client).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch
from torch import Tensor

from fedsolve.core.rng import RngStreams


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

    def __init__(
        self,
        idx: Tensor | None,
        w: Tensor | None,
        active: Tensor,
        build: Callable[[], tuple[Tensor, Tensor]] | None = None,
        fixed: bool = False,
    ):
        if (idx is None or w is None) and build is None:
            raise ValueError("Plan: give idx and w, or a build function")
        self._idx, self._w, self.active, self._build = idx, w, active, build
        self.fixed = bool(fixed)
        self._lengths: list[int] | None = None

    def _materialize(self) -> tuple[Tensor, Tensor]:
        if self._idx is None or self._w is None:
            if self._build is None:  # the constructor asks for one or the other
                raise RuntimeError("Plan: neither idx and w nor a build function")
            self._idx, self._w = self._build()
            self._build = None
        return self._idx, self._w

    @property
    def idx(self) -> Tensor:
        return self._materialize()[0]

    @property
    def w(self) -> Tensor:
        return self._materialize()[1]

    def row(self, k: int) -> Plan:
        return Plan(self.idx[k], self.w[k], self.active[k], fixed=self.fixed)

    def to(self, device: torch.device | str) -> Plan:
        """The same plan on ``device`` (a plan is drawn on the CPU; an executor moves it to the data once per
        round). A lazy plan stays lazy: its index is built on the CPU and moved when first needed."""
        build = self._build
        if build is None or (self._idx is not None and self._w is not None):
            idx, w = self._materialize()
            return Plan(idx.to(device), w.to(device), self.active.to(device), fixed=self.fixed)

        def moved() -> tuple[Tensor, Tensor]:
            idx, w = build()
            return idx.to(device), w.to(device)

        return Plan(None, None, self.active.to(device), fixed=self.fixed, build=moved)

    def length(self, step: int) -> int:
        """One client's plan (``w`` ``[S, B]``): how many leading samples of minibatch ``step`` can carry
        weight. Batches are padded at the end with weight-0 rows (a short last batch of an epoch, or a
        client with less data than the largest of the round); the rows past this length are all padding."""
        if self._lengths is None:
            nz = self.w > 0
            B = nz.shape[-1]
            self._lengths = torch.where(nz.any(-1), B - nz.flip(-1).to(torch.uint8).argmax(-1), 0).tolist()
        return self._lengths[step]


@dataclass(frozen=True)
class _Drawn:
    """One phase's plans before stacking, per client ``k`` (numpy ``[K]`` arrays): the client's first row
    ``start``, rows ``n`` in the phase (its rows or its group's), batch size ``bs``, batches per pass
    ``per_epoch``, ``steps``, and where its passes lie in ``flat``: the client-relative rows of its passes
    (permutations for minibatches, the rows once for a full batch), pass ``e`` at ``base + e * stride``."""

    flat: np.ndarray
    start: np.ndarray
    n: np.ndarray
    bs: np.ndarray
    per_epoch: np.ndarray
    steps: np.ndarray
    base: np.ndarray
    stride: np.ndarray


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(l) for l in lengths)`` without a Python loop."""
    if lengths.size and np.all(lengths == lengths[0]):
        return np.tile(np.arange(int(lengths[0]), dtype=np.int64), lengths.size)
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)


#: elements of ``[K, S, B]`` stacked per piece (bounds the temporaries and keeps them in cache)
_STACK_PIECE = 1 << 16


def _stack_plan(d: _Drawn) -> tuple[Tensor, Tensor]:
    """``(idx, w)`` ``[K, S, B]``: step ``s`` of client ``k`` is batch ``b = s mod per_epoch`` of pass
    ``e = s div per_epoch``, rows ``flat[base + e stride + b bs + j]`` for ``j < L = min(bs, n - b bs)``, each
    weighted ``1 / L``; padding is the client's first row with weight 0 (row 0 past the client's steps)."""
    K, S, B = len(d.n), int(d.steps.max()), int(d.bs.max())
    if S > 1 and not d.stride.any():
        # full batches: every step repeats the client's step 0 (zeros past its steps)
        idx1, w1 = (t.numpy() for t in _stack_plan(replace(d, steps=np.ones_like(d.steps))))
        if np.all(d.steps == S):
            return (
                torch.from_numpy(np.broadcast_to(idx1, (K, S, B)).copy()),
                torch.from_numpy(np.broadcast_to(w1, (K, S, B)).copy()),
            )
        live = (np.arange(S) < d.steps[:, None])[:, :, None]
        return torch.from_numpy(np.where(live, idx1, 0)), torch.from_numpy(np.where(live, w1, np.float32(0)))
    if np.all((d.bs == B) & (d.n % B == 0) & (d.steps == S) & (d.stride == d.n)):
        # every step a full batch of B rows, passes back to back: step s is flat[base + s B : base + (s + 1) B]
        seg = d.flat.reshape(K, -1) if d.flat.size == K * S * B else d.flat[d.base[:, None] + np.arange(S * B)]
        idx = seg.reshape(K, S, B) + d.start[:, None, None]
        return torch.from_numpy(idx), torch.from_numpy(np.full((K, S, B), np.float32(1.0 / B)))
    idx = np.empty((K, S, B), dtype=np.int64)
    w = np.empty((K, S, B), dtype=np.float32)
    s = np.arange(S, dtype=np.int64)
    j = np.arange(B, dtype=np.int64)
    chunk = max(1, _STACK_PIECE // (S * B))
    for k0 in range(0, K, chunk):
        sl = slice(k0, k0 + chunk)
        per_epoch, bs, start = d.per_epoch[sl, None], d.bs[sl, None], d.start[sl, None]
        e = s // per_epoch
        b = s - e * per_epoch
        off = d.base[sl, None] + e * d.stride[sl, None] + b * bs  # [k, S]
        length = np.minimum(bs, d.n[sl, None] - b * bs)  # [k, S]
        live = s < d.steps[sl, None]  # [k, S]
        m = (j < length[:, :, None]) & live[:, :, None]  # [k, S, B]
        rows = d.flat[np.where(m, off[:, :, None] + j, 0)]
        idx[sl] = np.where(m, rows + start[:, :, None], (start * live)[:, :, None])
        w[sl] = np.where(m, (1.0 / length).astype(np.float32)[:, :, None], np.float32(0))
    return torch.from_numpy(idx), torch.from_numpy(w)


def _group_rows(
    groups: tuple[Tensor, Sequence[str]] | None,
    phase: str,
    name: str,
    start: np.ndarray,
    n: np.ndarray,
    cids: np.ndarray,
    bad_n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The client-relative rows of row group ``name`` among each client's rows ``start:start+n``:
    ``(rows of all clients, concatenated; how many per client)``. ``bad_n``: the first client with no rows
    (K if none), whose error comes first as in a client-by-client check."""
    if bad_n == 0:
        raise ValueError(f"client {int(cids[0])} has no training samples")
    if groups is None:
        raise ValueError(f"work phase {phase!r} draws from row group {name!r}, but the data has no train_groups")
    gids, names = groups
    if name not in names:
        raise ValueError(f"work phase {phase!r}: unknown row group {name!r}; allowed: {list(names)}")
    n = np.maximum(n, 0)
    rel = _ranges(n)
    hit = gids.cpu().numpy()[np.repeat(start, n) + rel] == names.index(name)
    counts = np.bincount(np.repeat(np.arange(len(n)), n)[hit], minlength=len(n))
    empty = np.flatnonzero(counts == 0)
    if empty.size and empty[0] < bad_n:
        raise ValueError(
            f"client {int(cids[empty[0]])} has no training samples in row group {name!r} (phase {phase!r})"
        )
    return rel[hit], counts


@dataclass(frozen=True)
class _Sized:
    """One phase's sizes before any draw (numpy ``[K]`` arrays): the group's rows (None: the client's own), rows
    ``n``, batch size ``bs``, ``per_epoch``, ``steps``, which clients draw (``bs < n``), their ``passes``, and
    where each client's passes start in the phase's flat row list (``base``; ``seg`` rows each)."""

    rows: np.ndarray | None
    n: np.ndarray
    bs: np.ndarray
    per_epoch: np.ndarray
    steps: np.ndarray
    drawn: np.ndarray
    passes: np.ndarray
    seg: np.ndarray
    base: np.ndarray


def _size_phase(
    phase: str,
    wk: Work,
    cids: np.ndarray,
    sizes: np.ndarray,
    starts: np.ndarray,
    scale: np.ndarray | None,
    groups: tuple[Tensor, Sequence[str]] | None,
    group_rows: dict[str, tuple[np.ndarray, np.ndarray]],
) -> _Sized:
    """One phase's sizes for every client; ``group_rows`` keeps each row group's rows for the round's other
    phases that draw from it."""
    bad = np.flatnonzero(sizes <= 0)
    bad_n = int(bad[0]) if bad.size else len(sizes)
    rows = None
    if wk.group is not None:
        if wk.group not in group_rows:
            group_rows[wk.group] = _group_rows(groups, phase, wk.group, starts, sizes, cids, bad_n)
        rows, n = group_rows[wk.group]
    elif bad.size:
        raise ValueError(f"client {int(cids[bad_n])} has no training samples")
    else:
        n = sizes
    bs = n if wk.batch_size is None else np.minimum(wk.batch_size, n)
    per_epoch = np.ceil(n / bs).astype(np.int64)
    if wk.steps is not None:
        steps = np.full(len(n), wk.steps, dtype=np.int64)
    else:
        steps = np.maximum(1, np.ceil(wk.epochs * per_epoch)).astype(np.int64)
    if scale is not None:
        steps = np.maximum(1, np.rint(steps * scale)).astype(np.int64)  # rint: round half to even, as round()
    drawn = bs < n
    passes = np.where(drawn, -(-steps // per_epoch), 1)  # the passes the steps reach (one for a full batch)
    seg = passes * n
    return _Sized(rows, n, bs, per_epoch, steps, drawn, passes, seg, np.cumsum(seg) - seg)


def _draw_phase(sz: _Sized, starts: np.ndarray, gens: Iterator[tuple[int, np.random.Generator]]) -> tuple[_Drawn, bool]:
    """One phase's plans for every client: epoch-aligned passes, each a fresh permutation of the client's
    ``n`` rows split into ``ceil(n / bs)`` batches (the last may be short), from the next generator of ``gens``
    for each client that draws (its stream ``("batches", round_, cid, phase)``); a client with ``bs = n`` uses
    its rows in order at every step and draws nothing."""
    n, drawn, passes, seg, base = sz.n, sz.drawn, sz.passes, sz.seg, sz.base
    # a full batch's pass is arange(n); a drawn pass is g.permutation(n) = arange(n) shuffled (in a small
    # buffer that stays in cache, then copied into place)
    flat = np.empty(int(seg.sum()), np.int64) if drawn.all() else _ranges(np.repeat(n, passes))
    if drawn.any():
        ks = np.flatnonzero(drawn)
        n_l, base_l, passes_l = n[ks].tolist(), base[ks].tolist(), passes[ks].tolist()
        ar = np.arange(max(n_l), dtype=np.int64)
        buf = np.empty_like(ar)
        for i in range(len(ks)):
            _, g = next(gens)
            ni, b0 = n_l[i], base_l[i]
            b, a = buf[:ni], ar[:ni]
            for e in range(passes_l[i]):
                b[:] = a
                g.shuffle(b)
                flat[b0 + e * ni : b0 + (e + 1) * ni] = b
    if sz.rows is not None:  # group phases: pass positions -> the group's rows
        flat = sz.rows[np.repeat(np.cumsum(n) - n, seg) + flat]
    return _Drawn(flat, starts, n, sz.bs, sz.per_epoch, sz.steps, base, np.where(drawn, n, 0)), not drawn.any()


def build_plans(
    work: Mapping[str, Work],
    offsets: Tensor,
    ids: Tensor,
    rngs: RngStreams,
    round_: int,
    scale: Tensor | None = None,
    groups: tuple[Tensor, Sequence[str]] | None = None,
) -> dict[str, Plan]:
    """Draw every selected client's minibatch plan for every phase (deterministic per client).

    ``groups``: ``(train_groups, group_names)`` of the data, aligned with ``offsets``, for phases whose
    ``Work.group`` names a row group. ``scale``: the round's work fraction of each selected client (variable
    work): ``steps = max(1, round(steps * scale))``."""
    cids = ids.cpu().numpy().astype(np.int64, copy=False)
    off = offsets.cpu().numpy().astype(np.int64, copy=False)
    sizes, starts = (off[1:] - off[:-1])[cids], off[:-1][cids]
    sc = None
    if scale is not None:
        sc = scale.detach().cpu().to(torch.float64).numpy().reshape(-1)
        if sc.shape[0] < len(cids) or not np.all(np.isfinite(sc[: len(cids)])):
            raise ValueError(
                f"build_plans: scale needs one finite work fraction per selected client "
                f"({len(cids)}), got {tuple(scale.shape)}"
            )
        sc = sc[: len(cids)]
    if work and len(cids) == 0:
        raise ValueError("build_plans: no clients selected (ids is empty)")
    plans: dict[str, Plan] = {}
    group_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    sized = {phase: _size_phase(phase, wk, cids, sizes, starts, sc, groups, group_rows) for phase, wk in work.items()}
    # every phase's drawing clients seeded in ONE vectorized hash (phase by phase, clients in order): the same
    # generators as one numpy_each call per phase
    draws = [(np.flatnonzero(sz.drawn), RngStreams.key(phase)) for phase, sz in sized.items()]
    draw_cids = np.concatenate([cids[ks] for ks, _ in draws] or [np.empty(0, np.int64)])
    draw_keys = np.concatenate([np.full(len(ks), key, np.int64) for ks, key in draws] or [draw_cids])
    gens = rngs.numpy_each("batches", round_, draw_cids, draw_keys)
    for phase, sz in sized.items():
        d, fixed = _draw_phase(sz, starts, gens)
        act = torch.from_numpy(np.arange(int(d.steps.max())) < d.steps[:, None])
        plans[phase] = Plan(None, None, act, build=partial(_stack_plan, d), fixed=fixed)
    return plans
