"""Client sampling: uniform without replacement (by count or fraction), weighted, dropout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

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


def sample_clients(
    cfg: SamplingConfig, m: int, weights: torch.Tensor, rng: np.random.Generator | Callable[[], np.random.Generator]
) -> torch.Tensor:
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


def inclusion_probabilities(cfg: SamplingConfig, m: int, weights: torch.Tensor) -> torch.Tensor:
    """``pi_i = P(client i takes part in a round)`` under ``cfg`` (float64 ``[m]``): what an unbiased
    (Horvitz-Thompson) server weight ``p_i / pi_i`` divides by.

    ``uniform``: ``k/m``. ``weighted``: :func:`sample_clients` draws successively without replacement with
    probabilities proportional to ``weights`` (numpy's ``choice(replace=False, p=...)``: duplicates of a
    with-replacement draw are dropped and redrawn, which is successive sampling). Successive sampling is an
    exponential race, so with ``E_j ~ Exp(rate w_j)`` independent the sample is the ``k`` smallest ``E_j`` and

        pi_i = int_0^inf w_i exp(-w_i t) P(#{j != i : E_j < t} <= k - 1) dt,

    the count being Poisson-binomial with ``P(E_j < t) = 1 - exp(-w_j t)``; the integral is taken by adaptive
    quadrature over the count's distribution (prefix and suffix recursions over the clients, so every client's
    leave-one-out distribution costs O(k^2)). Each selected client then stays with probability ``1 - dropout``.
    """
    k = cfg.count(m)
    keep = 1.0 - cfg.dropout
    if k == m or cfg.scheme == "uniform":
        return torch.full((m,), k / m * keep, dtype=torch.float64)
    w = weights.detach().double().cpu().numpy()
    w = w / w.sum()
    if int((w > 0).sum()) < k:
        raise ValueError(
            f"sampling.scheme: weighted needs {k} clients of positive weight, the data gives {int((w > 0).sum())}"
        )
    from scipy.integrate import quad_vec

    def stays_below(t: float) -> np.ndarray:
        """w_i exp(-w_i t) P(N_{-i}(t) <= k - 1) for every client i."""
        q = -np.expm1(-w * t)  # P(E_j < t)
        r = 1.0 - q
        pre = np.zeros((m + 1, k))
        suf = np.zeros((m + 1, k))
        pre[0, 0] = suf[m, 0] = 1.0
        for j in range(m):  # pre[j]: the count among clients < j; suf[j]: among clients >= j (counts < k)
            pre[j + 1] = pre[j] * r[j]
            pre[j + 1, 1:] += pre[j, :-1] * q[j]
            b = m - 1 - j
            suf[b] = suf[b + 1] * r[b]
            suf[b, 1:] += suf[b + 1, :-1] * q[b]
        below = (pre[:m] * np.cumsum(suf[1:], axis=1)[:, ::-1]).sum(1)
        return w * r * below

    pi, _ = quad_vec(stays_below, 0.0, np.inf, epsabs=1e-15, epsrel=1e-13, limit=2000)
    return torch.as_tensor(np.clip(pi, 0.0, 1.0) * keep, dtype=torch.float64)
