"""Local: every client trains its own model alone; nothing is communicated."""

from __future__ import annotations

from fedsolve.algorithms.base import Algorithm, AlgorithmConfig, register
from fedsolve.core.linear import GDStep
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import ClientStates, repeat_rows


@register
class Local(Algorithm):
    name = "local"
    description = "Local: each client trains alone from a common init, no communication"
    Config = AlgorithmConfig
    communicates = False

    def init(self, x0, rngs):
        return {}, ClientStates(self.num_clients, {"w": repeat_rows(x0, self.num_clients)})

    def broadcast(self, server, ids, round_):
        return {}

    def local_update(self, state, msg, ctx):
        return {"w": self.local_sgd(ctx, state["w"])}, {}

    def supports_linear_gd(self) -> bool:
        return True

    def linear_gd(self, rows, msgs, ids, round_, full):
        return GDStep(start=rows["w"], lr=self.cfg.lr, finish=lambda w: ({"w": w}, {}))

    def aggregate(self, server, ids, uploads, round_):
        return server

    def eval_model(self, state, msg):
        return state["w"]

    def newcomer_models(self, server, new_problem, *, rounds=100, seed=0):
        """LOCAL: a newcomer trains alone from the common init (the simulation's, for the same seed) for
        ``rounds`` rounds of local work."""
        x0 = new_problem.init_params(RngStreams(seed).torch("init"))
        start = repeat_rows(x0, new_problem.num_clients)
        return self.train_on(new_problem, start, seed=seed, work=self.rounds_of_work(rounds))
