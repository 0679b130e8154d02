"""Local: every client trains its own model alone; nothing is communicated."""

from __future__ import annotations

from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, register
from fedsolve.core.linear import GDStep
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

    #: ``linear_gd``'s GDStep also states the minibatch local SGD update (``batched`` executor, core/batched_mlp.py)
    linear_gd_minibatch = True

    def supports_linear_gd(self) -> bool:
        return True

    def linear_gd(self, rows, msgs, ids, round_, full):
        return GDStep(start=rows["w"], lr=self.cfg.lr, finish=lambda w: ({"w": w}, {}))

    def aggregate(self, server, ids, uploads, round_):
        return server

    def eval_model(self, state, msg):
        return state["w"]

