"""Hyper-parameters of Prox-AL FL (Algorithms 1-2) and cProx-AL (Algorithm 3), and the shared start w^0.

Defaults are the paper's Neyman-Pearson values (Sec. 5.1) and the authors' code's q and caps (spec 3.3); the
suites set the fairness and QP values. Where the paper and the authors' code differ, the code's choice is an
option (spec section 9), the paper's the default.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

StartKind = Literal["unit_sphere", "positive_sphere", "engine", "zero"]


class ProxALConfig(BaseModel):
    """Hyper-parameters of Algorithms 1-2."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    beta: float = Field(300.0, gt=0, description="fixed AL penalty beta (no increase schedule)")
    s_bar: float = Field(1e-3, gt=0, description="inner tolerances tau_k = s_bar / (k+1)^2")
    rho: float = Field(0.01, gt=0, description="ADMM penalty rho_i (the same for every client)")
    q: float = Field(0.9, gt=0, lt=1, description="subproblem tolerances eps_{t+1} = q^t")
    eps1: float = Field(1e-3, gt=0, lt=1, description="stationarity target of Eq. 11 / Definition 1")
    eps2: float = Field(1e-3, gt=0, lt=1, description="feasibility/complementarity target of Eq. 11")
    max_outer: int = Field(100, ge=1, description="safety cap K_max on outer iterations (then: did not converge)")
    max_inner: int = Field(300, ge=1, description="safety cap T_max on ADMM rounds per outer iteration")
    mu0: float = Field(0.0, ge=0, description="initial multipliers mu_i^0 (every party)")
    w0: StartKind = Field(
        "unit_sphere",
        description="w^0: random on the unit sphere (paper), normalised Uniform[0,1)^d (code), the "
        "engine's model init, or zero",
    )
    solver: Literal["auto", "newton", "quadratic", "scipy"] = Field(
        "auto",
        description="client/server subproblem solver: auto = quadratic (exact) for quadratic problems, "
        "else newton; scipy = SciPy's L-BFGS-B, one client at a time (a reference)",
    )
    newton_max_iter: int = Field(
        200,
        ge=1,
        description="cap on Newton steps per subproblem (clients and server): "
        "each stops once Eq. 19's tolerance is met",
    )
    newton_step: Literal["modified", "plain"] = Field(
        "modified",
        description="Newton step where a subproblem's Hessian is not positive definite (a nonconvex "
        "constraint, e.g. fairness): modified = H + 2|lambda_min| I, towards a local "
        "minimiser; plain = H as it is (Table 2's reported runs)",
    )
    inner_stop: Literal["paper", "measured", "code"] = Field(
        "paper",
        description="server term of Eq. 23: eps_{t+1} = q^t (paper), the server's measured residual, or "
        "none (authors' NP/QP code)",
    )
    eps_tilde: Literal["paper", "code"] = Field(
        "paper", description="Eq. 22 with the old lambda_i^t (paper) or the updated one (authors' NP code)"
    )
    admm_start: Literal["wk", "w0"] = Field(
        "wk", description="ADMM start w~^0 = w^k (paper) or the original w^0 (authors' NP code)"
    )
    eps_floor: float = Field(0.0, ge=0, description="eps_{t+1} = max(q^t, eps_floor) (authors' code: 1e-10)")
    client_tol_factor: float = Field(
        1.0,
        gt=0,
        le=1,
        description="clients solve Eq. 19 to ||grad||_inf <= "
        "client_tol_factor x eps_{t+1} (paper: 1; authors' NP code: 1e-2)",
    )
    infeasible_patience: int = Field(
        40,
        ge=0,
        description="stop naming the constraint once w has settled (Eq. 11's "
        "first test passes) while the largest multiplier step has not halved for this "
        "many outer iterations (an infeasible constraint: its multiplier grows without "
        "bound); 0 = off",
    )


class CProxALConfig(BaseModel):
    """Hyper-parameters of Algorithm 3 (the same names and meanings as Prox-AL FL's)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    beta: float = Field(300.0, gt=0, description="fixed AL penalty beta (the same as Prox-AL FL's)")
    s_bar: float = Field(1e-3, gt=0, description="subproblem tolerances tau_k = s_bar / (k+1)^2")
    eps1: float = Field(1e-3, gt=0, lt=1, description="stationarity target of the stop test")
    eps2: float = Field(1e-3, gt=0, lt=1, description="feasibility target of the stop test")
    max_outer: int = Field(100, ge=1, description="safety cap on outer iterations (then: did not converge)")
    mu0: float = Field(0.0, ge=0, description="initial multipliers")
    w0: StartKind = Field("unit_sphere", description="w^0, drawn as Prox-AL FL draws it (same seed: the same w^0)")
    newton_max_iter: int = Field(100, ge=1, description="Newton steps per subproblem (cap)")
    newton_step: Literal["modified", "plain"] = Field(
        "modified",
        description="Newton step where the subproblem's Hessian is not positive definite (as Prox-AL FL's newton_step)",
    )


def initial_point(kind: str, x0: Tensor, seed_gen: torch.Generator) -> Tensor:
    """w^0 of the paper's protocol (spec 5: the same w^0 for Alg. 1 and cProx-AL within a trial)."""
    d = x0.numel()
    if kind == "engine":
        return x0.detach().double().clone()
    if kind == "zero":
        return torch.zeros(d, dtype=torch.float64, device=x0.device)
    # drawn on the cpu: the same w^0 on every device
    if kind == "unit_sphere":
        v = torch.randn(d, generator=seed_gen, dtype=torch.float64, device="cpu")
    else:
        v = torch.rand(d, generator=seed_gen, dtype=torch.float64, device="cpu")
    return (v / v.norm()).to(x0.device)
