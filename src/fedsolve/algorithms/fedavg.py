"""FedAvg (McMahan et al., 2017): local SGD from the global model, sample-size weighted average.

    w_i^{t+1} = LocalSGD_i(w^t)                       (E epochs, lr eta)
    w^{t+1}   = sum_{i in S_t} n_i w_i^{t+1} / sum_{i in S_t} n_i
"""

from __future__ import annotations

from pydantic import Field

from fedsolve.algorithms.base import Algorithm, AlgorithmConfig, register
from fedsolve.core.states import ClientStates


class FedAvgConfig(AlgorithmConfig):
    shared_only: bool = Field(False, description="only the 'shared' block is averaged/trained when the problem "
                                                 "defines one (FedAPM paper's baseline behaviour)")


@register
class FedAvg(Algorithm):
    name = "fedavg"
    description = "FedAvg: local SGD, sample-size weighted averaging (McMahan et al. 2017)"
    Config = FedAvgConfig

    def init(self, x0, rngs):
        return {"w": x0.clone()}, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        return {"w": self.expand(server["w"], ids)}

    def prox_term(self, msg):
        """Extra gradient term of the local objective (none for FedAvg)."""
        return None

    def local_update(self, state, msg, ctx):
        w = self.local_sgd(ctx, msg["w"], extra=self.prox_term(msg))
        return {}, {"w": w}

    def aggregate(self, server, ids, uploads, round_):
        return {"w": self.weighted_mean(uploads["w"], ids)}

    def eval_broadcast(self, server, ids):
        return {"w": self.expand(server["w"], ids)}

    def eval_model(self, state, msg):
        return msg["w"]
