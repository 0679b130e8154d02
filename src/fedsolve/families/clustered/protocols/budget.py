"""A budget of local computation (Sec. 6.4.4 and Fig. 9 of Yu et al., arXiv:2211.04218v3; spec fpfc.md 2.12), as
a schedule of the engine's one loop (``engine/schedules.py``).

The paper compares communication strategies at a fixed total number of local iterations K x T: a constant T = 5
or T = 10 local steps per round, or T_k growing with the round (``local_schedule: growing``). With the budget
fixed, each strategy has its own number of rounds K (MNIST, 1,000 steps: 200, 100 and 63). The schedule
``local_budget`` ends a run once the local steps of its rounds add up to ``total_steps``::

    algorithm:
      name: fpfc
      params: {local_steps: 10}
      schedule: {kind: local_budget, total_steps: 1000}

Round k spends the steps the algorithm asks of each participant in that round (``Algorithm.work(k)``, summed over
its phases; every phase must name a number of steps, not epochs). The running total is logged as ``local_steps``
in the evaluation records and the run is evaluated after its last round; ``simulation.rounds`` must leave room to
spend the budget (checked before the run starts). Variable work (``simulation.work``) scales each participant's
steps around the nominal T_k counted here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedsolve.engine.schedules import Decision, Schedule, register_schedule


class LocalBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    total_steps: int = Field(
        ..., ge=1, description="end the run once the rounds' local steps add up to this (the paper's K x T)"
    )


def steps_at(algo, round_: int) -> int:
    """The local steps ``algo`` asks of a participant in round ``round_`` (all phases)."""
    phases = algo.work(round_)
    missing = [name for name, w in phases.items() if w.steps is None]
    if missing or not phases:
        raise ValueError(
            f"schedule.kind: local_budget counts local steps, but {algo.name}'s phase "
            f"{(missing or ['(none)'])[0]!r} runs epochs; allowed: an algorithm with local_steps set "
            f"(or local_schedule: growing)"
        )
    return sum(w.steps for w in phases.values())


def rounds_for(algo, total_steps: int, limit: int) -> int | None:
    """The rounds ``algo`` takes to spend ``total_steps`` local steps (None: more than ``limit``)."""
    spent = 0
    for k in range(limit):
        spent += steps_at(algo, k)
        if spent >= total_steps:
            return k + 1
    return None


@register_schedule
class LocalBudget(Schedule):
    """Rounds until the local steps add up to ``total_steps`` (module docstring)."""

    name = "local_budget"
    description = "rounds until the local steps add up to a budget (Fig. 9: strategies at the same K x T)"

    def __init__(self, **params: Any):
        self.cfg = LocalBudgetConfig(**params)
        self.spent = 0

    def check(self, algo, cfg) -> None:
        need = rounds_for(algo, self.cfg.total_steps, cfg.rounds)
        if need is None:
            spent = sum(steps_at(algo, k) for k in range(cfg.rounds))
            raise ValueError(
                f"simulation.rounds: {cfg.rounds} rounds spend {spent} local steps, below the budget "
                f"schedule.total_steps = {self.cfg.total_steps}; allowed: more rounds"
            )

    def start(self, run) -> None:
        self.check(run.algo, run.cfg)

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        self.spent += steps_at(run.algo, round_)
        done = self.spent >= self.cfg.total_steps
        return Decision(log={"local_steps": float(self.spent)}, evaluate=True if done else None, stop=done)

    def state_dict(self) -> dict[str, Any]:
        return {"spent": self.spent}

    def load_state_dict(self, run, state: dict[str, Any]) -> None:
        self.spent = int(state["spent"])

    def summary(self) -> dict[str, Any]:
        return {"local_steps": self.spent, "local_budget": self.cfg.total_steps}
