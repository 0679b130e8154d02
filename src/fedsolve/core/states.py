"""ClientStates: per-client state as stacked tensors indexed by client id.

Every piece of per-client state (local model copies, duals, personal blocks, control
variates, step-size tolerances) is one tensor of shape ``[num_clients, ...]``. Nothing is
kept on a reused worker object, so a client's dual can never leak into another client's
update (the FL-bench FedADMM pitfall in specs/prior-art.md).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import torch
from torch import Tensor


class ClientStates:
    """A dict of ``[m, ...]`` tensors with row gather / scatter by client ids."""

    def __init__(self, num_clients: int, tensors: Mapping[str, Tensor] | None = None):
        self.num_clients = int(num_clients)
        self._t: dict[str, Tensor] = {}
        for k, v in (tensors or {}).items():
            self[k] = v

    # ---------------------------------------------------------------- dict-like
    def __setitem__(self, key: str, value: Tensor) -> None:
        if value.shape[:1] != (self.num_clients,):
            raise ValueError(f"client state {key!r} must have leading dim {self.num_clients}, got {tuple(value.shape)}")
        self._t[key] = value

    def __getitem__(self, key: str) -> Tensor:
        return self._t[key]

    def __contains__(self, key: str) -> bool:
        return key in self._t

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def keys(self):
        return self._t.keys()

    def items(self):
        return self._t.items()

    # ---------------------------------------------------------------- rows
    def gather(self, ids: Tensor) -> dict[str, Tensor]:
        """Rows of the selected clients: ``{name: [k, ...]}`` (copies)."""
        return {k: v.index_select(0, ids.to(v.device)) for k, v in self._t.items()}

    def row(self, i: int) -> dict[str, Tensor]:
        return {k: v[i].clone() for k, v in self._t.items()}

    def scatter(self, ids: Tensor, rows: Mapping[str, Tensor]) -> None:
        """Write back rows of the selected clients; other clients stay bit-identical."""
        for k, v in rows.items():
            if k not in self._t:
                raise KeyError(f"local_update returned unknown client state {k!r}; known: {sorted(self._t)}")
            t = self._t[k]
            t.index_copy_(0, ids.to(t.device), v.to(t.device, t.dtype))

    def clone(self) -> "ClientStates":
        return ClientStates(self.num_clients, {k: v.clone() for k, v in self._t.items()})

    def to(self, device: torch.device | str) -> "ClientStates":
        """The same states with every tensor on ``device`` (itself when they are there already)."""
        return ClientStates(self.num_clients, {k: v.to(device) for k, v in self._t.items()})

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self._t)

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Tensor]) -> "ClientStates":
        m = next(iter(d.values())).shape[0] if d else 0
        return cls(m, d)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self._t.values())

    def __repr__(self) -> str:  # pragma: no cover
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self._t.items())
        return f"ClientStates({shapes})"


def repeat_rows(vec: Tensor, m: int) -> Tensor:
    """``[d] -> [m, d]`` (a real copy, each client owns its row)."""
    return vec.unsqueeze(0).repeat(m, *([1] * vec.dim()))
