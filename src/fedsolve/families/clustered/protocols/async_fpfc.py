"""asyncFPFC (Algorithm 3 of Yu et al., arXiv:2211.04218v3; spec fpfc.md 2.9) and synchronous FPFC on the same
virtual clock (Fig. 8), as schedules of the engine's one loop (``engine/schedules.py``).

Every device runs eq. (5) with the zeta_i it last received; when device i_k finishes (virtual time
= start + ``compute_time`` + delay) the server updates only the pairs (i_k, j), j != i_k, and sends
zeta_{i_k} back; i_k immediately starts again. The server rule is ``fpfc.AsyncFPFC``; the schedule
:class:`AsyncEvents` (``async_fpfc``) keeps a heap of finish times as the virtual clock, and each round of the run
is one server event: the one device whose upload arrives (nothing sleeps). Delays are U[delay_low, delay_high]
seconds (paper: [0, 20] for H&BF / synthetic, [0, 800] for MNIST / FMNIST), fixed per node (``delay_mode='fixed'``)
or redrawn for every update (``'redraw'``); the paper does not say which. The run is evaluated every
``eval_every`` virtual seconds (one record when several such times pass between two events, at the last of
them) and ends at the ``horizon`` or after ``simulation.rounds`` events.

:class:`VirtualClock` (``virtual_clock``) is the synchronous baseline on the same clock: FPFC with its configured
sampling, each round lasting max over the selected devices of (compute + delay), run until the ``horizon``.

Both log ``virtual_time`` in the evaluation records and keep the clock (the heap, the delay draws) in every
checkpoint, so an interrupted run resumes to the uninterrupted run's numbers. A config::

    algorithm:
      name: async_fpfc
      schedule: {kind: async_fpfc, delay_high: 20.0, horizon: 1000.0, eval_every: 50.0}

:func:`run_async_fpfc` and :func:`run_sync_fpfc_timed` run them from Python.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fedsolve.core.rng import RngStreams
from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.engine.schedules import Decision, Schedule, register_schedule
from fedsolve.engine.wrappers import Wrapper
from fedsolve.families.clustered.fpfc import FPFC, AsyncFPFC, FPFCConfig

#: the rounds of a run that ends at its horizon (no run reaches them)
UNTIL_HORIZON = 10**12


class ClockConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delay_low: float = Field(0.0, ge=0, description="delay ~ U[delay_low, delay_high] virtual seconds")
    delay_high: float = Field(20.0, ge=0, description="upper end of the delay (paper: 20 synthetic, 800 MNIST)")
    delay_mode: Literal["fixed", "redraw"] = Field("fixed", description="one delay per node, or a new one per update")
    compute_time: float = Field(0.0, ge=0, description="virtual seconds of local computation per update")
    horizon: float = Field(1000.0, gt=0, description="stop at this virtual time")

    @field_validator("delay_high")
    @classmethod
    def _above_low(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("delay_low", 0.0)
        if v < low:
            raise ValueError(f"below delay_low {low}; allowed: delay_high >= delay_low")
        return v


class AsyncConfig(ClockConfig):
    max_events: int | None = Field(None, ge=1, description="stop after this many server events")
    eval_every: float = Field(50.0, gt=0, description="evaluate every this many virtual seconds")


class Delays:
    """Virtual seconds a device takes per update: ``compute_time`` + its delay (drawn from ``rngs``; ``count``: the
    updates drawn so far per device, the state of the ``redraw`` mode)."""

    def __init__(self, cfg: ClockConfig, m: int, rngs: RngStreams):
        self.cfg, self.rngs = cfg, rngs
        self.fixed = rngs.numpy("async_delay").uniform(cfg.delay_low, cfg.delay_high, size=m)
        self.count = np.zeros(m, dtype=np.int64)

    def __call__(self, i: int) -> float:
        c = self.cfg
        if c.delay_mode == "fixed":
            d = float(self.fixed[i])
        else:
            d = float(self.rngs.numpy("async_delay", i, int(self.count[i])).uniform(c.delay_low, c.delay_high))
        self.count[i] += 1
        return c.compute_time + d


def _solver(algo):
    """``algo`` without its wrappers."""
    while isinstance(algo, Wrapper):
        algo = algo.inner
    return algo


@register_schedule
class AsyncEvents(Schedule):
    """asyncFPFC's event loop (module docstring): round k is the k-th upload to arrive on the virtual clock."""

    name = "async_fpfc"
    description = "asyncFPFC (Algorithm 3): each round the one device whose upload arrives next on a virtual clock"

    def __init__(self, **params: Any):
        self.cfg = AsyncConfig(**params)
        self.delays: Delays | None = None
        self.heap: list[tuple[float, int]] = []
        self.now, self.device = 0.0, -1  # the event being processed
        self.next_eval = self.cfg.eval_every

    def check(self, algo, cfg) -> None:
        if not isinstance(_solver(algo), AsyncFPFC):
            raise ValueError(
                f"schedule.kind: async_fpfc needs asyncFPFC's server (algorithm async_fpfc), got "
                f"{algo.name}; allowed for {algo.name}: virtual_clock"
            )

    def start(self, run) -> None:
        self.check(run.algo, run.cfg)
        self.delays = Delays(self.cfg, run.problem.num_clients, run.rngs)
        self.heap = [(self.delays(i), i) for i in range(run.problem.num_clients)]
        heapq.heapify(self.heap)

    def before_round(self, run, round_: int):
        self.now, self.device = heapq.heappop(self.heap)
        if self.now > self.cfg.horizon:  # nothing arrives before the horizon: an empty round, then the end
            return torch.zeros(0, dtype=torch.long)
        return torch.tensor([self.device])

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        c = self.cfg
        assert self.delays is not None, "start (or load_state_dict) builds the delays before the first round"
        heapq.heappush(
            self.heap,
            (self.now + self.delays(self.device), self.device) if info["clients"] else (self.now, self.device),
        )
        t_next = self.heap[0][0]
        if not info["clients"] or t_next > c.horizon or (c.max_events is not None and round_ + 1 >= c.max_events):
            return Decision(log={"virtual_time": min(t_next, c.horizon)}, evaluate=True, stop=True)
        if t_next >= self.next_eval and self.next_eval <= c.horizon:
            while t_next >= self.next_eval and self.next_eval <= c.horizon:
                at, self.next_eval = self.next_eval, self.next_eval + c.eval_every
            return Decision(log={"virtual_time": at}, evaluate=True)
        return Decision(log={"virtual_time": self.now}, evaluate=False)

    def state_dict(self) -> dict[str, Any]:
        assert self.delays is not None, "start (or load_state_dict) builds the delays before the first round"
        return {
            "heap": list(self.heap),
            "count": self.delays.count.tolist(),
            "now": self.now,
            "device": self.device,
            "next_eval": self.next_eval,
        }

    def load_state_dict(self, run, state: dict[str, Any]) -> None:
        self.delays = Delays(self.cfg, run.problem.num_clients, run.rngs)
        self.delays.count[:] = state["count"]
        self.heap = [tuple(e) for e in state["heap"]]
        self.now, self.device, self.next_eval = state["now"], state["device"], state["next_eval"]


