"""Transports: how the selected clients' work reaches them, under THE round body of ``engine/loop.py``.

The round body (sampling, broadcast, aggregation, the communication ledger, the checks) and the evaluator (one
summary of the per-client metrics, the algorithm's report, the schedule's numbers) are the engine's, whatever
runs the clients. A transport does only the clients' part:

* ``participants(sim, t, ids)``: the sampled clients that can take part in round ``t`` (a deployment drops the
  clients without a live node);
* ``train(sim, t, ids, msgs, scale)`` -> ``(answered, uploads, losses)``: the clients' local updates of round
  ``t``; ``answered`` holds the positions in ``ids`` of the clients whose uploads arrived (None: all of them),
  ``uploads`` their stacked records and ``losses`` their train losses;
* ``score(sim, round_)`` -> ``(per-client metrics, extra record fields)``: every reachable client scored on its
  test split.

:class:`InProcess` (this module) runs the clients in this process on an executor (``core/executor.py``) over the
client states the simulation holds; the Flower grid (``fedsolve.flower.server.GridTransport``) sends the same
messages to SuperNodes, which hold their client's state and data.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedsolve.core.plans import build_plans
from fedsolve.core.statements import Solved, stated
from fedsolve.engine.metrics import evaluate

Record = dict[str, Tensor]


class Transport:
    """Base: every sampled client takes part (subclasses implement ``train`` and ``score``)."""

    #: True when the clients' states live in the simulation (``sim.clients``); a deployment keeps them on the nodes
    holds_clients = True
    name = "transport"

    def start(self, sim) -> None:
        """Once, when the run starts (e.g. wait for the nodes)."""

    def participants(self, sim, t: int, ids: Tensor) -> Tensor:
        return ids

    def train(
        self, sim, t: int, ids: Tensor, msgs: Record, scale: Tensor | None
    ) -> tuple[Tensor | None, Record, Tensor]:
        raise NotImplementedError

    def score(self, sim, round_: int) -> tuple[list[dict[str, float]], dict[str, Any]]:
        raise NotImplementedError


class InProcess(Transport):
    """The clients in this process: their rows gathered from ``sim.clients``, updated by ``sim.executor`` with the
    minibatch plans the engine draws, scattered back."""

    name = "in-process"

    def train(self, sim, t, ids, msgs, scale):
        algo, data = sim.algo, sim.problem.data
        rows = sim.clients.gather(ids)
        stmt = stated(algo, rows, msgs, t)
        if isinstance(stmt, Solved):  # closed form from the rows: no minibatch plan, no executor
            sim.clients.scatter(ids, stmt.rows)
            return None, stmt.upload, torch.zeros(ids.numel(), dtype=torch.float32)
        plans = build_plans(algo.work(t), data.train_offsets, ids.cpu(), sim.rngs, t, scale, data.row_groups)
        new_rows, uploads, losses = sim.executor.run(algo, rows, msgs, ids, plans, data, t)
        sim.clients.scatter(ids, new_rows)
        return None, uploads, losses

    def score(self, sim, round_):
        params = sim.eval_params(round_)
        _, per = evaluate(sim.problem, params, sim.vectorized_eval, tuple(sim.cfg.metrics), buffers=sim.eval_buffers())
        return per, {}
