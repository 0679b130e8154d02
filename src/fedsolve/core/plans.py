"""Minibatch plans: which rows each selected client uses at each local step, drawn before ``local_update``
runs from the client's own RNG stream, so every executor (and a Flower client) sees the same minibatches.

* :class:`Work` -- how much local work one phase of ``local_update`` does (steps or epochs, batch size, row
  group);
* :class:`Plan` -- the stacked plan of K clients (row indices, sample weights, active steps);
* :func:`build_plans` -- draws every selected client's plan for every phase (deterministic per client).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

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
