"""Schedules: protocols that steer a run round by round from inside the engine's one loop.

A lambda path, an asynchronous run, newcomers joining, a table refit or "run until the stopping test passes" is
not a second loop over ``sim.step()``: it is a :class:`Schedule` the one loop (``engine/loop.py``) consults before
and after every round. So evaluation cadence, checkpoints, ``--resume``, Ctrl-C and the divergence checks cover
it like any run, and an interrupted path or asynchronous run resumes to the uninterrupted run's metrics.

Before round ``t`` the loop calls :meth:`Schedule.before_round`, which may change the run through its public API
(``run.set_hparams``, ``run.set_state``) and returns the clients of the round (None: the configured sampling).
After the round it calls :meth:`Schedule.after_round`, which returns a :class:`Decision`: numbers to log in the
next evaluation record, whether to evaluate after this round (None: the configured cadence) and whether the run
is over. The schedule's own state (its position on a path, saved states, a virtual clock) is part of every
checkpoint: :meth:`Schedule.state_dict` and :meth:`Schedule.load_state_dict` (given the run, to re-apply
hyper-parameters) must restore it exactly. Everything random comes from ``run.rngs``, keyed by round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import ValidationError
from torch import Tensor


@dataclass
class Decision:
    """What a schedule says after a round: ``log`` (numbers for the next evaluation record), ``evaluate`` (True /
    False: evaluate after this round or not; None: the configured ``eval_every``), ``stop`` (the run is over)."""

    log: dict[str, float] = field(default_factory=dict)
    evaluate: bool | None = None
    stop: bool = False


class Schedule:
    """Base of the schedules (see the module docstring); the default changes nothing."""

    #: the name a config gives (``algorithm.schedule: {kind: <name>, ...}``)
    name: ClassVar[str] = "plain"
    #: one line for ``fedsolve list schedules``
    description: ClassVar[str] = "the configured rounds, sampling and evaluation cadence"

    def check(self, algo, cfg) -> None:
        """Raise ``ValueError`` (one line naming the field) when this schedule cannot steer ``algo`` under the
        simulation settings ``cfg`` (called before the run is built)."""

    def start(self, run) -> None:
        """Before round 0 of a fresh run (not on resume)."""

    def before_round(self, run, round_: int) -> Tensor | None:
        """The clients of round ``round_`` (None: sampled as configured); may change the run first."""
        return None

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        return Decision()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, run, state: dict[str, Any]) -> None:
        """Restore the state :meth:`state_dict` gave (on ``--resume``), re-applying what it set on ``run``."""

    def summary(self) -> dict[str, Any]:
        """What goes into summary.json at the end (e.g. the chosen lambda)."""
        return {}


SCHEDULES: dict[str, type[Schedule]] = {}


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    if cls.name in SCHEDULES and SCHEDULES[cls.name] is not cls:
        raise ValueError(f"schedule {cls.name!r} registered twice")
    SCHEDULES[cls.name] = cls
    return cls


def make_schedule(spec: Mapping[str, Any], algo, cfg) -> Schedule:
    """The schedule ``spec`` names (``{kind: <name>, ...its parameters}``), checked against the algorithm ``algo``
    and the simulation settings ``cfg``; ``ValueError`` with one line naming the field (``schedule.<field>``) when
    the kind is unknown, a parameter is wrong or the schedule cannot steer this run."""
    params = dict(spec)
    kind = params.pop("kind", None)
    if kind not in SCHEDULES:
        raise ValueError(f"schedule.kind: unknown {kind!r}; allowed: {sorted(SCHEDULES)}")
    try:
        schedule = SCHEDULES[kind](**params)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"schedule.{where}: {err['msg']} (got {err.get('input')!r})") from None
    except TypeError as e:  # a parameter the schedule does not take
        raise ValueError(f"schedule: {kind} {e}") from None
    schedule.check(algo, cfg)
    return schedule
