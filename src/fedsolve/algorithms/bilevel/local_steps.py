"""Persistent per-client numbers of local steps tau_i (system heterogeneity, SimFBO Fig. 4), shared by every
bilevel solver so that the methods of one suite and seed see the same tau_i."""

from __future__ import annotations

import torch

from fedsolve.core.rng import RngStreams


def validate_tau(tau_max: int | None, tau_clients: list[int] | None) -> None:
    if tau_max is not None and tau_clients is not None:
        raise ValueError("give tau_max or tau_clients, not both")
    if tau_clients is not None and min(tau_clients, default=1) < 1:
        raise ValueError(f"tau_clients: every tau_i must be >= 1, got {tau_clients}")


def max_steps(tau: int, tau_max: int | None, tau_clients: list[int] | None) -> int:
    """The largest tau_i (the number of planned local steps; smaller tau_i are masked)."""
    if tau_clients is not None:
        return max(tau_clients)
    return tau_max if tau_max is not None else tau


def draw_tau(rngs: RngStreams, n: int, tau: int, tau_max: int | None, tau_clients: list[int] | None) -> torch.Tensor:
    """tau_i for the n clients (float64): ``tau_clients``, or drawn ONCE uniformly from {1..tau_max} with the
    run's seed (spec 2.11: persistent, not redrawn per round), or ``tau`` for everyone."""
    if tau_clients is not None:
        if len(tau_clients) != n:
            raise ValueError(f"tau_clients: {len(tau_clients)} values for {n} clients")
        return torch.tensor(tau_clients, dtype=torch.float64)
    if tau_max is not None:
        return torch.as_tensor(rngs.numpy("simfbo_tau").integers(1, tau_max + 1, size=n), dtype=torch.float64)
    return torch.full((n,), float(tau), dtype=torch.float64)