@register_schedule
class VirtualClock(Schedule):
    """Synchronous rounds on asyncFPFC's virtual clock (Fig. 8): a round lasts max over its devices of
    (compute + delay); the run ends once the clock passes the ``horizon``."""

    name = "virtual_clock"
    description = "synchronous rounds on asyncFPFC's virtual clock (Fig. 8): each lasts its slowest device's delay"

    def __init__(self, **params: Any):
        self.cfg = ClockConfig(**params)
        self.delays: Delays | None = None
        self.t = 0.0

    def start(self, run) -> None:
        self.delays = Delays(self.cfg, run.problem.num_clients, run.rngs)

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        assert self.delays is not None, "start (or load_state_dict) builds the delays before the first round"
        self.t += max((self.delays(i) for i in info["ids"].tolist()), default=0.0)
        return Decision(log={"virtual_time": self.t}, stop=self.t >= self.cfg.horizon)

    def state_dict(self) -> dict[str, Any]:
        assert self.delays is not None, "start (or load_state_dict) builds the delays before the first round"
        return {"t": self.t, "count": self.delays.count.tolist()}

    def load_state_dict(self, run, state: dict[str, Any]) -> None:
        self.start(run)
        assert self.delays is not None, "start builds the delays"
        self.delays.count[:] = state["count"]
        self.t = state["t"]


