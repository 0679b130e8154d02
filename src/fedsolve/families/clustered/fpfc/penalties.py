"""FPFC's fusion penalties and their prox (Yu et al., arXiv:2211.04218v3, eq. 2-3 and 6; spec fpfc.md 2.4).

Every penalty here is *radial*: ``prox(delta) = s(||delta||) * delta`` with a scalar ``s``, which is what lets
the server store a pair as ``(delta_ij, s_ij)`` (see ``pairs.py``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def scad(t: Tensor, lam: float, a: float = 3.7) -> Tensor:
    """SCAD penalty P_a(t, lam) (eq. 2), elementwise in |t|."""
    t = t.abs()
    mid = (a * lam * t - 0.5 * (t * t + lam * lam)) / (a - 1)
    return torch.where(t <= lam, lam * t, torch.where(t <= a * lam, mid, torch.full_like(t, lam * lam * (a + 1) / 2)))


def smoothed_scad(t: Tensor, lam: float, a: float = 3.7, xi: float = 1e-4) -> Tensor:
    """Smoothed SCAD P~_a(t, lam) (eq. 3): quadratic on |t| <= xi, SCAD beyond."""
    t = t.abs()
    if lam == 0:
        return torch.zeros_like(t)
    return torch.where(t <= xi, lam / (2 * xi) * t * t + xi * lam / 2, scad(t, lam, a))


def penalty_value(t: Tensor, lam: float, a: float, xi: float, penalty: str) -> Tensor:
    if penalty == "scad":
        return smoothed_scad(t, lam, a, xi)
    return lam * t * t if penalty == "l2sq" else lam * t.abs()


def prox_scale(
    r: Tensor, lam: float, rho: float, a: float = 3.7, xi: float = 1e-4, penalty: Literal["scad", "l1", "l2sq"] = "scad"
) -> Tensor:
    """Scalar s(r) with prox(delta) = s(||delta||) * delta (eq. 6; spec 2.4), elementwise over ``r``.

    ``scad``: argmin_theta P~_a(||theta||, lam) + rho/2 ||delta - theta||^2, 4 branches:
        r <= xi + lam/rho            s = xi rho / (lam + xi rho)
        r <= lam + lam/rho           s = 1 - lam / (rho r)
        r <= a lam                   s = max(0, 1 - a lam / ((a-1) rho r)) / (1 - 1/((a-1) rho))
        r >  a lam                   s = 1
    ``l1``: group soft-threshold at lam/rho, s = max(0, 1 - lam / (rho r)).
    ``l2sq`` (g(t) = lam t^2, Fig. 1's ridge fusion): s = rho / (rho + 2 lam), never 0.
    """
    rs = r.clamp_min(1e-30)
    if penalty == "l1":
        return (1 - lam / (rho * rs)).clamp_min(0.0)
    if penalty == "l2sq":
        return torch.full_like(r, rho / (rho + 2 * lam))
    if lam == 0:
        return torch.ones_like(r)
    s1 = xi * rho / (lam + xi * rho)
    s2 = 1 - lam / (rho * rs)
    s3 = (1 - a * lam / ((a - 1) * rho * rs)).clamp_min(0.0) / (1 - 1 / ((a - 1) * rho))
    one = torch.ones_like(r)
    return torch.where(
        r <= xi + lam / rho,
        torch.full_like(r, s1),
        torch.where(r <= lam + lam / rho, s2, torch.where(r <= a * lam, s3, one)),
    )


def prox(
    delta: Tensor,
    lam: float,
    rho: float,
    a: float = 3.7,
    xi: float = 1e-4,
    penalty: Literal["scad", "l1", "l2sq"] = "scad",
) -> Tensor:
    """theta = prox(delta) over the last dimension (the joint l2 norm of the fused block)."""
    return prox_scale(delta.norm(dim=-1), lam, rho, a, xi, penalty).unsqueeze(-1) * delta
