"""A constrained problem's parties from their rows: :func:`rows_data` checks every client's features and targets
(one target per row, finite values, class labels for classification) and packs them as federated data."""

from __future__ import annotations

import numpy as np
import torch

from fedsolve.data.federated import FederatedData, Task


def _offsets(sizes: list[int]) -> torch.Tensor:
    return torch.cumsum(torch.tensor([0, *sizes], dtype=torch.long), 0)


def rows_data(
    train: list[tuple[np.ndarray, np.ndarray]],
    test: list[tuple[np.ndarray, np.ndarray]] | None = None,
    task: Task = "classification",
    name: str = "data",
    meta: dict | None = None,
) -> FederatedData:
    """FederatedData with float64 rows (the constrained solvers work in double precision), one ``(x, y)`` pair per
    client. ``task="classification"`` (integer labels 0/1, scored as a binary classifier) refuses targets that
    are not whole numbers, naming the client: real-valued targets need ``task="regression"`` (and the problem
    ``classes=None``)."""
    test = test if test is not None else train
    if task not in ("classification", "regression"):
        raise ValueError(f"rows_data: task must be 'classification' or 'regression', got {task!r}")
    for split, parts in (("train", train), ("test", test)):
        for i, (x, y) in enumerate(parts):
            x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            if x.shape[:1] != y.shape[:1]:
                raise ValueError(
                    f"rows_data: client {i}'s {split} rows: {x.shape[0]} feature rows but {y.shape[0]} "
                    f"targets; allowed: one target per row"
                )
            for what, a in (("features", x), ("targets", y)):
                if not np.isfinite(a).all():
                    raise ValueError(
                        f"rows_data: client {i}'s {split} {what} hold NaN or inf (row "
                        f"{int(np.argwhere(~np.isfinite(a))[0][0])} first); allowed: finite values"
                    )
    if task == "classification":
        for split, parts in (("train", train), ("test", test)):
            for i, (_, y) in enumerate(parts):
                y = np.asarray(y, dtype=np.float64)
                frac = y[np.isfinite(y) & (y != np.round(y))]
                if frac.size:
                    raise ValueError(
                        f"rows_data: client {i}'s {split} targets are not class labels (e.g. "
                        f"{frac[0]:g}) under task='classification'; pass task='regression' for "
                        f"real-valued targets"
                    )
    ydt = torch.long if task == "classification" else torch.float64
    cat = lambda parts, j, dt: torch.cat([torch.as_tensor(np.asarray(p[j])) for p in parts]).to(dt)
    return FederatedData(
        train_x=cat(train, 0, torch.float64),
        train_y=cat(train, 1, ydt),
        train_offsets=_offsets([len(p[1]) for p in train]),
        test_x=cat(test, 0, torch.float64),
        test_y=cat(test, 1, ydt),
        test_offsets=_offsets([len(p[1]) for p in test]),
        task=task,
        num_classes=2 if task == "classification" else None,
        name=name,
        meta=meta or {},
    )
