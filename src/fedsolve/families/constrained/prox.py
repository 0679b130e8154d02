"""The simple convex term ``h`` of Eq. 5, given by its prox (Assumption 2a), and the problem layer's error type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor


class ConstraintError(ValueError):
    """A constraint (or the objective) was given in a form the solvers cannot use; the message names it."""


@dataclass(frozen=True)
class Prox:
    """The simple convex function ``h`` of Eq. 5, given by its prox (Assumption 2a).

    * ``zero``: h = 0;  * ``l1``: h = lam ||w||_1;  * ``box``: indicator of ``lo <= w <= hi``;
    * ``projection``: indicator of a closed convex set, ``project(v)`` its Euclidean projection.
    """

    kind: Literal["zero", "l1", "box", "projection"] = "zero"
    lam: float = 0.0
    lo: float = float("-inf")
    hi: float = float("inf")
    project: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("zero", "l1", "box", "projection"):
            raise ConstraintError(f"prox.kind: unknown {self.kind!r}; allowed: 'zero', 'l1', 'box', 'projection'")
        if self.kind == "l1" and not self.lam >= 0:
            raise ConstraintError(f"prox l1: lam must be >= 0, got {self.lam}")
        if self.kind == "box" and not self.lo <= self.hi:
            raise ConstraintError(f"prox box: need lo <= hi, got lo={self.lo}, hi={self.hi}")
        if self.kind == "projection" and self.project is None:
            raise ConstraintError("prox projection: give project(v) -> the projection of v onto the set")

    @property
    def is_zero(self) -> bool:
        return self.kind == "zero" or (self.kind == "l1" and self.lam == 0)

    def __call__(self, v: Tensor, gamma: float) -> Tensor:
        """``prox_{gamma h}(v) = argmin_w h(w) + ||w - v||^2 / (2 gamma)``."""
        if self.is_zero:
            return v
        if self.kind == "l1":
            return torch.sign(v) * (v.abs() - gamma * self.lam).clamp_min(0.0)
        if self.kind == "box":
            return v.clamp(self.lo, self.hi)
        assert self.project is not None, "kind 'projection' has project (checked in __post_init__)"
        return self.project(v)

    def value(self, w: Tensor) -> float:
        if self.is_zero:
            return 0.0
        if self.kind == "l1":
            return float(self.lam * w.abs().sum())
        inside = bool(torch.allclose(self(w, 1.0), w, atol=1e-9, rtol=0))
        return 0.0 if inside else float("inf")

    def stationarity(self, w: Tensor, g: Tensor) -> float:
        """``dist_inf(0, g + dh(w))`` (Definition 1): exact for zero, l1 and box; for a general projection
        the upper bound ``||w - P(w - g)||_inf`` of a unit prox step (spec 3.4)."""
        if self.is_zero:
            return float(g.abs().max()) if g.numel() else 0.0
        if self.kind == "l1":
            lam = self.lam
            r = torch.where(w != 0, (g + lam * torch.sign(w)).abs(), (g.abs() - lam).clamp_min(0.0))
            return float(r.max())
        if self.kind == "box":
            # normal cone of the box: g_j may be cancelled by any v <= 0 at lo, v >= 0 at hi
            at_lo, at_hi = w <= self.lo, w >= self.hi
            r = torch.where(at_lo, (-g).clamp_min(0.0), g.abs())
            r = torch.where(at_hi, g.clamp_min(0.0), r)
            return float(r.max())
        assert self.project is not None, "kind 'projection' has project (checked in __post_init__)"
        return float((w - self.project(w - g)).abs().max())
