"""The simulation a deployment must reproduce.

``simulate_with_participation(task, participation)`` runs ``fedsolve.simulation.Simulation``
with the task's config and seed, except that in round ``t`` only the clients listed in
``participation[t]`` (those whose uploads the Flower server aggregated) take part; the others
are treated as not selected (no local update, state unchanged). With full participation this
is exactly the plain simulation. The deployment runs clients one by one, so compare with the
``sequential`` executor (the ``vectorized`` one differs by float round-off, ~1e-7).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from fedsolve.core.executor import build_plans
from fedsolve.simulation.loop import Simulation
from fedsolve.simulation.sampling import sample_clients


class ParticipationSimulation(Simulation):
    """``Simulation`` whose round ``t`` keeps only ``allowed[t]`` of the sampled clients.

    ``run_round`` below is ``Simulation.run_round`` with one added line (the intersection).
    """

    def __init__(self, *args, allowed: Mapping[int, Sequence[int]] | None = None, **kw):
        super().__init__(*args, **kw)
        self.allowed = {int(k): set(int(i) for i in v) for k, v in (allowed or {}).items()}

    def run_round(self, t: int) -> dict[str, Any]:
        m = self.problem.num_clients
        data = self.problem.data
        ids = sample_clients(self.cfg.sampling, m, data.weights, self.rngs.numpy("sampling", t))
        if t in self.allowed:  # the only change: clients that did not answer are not selected
            ids = torch.as_tensor([i for i in ids.tolist() if i in self.allowed[t]], dtype=torch.long)
        if ids.numel() == 0:
            return {"round": t, "clients": 0, "train_loss": float("nan"), "ids": ids}
        scale = None
        if self.cfg.work.variable == "uniform":
            g = self.rngs.numpy("work", t)
            scale = torch.as_tensor(g.uniform(self.cfg.work.min_fraction, 1.0, size=m))[ids]
        msgs = self.algo.broadcast(self.server, ids, t)
        plans = build_plans(self.algo.work(), data.train_offsets, ids, self.rngs, t, scale)
        rows = self.clients.gather(ids)
        new_rows, uploads, losses = self.executor.run(self.algo, rows, msgs, ids, plans, data)
        self.clients.scatter(ids, new_rows)
        self.server = self.algo.aggregate(self.server, ids, uploads, t)
        if self.algo.communicates:
            self.ledger.add_round(t, msgs, uploads)
        w = data.weights[ids].double()
        train_loss = float((losses.double() * w).sum() / w.sum())
        self._check(t, train_loss, uploads)
        return {"round": t, "clients": int(ids.numel()), "train_loss": train_loss, "ids": ids}


def simulate_with_participation(task, participation: Sequence[Mapping[str, Any]] | None = None,
                                executor: str = "sequential"):
    """Run the task's simulation; ``participation`` = the deployment's ``participation.json``.

    Returns ``(RunResult, simulation)``. The task's algorithm object is re-created from its class
    and config so the run starts fresh.
    """
    algo = type(task.algorithm)(task.algorithm.cfg, task.problem)
    cfg = task.simulation.model_copy(update={"executor": executor})
    allowed = None if participation is None else {int(p["round"]): p["participants"] for p in participation}
    sim = ParticipationSimulation(task.problem, algo, cfg, task.seed, allowed=allowed)
    return sim.run(), sim
