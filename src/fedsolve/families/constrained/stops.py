"""When and why a Prox-AL FL run stops short of Eq. 11: an infeasible constraint seen in the multipliers'
steps (:func:`watch_feasibility`), and the run's end in words following its certificate (:func:`run_status`)."""

from __future__ import annotations

import torch

from fedsolve.engine.loop import DivergenceError
from fedsolve.families.constrained import kkt
from fedsolve.families.constrained.config import ProxALConfig
from fedsolve.families.constrained.problem import ConstrainedSpec


def watch_feasibility(name: str, c: ProxALConfig, spec: ConstrainedSpec, s, server, dmu: float, dmu_clients) -> None:
    """An infeasible constraint: w has settled (Eq. 11's first test passes) while the largest multiplier step
    ||mu^{k+1} - mu^k||_inf (= beta x that party's violation) has not halved in ``infeasible_patience`` outer
    iterations -- its multiplier grows without bound: a DivergenceError naming the constraint. A feasible problem
    that converges slowly (small beta) moves w as much as mu and is never stopped here. Updates ``s`` (the next
    server state): the stall count and the reference step ``dmu_ref``."""
    settled = float(server["dw"]) + c.beta * float(server["tau"]) <= c.beta * c.eps1
    halved = dmu < 0.5 * float(server["dmu_ref"]) or dmu <= c.beta * c.eps2
    if halved or not settled:
        s["stall"] = torch.zeros((), dtype=torch.long)
        if halved:
            s["dmu_ref"] = torch.tensor(dmu, dtype=torch.float64)
        return
    s["stall"] = server["stall"] + 1
    if not c.infeasible_patience or int(s["stall"]) < c.infeasible_patience:
        return
    # dmu > 0 here and a party without a constraint has no multiplier (its step is 0)
    if float(server["dmu0"]) >= float(dmu_clients.max()):
        assert spec.server.constraint is not None, "the server's multiplier moved: it has a constraint"
        who = f"the server constraint {list(spec.server.constraint.names)}"
    else:
        assert spec.client_constraint is not None, "a client's multiplier moved: it has a constraint"
        who = f"client {int(dmu_clients.argmax())}'s constraint {list(spec.client_constraint.names)}"
    raise DivergenceError(
        f"{name}: {who} looks infeasible: w has settled, yet after {int(server['k'])} outer iterations its "
        f"multiplier still grows by {dmu / c.beta:.3g} x beta per iteration (no halving in {c.infeasible_patience}); "
        f"loosen the constraint or check its data (infeasible_patience=0 turns this check off)"
    )


def run_status(c: ProxALConfig, server, cert, capped: bool) -> str:
    """The run's end in words, following its certificate (``kkt.status``); ``capped``: the outer loop reached
    ``max_outer`` (else the run's rounds ran out)."""
    caps, misses = int(server["inner_caps"]), int(server["solve_misses"])
    if capped:
        ended = f"outer cap max_outer={c.max_outer} reached"
    else:
        ended = f"the run ended (simulation.rounds) at outer iteration {int(server['k'])} before Eq. 11 passed"
    premise = None
    if caps:
        premise = f"{caps} inner loop(s) stopped at max_inner={c.max_inner} before Eq. 23 (Eq. 10 did not hold)"
    caveats = []
    if misses:
        caveats.append(
            f"{misses} client solve(s) stopped above Eq. 19's tolerance eps_t+1: at the Newton cap "
            f"(newton_max_iter={c.newton_max_iter}) or at float64's rounding floor once q^t is below it "
            f"(eps_floor bounds it)"
        )
    return kkt.status(cert, c.eps1, c.eps2, bool(int(server["converged"])), ended, premise, caveats)
