"""FedAvg (McMahan et al., 2017): local SGD from the global model, sample-size weighted average.

w_i^{t+1} = LocalSGD_i(w^t)                       (E epochs, lr eta)
w^{t+1}   = sum_{i in S_t} n_i w_i^{t+1} / sum_{i in S_t} n_i
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, Averages, expand, register, shared_mask, weighted_mean
from fedsolve.engine.wrappers import AttackSurface


class FedAvgConfig(AlgorithmConfig):
    shared_only: bool = Field(
        False,
        description="only the 'shared' block is averaged/trained when the problem "
        "defines one (FedAPM paper's baseline behaviour)",
    )


class OwnPartsConfig(FedAvgConfig):
    """FedAvg's config for a solver built on FedAvg that decides itself which parts it trains and averages (FedALA,
    FedRoD, FedCP, pFedMe): ``shared_only`` is refused rather than silently ignored."""

    @field_validator("shared_only")
    @classmethod
    def _not_shared_only(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "this solver chooses its own trained parts, so the FedAPM baselines' shared-only mode does not "
                "apply; allowed: false"
            )
        return v


@register
class FedAvg(Algorithm):
    name = "fedavg"
    description = "FedAvg: local SGD, sample-size weighted averaging (McMahan et al. 2017)"
    # FedAvg's functions read the AlgorithmConfig fields only; a subclass may bring a config of its own (Per-FedAvg)
    Config: ClassVar[type[AlgorithmConfig]] = FedAvgConfig
    cfg: AlgorithmConfig
    averages = Averages("w", "w", "model", "samples")
    #: the upload ``w`` is the client's model; a client that ignores the server starts from its own model
    attack_surface = AttackSurface(model="w", view="w")

    def init(self, x0, rngs):
        return {"w": x0.clone()}, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        return {"w": expand(server["w"], ids)}

    def prox_mu(self) -> float:
        """Coefficient of the proximal term (mu/2)||w - w^t||^2 of the local objective (0 for FedAvg)."""
        return 0.0

    def local_update(self, state, msg, ctx):
        c = self.cfg
        return Descend(
            start=msg["w"],
            lr=c.lr,
            weight_decay=c.weight_decay,
            prox=self.prox_mu(),
            anchor=msg["w"],
            mask=shared_mask(self),
            then=lambda w, steps: ({}, {"w": w}),
        )

    def aggregate(self, server, ids, uploads, round_):
        return {"w": weighted_mean(uploads["w"], self.client_weights[ids])}

    def eval_model(self, state, msg):
        return msg["w"]