def _config(algorithm: type[FPFC], algo_cfg) -> dict:
    """``algo_cfg`` completed with ``algorithm``'s defaults (e.g. FPFC-l1's penalty) as a plain FPFC config."""
    full = algorithm.Config(**dict(algo_cfg)).model_dump()
    return {k: v for k, v in full.items() if k in FPFCConfig.model_fields}


def _history(res) -> list[dict[str, Any]]:
    """The evaluation records, the first (before any event) at virtual time 0."""
    return [dict(r, virtual_time=r.get("virtual_time", 0.0)) for r in res.history]


def run_async_fpfc(
    problem,
    algo_cfg: dict,
    cfg: AsyncConfig | dict | None = None,
    seed: int = 0,
    simulation: dict[str, Any] | None = None,
    algorithm: type[FPFC] = FPFC,
) -> dict[str, Any]:
    """asyncFPFC of ``algorithm``'s config (FPFC or FPFC-l1) on ``problem`` (``simulation``: further simulation
    settings); returns ``history`` (per evaluation: virtual time, events as ``round``, scores, clusters), the final
    ``server`` and ``clients``, the algorithm and the number of events."""
    cfg = AsyncConfig(**(cfg or {})) if not isinstance(cfg, AsyncConfig) else cfg
    algo = AsyncFPFC(_config(algorithm, algo_cfg), problem)
    sim_cfg = SimulationConfig(**{**(simulation or {}), "rounds": cfg.max_events or UNTIL_HORIZON, "metrics": []})
    sim = Simulation(problem, algo, sim_cfg, seed=seed, schedule=AsyncEvents(**cfg.model_dump()))
    res = sim.run()
    return {
        "history": _history(res),
        "server": res.server,
        "clients": res.clients,
        "algorithm": algo,
        "events": sim.round,
        "wall_time_s": sim.elapsed,
    }


def run_sync_fpfc_timed(
    problem,
    algo_cfg: dict,
    clients_per_round: int,
    cfg: ClockConfig | dict | None = None,
    seed: int = 0,
    eval_every_rounds: int = 5,
    simulation: dict[str, Any] | None = None,
    algorithm: type[FPFC] = FPFC,
) -> dict[str, Any]:
    """Synchronous FPFC with ``clients_per_round`` devices a round on the virtual clock of ``cfg`` (an
    :class:`AsyncConfig` serves too), run until its horizon (evaluated every ``eval_every_rounds`` rounds and at
    the end; ``simulation``: further simulation settings)."""
    given = cfg.model_dump() if isinstance(cfg, BaseModel) else dict(cfg or {})
    clock = VirtualClock(**{k: v for k, v in given.items() if k in ClockConfig.model_fields})
    c = clock.cfg
    bound = max(1, math.ceil(c.horizon / max((c.compute_time + c.delay_high) * 0.5, 1e-9)))
    algo = algorithm(algo_cfg, problem)
    sim_cfg = SimulationConfig(
        **{
            **(simulation or {}),
            "rounds": bound,
            "eval_every": eval_every_rounds,
            "metrics": [],
            "sampling": {"clients_per_round": clients_per_round},
        }
    )
    sim = Simulation(problem, algo, sim_cfg, seed=seed, schedule=clock)
    res = sim.run()
    return {"history": _history(res), "server": res.server, "algorithm": algo, "rounds": sim.round}
