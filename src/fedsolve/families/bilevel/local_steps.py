"""Local mechanics shared by the bilevel solvers: the clients' numbers of local steps tau_i (system heterogeneity,
SimFBO Fig. 4; every solver makes the same draw for a seed), persistent or per round, and the three local directions
of one simultaneous (y, v, x) step at one point (SimFBO eq. 3; FBO-AggITD's y and v steps)."""

from __future__ import annotations

from typing import Literal, cast

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsolve.core.rng import RngStreams
from fedsolve.families.bilevel.problem import BilevelOracles

#: ``tau_clients``: one tau_i per client (persistent), or a list of rounds, each with one tau_i per client
TauClients = list[int] | list[list[int]]


def tau_rows(tau_clients: TauClients) -> list[list[int]]:
    """``tau_clients`` as rounds of per-client values (a persistent list is one round)."""
    if tau_clients and isinstance(tau_clients[0], list):
        return [list(r) for r in tau_clients]
    return [list(cast(list[int], tau_clients))]  # the TauClients union's other member: a list of ints


def validate_tau(tau_max: int | None, tau_clients: TauClients | None) -> None:
    if tau_max is not None and tau_clients is not None:
        raise ValueError("give tau_max or tau_clients, not both")
    if tau_clients is None:
        return
    rows = tau_rows(tau_clients)
    if not rows or not rows[0]:
        raise ValueError("tau_clients: empty; allowed: one tau_i >= 1 per client (or a list of rounds of them)")
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(
            f"tau_clients: rounds of different lengths {sorted({len(r) for r in rows})}; allowed: "
            f"every round one tau_i per client"
        )
    if min(min(r) for r in rows) < 1:
        raise ValueError(f"tau_clients: every tau_i must be >= 1, got {tau_clients}")


def check_tau_clients(tau_clients: TauClients | None, n: int) -> None:
    """One tau_i per client of the problem (checked when the solver is built, before any round)."""
    if tau_clients is not None and len(tau_rows(tau_clients)[0]) != n:
        raise ValueError(
            f"tau_clients: {len(tau_rows(tau_clients)[0])} values for {n} clients; allowed: one "
            f"tau_i >= 1 per client (or a list of rounds, each with one per client)"
        )


def max_steps(tau: int, tau_max: int | None, tau_clients: TauClients | None) -> int:
    """The largest tau_i (the number of planned local steps; smaller tau_i are masked)."""
    if tau_clients is not None:
        return max(max(r) for r in tau_rows(tau_clients))
    return tau_max if tau_max is not None else tau


def draw_tau(
    rngs: RngStreams, n: int, tau: int, tau_max: int | None, tau_clients: TauClients | None, rounds: int = 1
) -> torch.Tensor:
    """tau_i for the n clients (float64): ``[n]`` when persistent, ``[n, R]`` when it changes over R rounds (round
    t uses column t mod R). ``tau_clients`` as given; or drawn ONCE uniformly from {1..tau_max} with the run's seed
    (spec 2.11: persistent, not redrawn per round), ``rounds`` > 1 rounds of draws; or ``tau`` for everyone."""
    if tau_clients is not None:
        check_tau_clients(tau_clients, n)
        table = torch.tensor(tau_rows(tau_clients), dtype=torch.float64).T
    elif tau_max is not None:  # the first n draws are the persistent draw's, whatever ``rounds``
        draws = rngs.numpy("simfbo_tau").integers(1, tau_max + 1, size=(rounds, n))
        table = torch.as_tensor(draws, dtype=torch.float64).T
    else:
        table = torch.full((n, 1), float(tau), dtype=torch.float64)
    return table[:, 0].contiguous() if table.shape[1] == 1 else table.contiguous()


def tau_at(tau: torch.Tensor, round_: int, per_round: bool) -> torch.Tensor:
    """The tau of round ``round_`` from a :func:`draw_tau` table (a client's row, or the server's ``[n, ...]``)."""
    return tau[..., round_ % tau.shape[-1]] if per_round else tau


class LocalStepsConfig(BaseModel):
    """The options of the local (y, v) steps that SimFBO, ShroFBO and FBO-AggITD share: per-client tau_i
    (persistent or per round), minibatches, and which derivative oracles compute them."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    tau: int = Field(1, ge=1, description="local steps of every client (when tau_max and tau_clients are unset)")
    tau_max: int | None = Field(
        None,
        ge=1,
        description="system heterogeneity: each client's tau_i drawn uniformly "
        "from {1..tau_max} (seeded; persistent unless tau_rounds > 1)",
    )
    tau_rounds: int = Field(
        1,
        ge=1,
        description="with tau_max: rounds of independent draws, used in turn (round t "
        "takes draw t mod tau_rounds); 1: each client's tau_i drawn once (spec 2.11)",
    )
    tau_clients: TauClients | None = Field(
        None,
        description="explicit tau_i >= 1: one per client (persistent), or "
        "a list of rounds, each one per client (round t uses row t mod rows)",
    )
    batch_size: int | None = Field(64, ge=1, description="minibatch size of every oracle (null: full split)")
    independent_batches: bool = Field(
        True,
        description="independent minibatches per oracle (zeta, psi, xi: 5 "
        "per step); false: one lower and one upper batch per step",
    )
    oracles: Literal["auto", "autograd", "mlp"] = Field(
        "auto",
        description="derivative oracles: torch.func double "
        "backward (autograd), the MLP head's closed forms (mlp), or "
        "mlp where it applies (auto); same numbers to rounding",
    )

    @model_validator(mode="after")
    def _tau(self):
        validate_tau(self.tau_max, self.tau_clients)
        if self.tau_rounds > 1 and self.tau_max is None:
            raise ValueError("tau_rounds: needs tau_max (give per-round tau_clients as a list of rounds instead)")
        return self

    def steps(self) -> int:
        """The largest tau_i (the number of planned local steps)."""
        return max_steps(self.tau, self.tau_max, self.tau_clients)

    @property
    def per_round(self) -> bool:
        """tau_i changes from round to round."""
        return self.tau_rounds > 1 or (self.tau_clients is not None and len(tau_rows(self.tau_clients)) > 1)

    def draw(self, rngs: RngStreams, n: int) -> torch.Tensor:
        """Every client's tau_i (:func:`draw_tau`)."""
        return draw_tau(rngs, n, self.tau, self.tau_max, self.tau_clients, self.tau_rounds)


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
