"""Federated data: per-client train/test splits stored as pooled tensors with offsets.

All clients' training samples live in one tensor ``train_x`` ordered by client; client ``i``
owns rows ``train_offsets[i]:train_offsets[i+1]``. This layout lets the vectorized executor
gather minibatches of many clients with one indexing operation (global row indices), without
padding every client to the largest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

Task = Literal["classification", "regression"]


def _offsets(sizes: Sequence[int]) -> Tensor:
    out = torch.zeros(len(sizes) + 1, dtype=torch.long)
    out[1:] = torch.cumsum(torch.as_tensor(list(sizes), dtype=torch.long), 0)
    return out


def _row_major(t: Tensor) -> Tensor:
    """``t`` with the default (row-major) strides of its shape: itself if it has them, else a copy."""
    if t.stride() == torch.empty(t.shape, device="meta").stride():
        return t
    return t.clone(memory_format=torch.contiguous_format)


@dataclass
class FederatedData:
    """Per-client train/test data of one federated problem.

    Attributes:
        train_x, train_y: pooled training samples, grouped by client.
        train_offsets: ``[m+1]`` long tensor; client ``i`` owns rows ``offsets[i]:offsets[i+1]``.
        test_x, test_y, test_offsets: the same for the test splits.
        task: ``"classification"`` (``y`` long, ``num_classes`` set) or ``"regression"`` (``y`` float).
        num_classes: number of classes (``None`` for regression).
        weights: ``[m]`` client weights, by default ``n_i / n`` (training sizes).
        clusters: optional ``[m]`` ground-truth cluster ids (clustered benchmarks).
        train_groups: optional ``[N]`` long tensor naming a group per training row (an index into
            ``group_names``): disjoint splits of each client's data that a phase of local work draws from
            alone (``Work(group=...)``), e.g. a bilevel problem's upper/lower splits or labelled source and
            unlabelled target samples.
        group_names: the names of the groups (``train_groups`` values index it).
        name: dataset name for reports; ``meta`` free-form provenance (partition, substitutes, ...).
    """

    train_x: Tensor
    train_y: Tensor
    train_offsets: Tensor
    test_x: Tensor
    test_y: Tensor
    test_offsets: Tensor
    task: Task = "classification"
    num_classes: int | None = None
    weights: Tensor | None = None
    clusters: Tensor | None = None
    train_groups: Tensor | None = None
    group_names: tuple[str, ...] = ()
    name: str = "data"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # plain row-major samples: a size-1 dimension (the channel of a grey image) may carry any stride, and a
        # stride of 1 there makes torch take [N, 1, H, W] images for channels-last, so convolutions silently run
        # their channels-last kernels (slower for LeNet on CPU) and round differently from a copy of the same data
        self.train_x, self.test_x = _row_major(self.train_x), _row_major(self.test_x)
        m = self.num_clients
        if self.test_offsets.numel() != m + 1:
            raise ValueError("test_offsets and train_offsets must describe the same number of clients")
        if int(self.train_offsets[-1]) != self.train_x.shape[0] or self.train_y.shape[0] != self.train_x.shape[0]:
            raise ValueError("train_offsets[-1] must equal the number of training rows")
        if int(self.test_offsets[-1]) != self.test_x.shape[0] or self.test_y.shape[0] != self.test_x.shape[0]:
            raise ValueError("test_offsets[-1] must equal the number of test rows")
        if self.task == "classification" and self.num_classes is not None:
            self._check_labels(self.num_classes)
        if self.weights is None:
            n = self.train_sizes.to(torch.float64)
            # in the features' float type: float64 data gets exact n_i / n (aggregation weights summing to 1)
            wdt = torch.float64 if self.train_x.dtype == torch.float64 else torch.float32
            self.weights = (n / n.sum()).to(wdt)
        if self.clusters is not None:
            self.clusters = torch.as_tensor(self.clusters, dtype=torch.long)
            if self.clusters.numel() != m:
                raise ValueError("clusters must have one id per client")
        if self.train_groups is not None:
            self.train_groups = torch.as_tensor(self.train_groups, dtype=torch.long)
            self.group_names = tuple(self.group_names)
            if self.train_groups.shape != (self.train_x.shape[0],):
                raise ValueError(
                    f"train_groups must have one group id per training row ({self.train_x.shape[0]}), "
                    f"got shape {tuple(self.train_groups.shape)}"
                )
            if len(set(self.group_names)) != len(self.group_names) or not self.group_names:
                raise ValueError(f"group_names must be distinct and non-empty, got {self.group_names}")
            if self.train_groups.numel() and not (
                int(self.train_groups.min()) >= 0 and int(self.train_groups.max()) < len(self.group_names)
            ):
                raise ValueError(f"train_groups values must index group_names {self.group_names}")

    def _check_labels(self, num_classes: int) -> None:
        """Classification labels lie in ``0 .. num_classes - 1`` (``-1``: an unlabelled row, e.g. a target
        domain's); anything else would index past the model's outputs in the middle of a run."""
        k = int(num_classes)
        for split, y in (("train_y", self.train_y), ("test_y", self.test_y)):
            if y.is_floating_point():
                raise ValueError(
                    f"{split}: classification labels must be integers, got {y.dtype}; allowed: "
                    f"integer labels 0 to {k - 1}, or task='regression' for real-valued targets"
                )
            if y.numel() and (int(y.max()) >= k or int(y.min()) < -1):
                bad = int(y.max()) if int(y.max()) >= k else int(y.min())
                raise ValueError(
                    f"{split}: label {bad} is outside the {k} classes (num_classes = {k}); allowed: "
                    f"labels 0 to {k - 1} (-1 marks an unlabelled row), or a larger num_classes"
                )

    # ----------------------------------------------------------------- sizes
    @property
    def num_clients(self) -> int:
        return self.train_offsets.numel() - 1

    @property
    def train_sizes(self) -> Tensor:
        return self.train_offsets[1:] - self.train_offsets[:-1]

    @property
    def test_sizes(self) -> Tensor:
        return self.test_offsets[1:] - self.test_offsets[:-1]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    # ----------------------------------------------------------------- access
    def client_train(self, i: int) -> tuple[Tensor, Tensor]:
        a, b = int(self.train_offsets[i]), int(self.train_offsets[i + 1])
        return self.train_x[a:b], self.train_y[a:b]

    @property
    def row_groups(self) -> tuple[Tensor, tuple[str, ...]] | None:
        """``(train_groups, group_names)`` for ``build_plans``, or None without groups."""
        return None if self.train_groups is None else (self.train_groups, self.group_names)

    def client_train_groups(self, i: int) -> Tensor | None:
        """Client ``i``'s row groups (``train_groups`` of its training rows), or None without groups."""
        if self.train_groups is None:
            return None
        return self.train_groups[self._train_rows(i)]

    def _train_rows(self, i: int) -> slice:
        """Client ``i``'s rows of the training arrays."""
        return slice(int(self.train_offsets[i]), int(self.train_offsets[i + 1]))

    def client_test(self, i: int) -> tuple[Tensor, Tensor]:
        a, b = int(self.test_offsets[i]), int(self.test_offsets[i + 1])
        return self.test_x[a:b], self.test_y[a:b]

    def subset(self, clients: Sequence[int]) -> FederatedData:
        """A new FederatedData holding only ``clients`` (in that order); used by Flower nodes."""
        clients = list(clients)
        tr = [self.client_train(i) for i in clients]
        te = [self.client_test(i) for i in clients]
        w = self.weights[clients] if self.weights is not None else None
        return FederatedData(
            train_x=torch.cat([x for x, _ in tr]) if tr else self.train_x[:0],
            train_y=torch.cat([y for _, y in tr]) if tr else self.train_y[:0],
            train_offsets=_offsets([x.shape[0] for x, _ in tr]),
            test_x=torch.cat([x for x, _ in te]) if te else self.test_x[:0],
            test_y=torch.cat([y for _, y in te]) if te else self.test_y[:0],
            test_offsets=_offsets([x.shape[0] for x, _ in te]),
            task=self.task,
            num_classes=self.num_classes,
            weights=w,
            clusters=self.clusters[clients] if self.clusters is not None else None,
            train_groups=(
                torch.cat([self.train_groups[self._train_rows(i)] for i in clients])
                if clients
                else self.train_groups[:0]
            )
            if self.train_groups is not None
            else None,
            group_names=self.group_names,
            name=self.name,
            meta=dict(self.meta),
        )

    def split_validation(self, fraction: float = 0.2, seed: int = 0) -> FederatedData:
        """Hold out ``fraction`` of each client's training samples (at random, ``seed``) as its test split.

        The result trains on the rest and scores on the held-out samples: the validation problem of
        hyper-parameter tuning. A client keeps at least one training sample; clusters and names are kept.
        """
        if not 0 < fraction < 1:
            raise ValueError(f"fraction must be in (0, 1), got {fraction}")
        rng = np.random.default_rng(10_000 + seed)
        tr, va, groups = [], [], []
        for i in range(self.num_clients):
            x, y = self.client_train(i)
            n = x.shape[0]
            perm = torch.as_tensor(rng.permutation(n))
            nv = min(round(fraction * n), n - 1)
            va.append((x[perm[:nv]], y[perm[:nv]]))
            tr.append((x[perm[nv:]], y[perm[nv:]]))
            if self.train_groups is not None:
                groups.append(self.train_groups[self._train_rows(i)][perm[nv:]])
        out = FederatedData.from_client_arrays(
            tr,
            va,
            task=self.task,
            num_classes=self.num_classes,
            clusters=self.clusters.tolist() if self.clusters is not None else None,
            name=self.name,
            meta={**self.meta, "validation_split": {"fraction": fraction, "seed": seed}},
            dtype=self.train_x.dtype if self.train_x.is_floating_point() else torch.float32,
        )
        if groups:  # the training rows keep their groups (the held-out rows are scored, not trained on)
            out.train_groups, out.group_names = torch.cat(groups), self.group_names
        return out

    def with_dtype(self, dtype: torch.dtype) -> FederatedData:
        """A copy with features (and regression targets) as ``dtype``; default weights (``n_i / n``) are
        recomputed in that type, other weights converted."""
        n = self.train_sizes.to(torch.float64)
        default = self.weights is not None and torch.allclose(self.weights.double(), n / n.sum(), rtol=1e-6, atol=0)
        return FederatedData(
            train_x=self.train_x.to(dtype),
            test_x=self.test_x.to(dtype),
            train_y=self.train_y if self.task == "classification" else self.train_y.to(dtype),
            test_y=self.test_y if self.task == "classification" else self.test_y.to(dtype),
            train_offsets=self.train_offsets,
            test_offsets=self.test_offsets,
            task=self.task,
            num_classes=self.num_classes,
            weights=None if default or self.weights is None else self.weights.to(dtype),
            clusters=self.clusters,
            train_groups=self.train_groups,
            group_names=self.group_names,
            name=self.name,
            meta=dict(self.meta),
        )

    def to(self, device: torch.device | str) -> FederatedData:
        for k in ("train_x", "train_y", "test_x", "test_y"):
            setattr(self, k, getattr(self, k).to(device))
        return self

    # ----------------------------------------------------------------- build
    @classmethod
    def from_client_arrays(
        cls,
        train: Sequence[tuple[np.ndarray | Tensor, np.ndarray | Tensor]],
        test: Sequence[tuple[np.ndarray | Tensor, np.ndarray | Tensor]],
        *,
        task: Task = "classification",
        num_classes: int | None = None,
        clusters: Sequence[int] | None = None,
        name: str = "data",
        meta: dict[str, Any] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> FederatedData:
        """Build from per-client ``(x, y)`` pairs (train and test lists of equal length); features (and
        regression targets) are stored as ``dtype`` (float32 by default, float64 for exact numerics)."""
        if len(train) != len(test):
            raise ValueError("train and test must list the same clients")

        def cat(parts, idx, dtype):
            ts = [torch.as_tensor(np.asarray(p[idx]) if not isinstance(p[idx], Tensor) else p[idx]) for p in parts]
            return torch.cat(ts).to(dtype)

        xdt = dtype
        ydt = torch.long if task == "classification" else dtype
        return cls(
            train_x=cat(train, 0, xdt),
            train_y=cat(train, 1, ydt),
            train_offsets=_offsets([len(p[1]) for p in train]),
            test_x=cat(test, 0, xdt),
            test_y=cat(test, 1, ydt),
            test_offsets=_offsets([len(p[1]) for p in test]),
            task=task,
            num_classes=num_classes,
            clusters=None if clusters is None else torch.as_tensor(list(clusters)),
            name=name,
            meta=meta or {},
        )
