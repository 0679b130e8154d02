"""Client sampling: uniform without replacement (by count or fraction), weighted, dropout."""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingConfig(BaseModel):
    """Which clients take part in a round.

    ``clients_per_round`` (a count) or ``fraction`` (of all clients, at least one) chooses how
    many; ``scheme`` uniform or weighted by client weight, without replacement; each selected
    client then drops out independently with probability ``dropout``.
    """

    model_config = ConfigDict(extra="forbid")

    clients_per_round: int | None = Field(None, ge=1, description="clients sampled per round")
    fraction: float | None = Field(None, gt=0, le=1, description="fraction of clients sampled per round")
    scheme: Literal["uniform", "weighted"] = Field("uniform", description="sampling probabilities")
    dropout: float = Field(0.0, ge=0, lt=1, description="per-round dropout probability of a selected client")

    @model_validator(mode="after")
    def _one_of(self):
        if self.clients_per_round is not None and self.fraction is not None:
            raise ValueError("sampling: give clients_per_round or fraction, not both")
        return self

    def count(self, m: int) -> int:
        if self.clients_per_round is not None:
            if self.clients_per_round > m:
                raise ValueError(f"sampling.clients_per_round={self.clients_per_round} exceeds the {m} clients")
            return self.clients_per_round
        frac = 1.0 if self.fraction is None else self.fraction
        return max(1, int(frac * m))


def sample_clients(cfg: SamplingConfig, m: int, weights: torch.Tensor,
                   rng: np.random.Generator | Callable[[], np.random.Generator]) -> torch.Tensor:
    """Sorted ids of this round's participants (may be empty after dropout). ``rng`` may be a function that
    makes the round's generator: it is then made only when a draw is needed (not when every client takes
    part without dropout, whose ids are ``0..m-1`` whatever the draw)."""
    k = cfg.count(m)
    if k == m and cfg.dropout == 0:
        return torch.arange(m, dtype=torch.long)
    if callable(rng):
        rng = rng()
    if cfg.scheme == "weighted":
        p = weights.double().numpy()
        ids = rng.choice(m, size=k, replace=False, p=p / p.sum())
    elif k == m:
        ids = np.arange(m)
    else:
        ids = rng.choice(m, size=k, replace=False)
    if cfg.dropout > 0:
        keep = rng.random(ids.size) >= cfg.dropout
        ids = ids[keep]
    return torch.as_tensor(np.sort(ids), dtype=torch.long)
