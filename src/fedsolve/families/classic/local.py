"""Local: every client trains its own model alone; nothing is communicated."""

from __future__ import annotations

from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, register
from fedsolve.engine.wrappers import AttackSurface


@register
class Local(Algorithm):
    name = "local"
    description = "Local: each client trains alone from a common init, no communication"
    Config = AlgorithmConfig
    communicates = False
    attack_surface = AttackSurface(model=None)  # uploads nothing: immune to upload attacks

    def init(self, x0, rngs):
        return {}, ClientStates(self.num_clients, {"w": repeat_rows(x0, self.num_clients)})

    def broadcast(self, server, ids, round_):
        return {}

    def local_update(self, state, msg, ctx):
        c = self.cfg
        return Descend(start=state["w"], lr=c.lr, weight_decay=c.weight_decay, then=lambda w, steps: ({"w": w}, {}))

    def aggregate(self, server, ids, uploads, round_):
        return server

    def eval_model(self, state, msg):
        return state["w"]
