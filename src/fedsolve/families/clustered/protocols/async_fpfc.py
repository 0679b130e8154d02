"""asyncFPFC (Algorithm 3 of Yu et al., arXiv:2211.04218v3; spec fpfc.md 2.9) as an event scheduler over
``Simulation.step``, and synchronous FPFC on the same virtual clock (Fig. 8).

Every device runs eq. (5) with the zeta_i it last received; when device i_k finishes (virtual time
= start + ``compute_time`` + delay) the server updates only the pairs (i_k, j), j != i_k, and sends
zeta_{i_k} back; i_k immediately starts again. The server rule is ``algorithms.fpfc.AsyncFPFC``; here a
heap of finish times is the virtual clock and each event is one ``Simulation.step`` with the one device
whose upload arrives (nothing sleeps). Delays are U[delay_low, delay_high] seconds (paper: [0, 20] for
H&BF / synthetic, [0, 800] for MNIST / FMNIST), fixed per node (``delay_mode='fixed'``) or redrawn for every
update (``'redraw'``); the paper does not say which.

``run_sync_fpfc_timed`` is the synchronous baseline on the same clock: FPFC with ``clients_per_round``
sampled devices per round, each round lasting max over the selected devices of (compute + delay).
Both return histories of (virtual time, accuracy / RMSE, clusters, ARI).
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.families.clustered.fpfc import FPFC, AsyncFPFC, FPFCConfig
from fedsolve.core.rng import RngStreams
from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.engine.metrics import evaluate


class AsyncConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    delay_low: float = Field(0.0, ge=0, description="delay ~ U[delay_low, delay_high] virtual seconds")
    delay_high: float = Field(20.0, ge=0)
    delay_mode: Literal["fixed", "redraw"] = Field("fixed", description="one delay per node, or a new one per update")
    compute_time: float = Field(0.0, ge=0, description="virtual seconds of local computation per update")
    horizon: float = Field(1000.0, gt=0, description="stop at this virtual time")
    max_events: int | None = Field(None, ge=1, description="stop after this many server events")
    eval_every: float = Field(50.0, gt=0, description="evaluate every this many virtual seconds")


class Delays:
    """Virtual seconds a device takes per update: ``compute_time`` + its delay."""

    def __init__(self, cfg: AsyncConfig, m: int, rngs: RngStreams):
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


def record(sim: Simulation, t: float, events: int) -> dict[str, Any]:
    """The scores of the current models at virtual time ``t`` (no evaluation-time adaptation in FPFC)."""
    summary, _ = evaluate(sim.problem, sim.eval_params(events), sim.vectorized_eval, ())
    server, clients = sim.state()
    return {"virtual_time": t, "events": events, **summary, **sim.algo.diagnostics(server, clients)}


def _config(algorithm: type[FPFC], algo_cfg) -> dict:
    """``algo_cfg`` completed with ``algorithm``'s defaults (e.g. FPFC-l1's penalty) as a plain FPFC config."""
    full = algorithm.Config(**dict(algo_cfg)).model_dump()
    return {k: v for k, v in full.items() if k in FPFCConfig.model_fields}


def run_async_fpfc(problem, algo_cfg: dict, cfg: AsyncConfig | dict | None = None, seed: int = 0,
                   executor: str = "auto", algorithm: type[FPFC] = FPFC) -> dict[str, Any]:
    """Discrete-event asyncFPFC; returns ``history`` (per evaluation), final ``server`` and the algorithm."""
    cfg = AsyncConfig(**(cfg or {})) if not isinstance(cfg, AsyncConfig) else cfg
    algo = AsyncFPFC(_config(algorithm, algo_cfg), problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=cfg.max_events or 1, metrics=[], executor=executor),
                     seed=seed)
    delays = Delays(cfg, algo.num_clients, RngStreams(seed))
    heap = [(delays(i), i) for i in range(algo.num_clients)]
    heapq.heapify(heap)
    history = [record(sim, 0.0, 0)]
    next_eval = cfg.eval_every
    t = 0.0
    while heap:
        t, i = heapq.heappop(heap)
        while t >= next_eval and next_eval <= cfg.horizon:
            history.append(record(sim, next_eval, sim.round))
            next_eval += cfg.eval_every
        if t > cfg.horizon or (cfg.max_events is not None and sim.round >= cfg.max_events):
            break
        sim.step(torch.tensor([i]))           # device i's upload arrives; zeta_i goes back at once
        heapq.heappush(heap, (t + delays(i), i))
    history.append(record(sim, min(t, cfg.horizon), sim.round))
    server, clients = sim.state()
    return {"history": history, "server": server, "clients": clients, "algorithm": algo, "events": sim.round,
            "wall_time_s": sim.elapsed}


class VirtualClock:
    """Simulation callback: round time = max over the round's devices of (compute + delay)."""

    def __init__(self, cfg: AsyncConfig, m: int, seed: int):
        self.delays = Delays(cfg, m, RngStreams(seed))
        self.t = 0.0

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        self.t += max((self.delays(i) for i in info["ids"].tolist()), default=0.0)

    def on_eval(self, sim, record):
        record["virtual_time"] = self.t

    def on_end(self, sim):
        pass


def run_sync_fpfc_timed(problem, algo_cfg: dict, clients_per_round: int, cfg: AsyncConfig | dict | None = None,
                        seed: int = 0, eval_every_rounds: int = 5, executor: str = "auto",
                        algorithm: type[FPFC] = FPFC) -> dict[str, Any]:
    """Synchronous FPFC on the virtual clock, run until ``cfg.horizon`` virtual seconds."""
    cfg = AsyncConfig(**(cfg or {})) if not isinstance(cfg, AsyncConfig) else cfg
    algo = algorithm(algo_cfg, problem)
    clock = VirtualClock(cfg, problem.num_clients, seed)
    mean_round = cfg.compute_time + cfg.delay_high  # upper bound per round -> enough rounds
    rounds = max(1, int(math.ceil(cfg.horizon / max(mean_round * 0.5, 1e-9))))
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds, eval_every=eval_every_rounds, metrics=[],
                                                     executor=executor,
                                                     sampling={"clients_per_round": clients_per_round}),
                     seed=seed, callbacks=[clock])
    history = [{"round": 0, **record(sim, 0.0, 0)}]
    while clock.t < cfg.horizon and sim.round < rounds:
        sim.step()
        if sim.round % eval_every_rounds == 0:
            history.append({"round": sim.round, **record(sim, clock.t, sim.round)})
    return {"history": history, "server": sim.state()[0], "algorithm": algo, "rounds": sim.round}
