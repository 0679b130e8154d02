"""Proximal augmented-Lagrangian pieces shared by Algorithm 1 (proxal.py) and Algorithm 3 (cproxal.py).

penalty(mu, c) = (1/(2 beta)) ( ||[mu + beta c]_+||^2 - ||mu||^2 )              (Eq. 9; equalities: no [.]_+)
mu^+           = [mu + beta c(w)]_+                                              (Alg. 1 lines 5/7)
P_{i,k}(w)     = f_i(w) + penalty(mu_i^k, c_i(w)) + ||w - w^k||^2 / (2 (n+1) beta)   (Eqs. 13-14)
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsolve.families.constrained.problem import ConstrainedSpec, ServerParty


def shifted(mu: Tensor, c: Tensor, eq: Tensor, beta: float) -> Tensor:
    """``[mu + beta c]_+`` componentwise (``mu + beta c`` on equality rows, spec 1.6)."""
    z = mu + beta * c
    return torch.where(eq.to(z.device), z, z.clamp_min(0.0))


def penalty(mu: Tensor, c: Tensor, eq: Tensor, beta: float) -> Tensor:
    """The squared-positive-part AL term ``(||[mu + beta c]_+||^2 - ||mu||^2) / (2 beta)`` (spec 7.1)."""
    if mu.numel() == 0:
        return c.new_zeros(())
    z = shifted(mu, c, eq, beta)
    return (z.pow(2).sum() - mu.pow(2).sum()) / (2.0 * beta)


def client_P(spec: ConstrainedSpec, u: Tensor, part, mu: Tensor, wk: Tensor, beta: float, sigma: float) -> Tensor:
    """``P_{i,k}(u)`` (Eq. 14) of one client from its :class:`~fedsolve.families.constrained.problem.Part` (or
    rows ``(x, y, mask)`` of a row-form problem); ``sigma = 1/((n+1) beta)``."""
    val = spec.f(u, part) + 0.5 * sigma * (u - wk).pow(2).sum()
    if spec.client_constraint is not None:
        val = val + penalty(mu, spec.c(u, part), spec.client_constraint.eq_mask, beta)
    return val


def server_P(server: ServerParty, u: Tensor, mu0: Tensor, wk: Tensor, beta: float, sigma: float) -> Tensor:
    """``P_{0,k}(u)`` (Eq. 13): the server's constraint penalty and its share of the proximal term."""
    val = 0.5 * sigma * (u - wk).pow(2).sum()
    if server.constraint is not None:
        val = val + penalty(mu0, server.c(u), server.constraint.eq_mask, beta)
    return val
