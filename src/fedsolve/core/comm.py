"""Communication accounting from the actual records sent.

A *record* is a ``{name: tensor}`` dict. Messages (server -> client) and uploads (client ->
server) are records whose tensors carry a leading client dimension ``[k, ...]``; the bytes
of one client's message are the bytes of its row. The ledger sums what really crossed the
wire, so an algorithm that ships two tensors pays for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

Record = dict[str, Tensor]


def row_bytes(record: Mapping[str, Tensor]) -> int:
    """Bytes of ONE client's row of a stacked record."""
    total = 0
    for t in record.values():
        per_row = t.numel() // t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 0
        total += per_row * t.element_size()
    return total


def record_bytes(record: Mapping[str, Tensor]) -> int:
    """Bytes of a whole stacked record (all clients' rows)."""
    return sum(t.numel() * t.element_size() for t in record.values())


def record_floats(record: Mapping[str, Tensor]) -> int:
    return sum(t.numel() for t in record.values())


@dataclass
class CommLedger:
    """Bytes (and scalars) sent down and up, per round and in total."""

    uplink_bytes: int = 0
    downlink_bytes: int = 0
    uplink_floats: int = 0
    downlink_floats: int = 0
    per_round: list[dict[str, int]] = field(default_factory=list)

    def add_round(
        self, round_: int, down: Mapping[str, Tensor], up: Mapping[str, Tensor], extra_down: int = 0, extra_up: int = 0
    ) -> dict[str, int]:
        d, u = record_bytes(down) + extra_down, record_bytes(up) + extra_up
        df, uf = record_floats(down), record_floats(up)
        self.downlink_bytes += d
        self.uplink_bytes += u
        self.downlink_floats += df
        self.uplink_floats += uf
        entry = {"round": round_, "down_bytes": d, "up_bytes": u, "down_floats": df, "up_floats": uf}
        self.per_round.append(entry)
        return entry

    def state_dict(self) -> dict:
        return {
            "uplink_bytes": self.uplink_bytes,
            "downlink_bytes": self.downlink_bytes,
            "uplink_floats": self.uplink_floats,
            "downlink_floats": self.downlink_floats,
            "per_round": list(self.per_round),
        }

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> CommLedger:
        return cls(**{**d, "per_round": list(d.get("per_round", []))})
