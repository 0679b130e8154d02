"""Local mechanics shared by the bilevel solvers: persistent per-client numbers of local steps tau_i (system
heterogeneity, SimFBO Fig. 4; every solver makes the same draw for a seed) and the three local directions of
one simultaneous (y, v, x) step at one point (SimFBO eq. 3; FBO-AggITD's y and v steps)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsolve.families.bilevel.problem import BilevelOracles
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


class LocalStepsConfig(BaseModel):
    """The options of the local (y, v) steps that SimFBO, ShroFBO and FBO-AggITD share: persistent per-client
    tau_i, minibatches, and which derivative oracles compute them."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    tau: int = Field(1, ge=1, description="local steps of every client (when tau_max and tau_clients are unset)")
    tau_max: int | None = Field(None, ge=1, description="system heterogeneity: each client's persistent tau_i "
                                "drawn once, uniformly from {1..tau_max} (seeded)")
    tau_clients: list[int] | None = Field(None, description="explicit persistent tau_i, one per client (>= 1)")
    batch_size: int | None = Field(64, ge=1, description="minibatch size of every oracle (null: full split)")
    independent_batches: bool = Field(True, description="independent minibatches per oracle (zeta, psi, xi: 5 "
                                      "per step); false: one lower and one upper batch per step")
    oracles: Literal["auto", "autograd", "mlp"] = Field("auto", description="derivative oracles: torch.func double "
                                                     "backward (autograd), the MLP head's closed forms (mlp), or "
                                                     "mlp where it applies (auto); same numbers to rounding")

    @model_validator(mode="after")
    def _tau(self):
        validate_tau(self.tau_max, self.tau_clients)
        return self

    def steps(self) -> int:
        """The largest tau_i (the number of planned local steps)."""
        return max_steps(self.tau, self.tau_max, self.tau_clients)


def batch_groups(lower: str, upper: str, independent: bool) -> dict[str, str]:
    """The minibatch phases of one simultaneous local step and the row group each one draws from: five
    independent minibatches (zeta for y; psi = lower + upper for v; xi = upper + lower for x: spec 2.3), or one
    lower and one upper minibatch shared by the three directions."""
    if independent:
        return {"lower_y": lower, "lower_v": lower, "upper_v": upper, "upper_x": upper, "lower_x": lower}
    return {"lower": lower, "upper": upper}


def directions(O: BilevelOracles, ctx, k: int, x, y, v, independent: bool, with_x: bool = True):
    """(d_y, d_v, d_x, f_i) at ONE local point (x, y, v), on step ``k``'s minibatches (SimFBO eq. 3):

        d_y = grad_y g_i(x, y)
        d_v = grad2_yy g_i(x, y) v - grad_y f_i(x, y)            (grad_v R_i: an HVP and a gradient)
        d_x = grad_x f_i(x, y) - grad2_xy g_i(x, y) v            (barGrad f_i: a mixed JVP and a gradient)

    ``with_x = False`` skips d_x (returned as None) and its oracles. Phases as in :func:`batch_groups`."""
    if independent:
        dy, _ = O.grad_y_g(x, y, ctx.batch("lower_y", k))
        if not with_x:
            dv, fval = O.ls_grad(x, y, v, ctx.batch("lower_v", k), ctx.batch("upper_v", k), with_value=True)
            return dy, dv, None, fval
        dv = O.ls_grad(x, y, v, ctx.batch("lower_v", k), ctx.batch("upper_v", k))
        dx, fval = O.surrogate(x, y, v, ctx.batch("upper_x", k), ctx.batch("lower_x", k))
        return dy, dv, dx, fval
    bl, bu = ctx.batch("lower", k), ctx.batch("upper", k)
    if not with_x:
        dy, _ = O.grad_y_g(x, y, bl)
        dv, fval = O.ls_grad(x, y, v, bl, bu, with_value=True)
        return dy, dv, None, fval
    dy, jv, hv = O.g_derivatives(x, y, v, bl)
    fx, fy, fval = O.grad_f(x, y, bu)
    return dy, hv - fy, fx - jv, fval
