"""fedsolve records <-> Flower records.

A fedsolve *record* is a ``{name: tensor}`` dict (see ``fedsolve.core.comm``). On the wire one
client's row of a message or upload record becomes ONE Flower ``ArrayRecord`` holding every
tensor of that record under its own name (dtype and shape preserved: numpy ``.npy`` bytes),
so an algorithm that ships ``(w_i, alpha_i)`` or ``(x, y, v)`` sends all of them; scalars
(train loss, per-client metrics) travel in a ``MetricRecord``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import Tensor

Record = dict[str, Tensor]


def to_array_record(record: Mapping[str, Tensor]) -> ArrayRecord:
    """One client's row ``{name: tensor}`` -> ``ArrayRecord`` (a copy; every tensor kept)."""
    out = ArrayRecord()
    for k, v in record.items():
        if not isinstance(v, Tensor):
            raise TypeError(f"record entry {k!r} must be a tensor, got {type(v).__name__}")
        out[k] = Array(v.detach().cpu().contiguous().numpy())
    return out


def from_array_record(rec: ArrayRecord | None) -> Record:
    """``ArrayRecord`` -> ``{name: tensor}`` (writable copies, original dtypes)."""
    if rec is None:
        return {}
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in rec.items()}


def stack_rows(rows: list[Mapping[str, Tensor]]) -> Record:
    """Per-client rows -> stacked ``[k, ...]`` record (the executor's output layout)."""
    if not rows:
        return {}
    return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}


def row(record: Mapping[str, Tensor], k: int) -> Record:
    """Row ``k`` of a stacked record."""
    return {a: b[k] for a, b in record.items()}
