"""The simulation a deployment must reproduce.

``simulate_with_participation(task, participation)`` runs ``fedsolve.engine.Simulation``
with the task's config and seed, except that in round ``t`` only the clients listed in
``participation[t]`` (those whose uploads the Flower server aggregated) take part; the others
are treated as not selected (no local update, state unchanged). With full participation this
is exactly the plain simulation. The deployment runs clients one by one, so compare with the
``sequential`` executor (the ``vectorized`` one differs by float round-off, ~1e-7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedsolve.engine.algorithm import fresh
from fedsolve.engine.buffers import without_buffers
from fedsolve.engine.loop import Simulation


class ParticipationSimulation(Simulation):
    """``Simulation`` whose round ``t`` keeps only ``allowed[t]`` of the sampled clients.

    Only ``participants`` differs from ``Simulation``: clients that did not answer are not selected.
    """

    def __init__(self, *args, allowed: Mapping[int, Sequence[int]] | None = None, **kw):
        super().__init__(*args, **kw)
        self.allowed = {int(k): set(int(i) for i in v) for k, v in (allowed or {}).items()}

    def participants(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        if t not in self.allowed:
            return ids
        return torch.as_tensor([i for i in ids.tolist() if i in self.allowed[t]], dtype=torch.long)


def simulate_with_participation(
    task,
    participation: Sequence[Mapping[str, Any]] | None = None,
    executor: str = "sequential",
    threads: int | None = None,
):
    """Run the task's simulation; ``participation`` = the deployment's ``participation.json``.

    Returns ``(RunResult, simulation)``. The task's algorithm object (wrappers included) is copied so the run starts
    fresh. ``threads``: the torch threads the deployment's apps computed with (their run config's ``threads``; for
    ``threads: 0``, the experiment's ``threads`` or the machine's physical cores), since a float sum's order follows
    the thread count; the run uses them and the caller's count is restored afterwards (None: the caller's count).
    """
    algo = fresh(without_buffers(task.algorithm))  # the simulation keeps the running statistics itself
    cfg = task.simulation.model_copy(update={"executor": executor})
    allowed = None if participation is None else {int(p["round"]): p["participants"] for p in participation}
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        sim = ParticipationSimulation(task.problem, algo, cfg, task.seed, allowed=allowed)
        return sim.run(), sim
    finally:
        torch.set_num_threads(before)
