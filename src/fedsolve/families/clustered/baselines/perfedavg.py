"""Per-FedAvg (Fallah et al. 2020) and LG as the FPFC reference code runs it.

Per-FedAvg: ``variant='fo'`` first-order MAML local steps (w' = w - alpha g(w); w <- w - beta g(w'));
``variant='code'``: FedAvg local steps (what the FPFC reference code does). Evaluation: every device adapts the
current global model before it is scored (``eval_model`` states the adaptation, ``work(None)`` plans it): one
full-batch GD step of size ``alpha``, as Fallah et al. and the reference code's synthetic scripts do after every
aggregation, or ``adapt_epochs`` epochs of SGD (its label-swap scripts).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field, model_validator

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend, Then
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import AlgorithmConfig, expand, register, weighted_mean
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.clustered.baselines.common import local_descent


class PerFedAvgConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0, description="beta: outer (meta) step size; FedAvg step size in variant 'code'")
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    alpha: float = Field(0.1, gt=0, description="inner / adaptation step size")
    variant: Literal["fo", "code"] = Field(
        "fo",
        description="'fo': Per-FedAvg first-order MAML local steps; 'code': FedAvg local steps (FPFC reference code)",
    )
    adapt_epochs: float | None = Field(
        None,
        gt=0,
        description="adaptation before scoring: null = one full-batch "
        "GD step of size alpha; k = k epochs of SGD "
        "(batch_size, step alpha), the FPFC label-swap code",
    )
    train_from: Literal["global", "adapted"] = Field(
        "global",
        description="variant 'code': local training starts from the global model, or from its one-step "
        "adaptation (the FPFC synthetic code, whose devices keep their adapted model)",
    )

    @model_validator(mode="after")
    def _check(self):
        if self.train_from == "adapted" and self.variant != "code":
            raise ValueError("train_from: 'adapted' applies to variant 'code' only (allowed with 'fo': 'global')")
        return self


@register
class PerFedAvg(FedAvg):
    """Per-FedAvg: FedAvg's server, MAML-style (``fo``) or plain (``code``) local steps; every device is
    scored with the current global model after its own adaptation (:meth:`eval_model`)."""

    name = "perfedavg"
    description = "Per-FedAvg (FO): MAML-style local steps, personalized by one local GD step (Fallah et al. 2020)"
    Config = PerFedAvgConfig
    cfg: PerFedAvgConfig

    def work(self, round_: int | None = 0):
        """The round's local work; ``round_=None``: the adaptation before scoring, one full-batch GD step of size
        alpha (Fallah et al.; the FPFC code on synthetic data, every device after every aggregation), or
        ``adapt_epochs`` epochs of SGD (the FPFC label-swap code)."""
        c = self.cfg
        if round_ is None:
            if c.adapt_epochs is None:
                return {"adapt": Work(steps=1, batch_size=None)}
            return {"adapt": Work(epochs=c.adapt_epochs, batch_size=c.batch_size)}
        phases = super().work(round_)
        if c.train_from == "adapted":
            phases["start"] = Work(steps=1, batch_size=None)
        return phases

    def local_update(self, state, msg, ctx):
        c = self.cfg
        w = msg["w"]
        keep: Then = lambda w, steps: ({}, {"w": w})
        if c.variant == "code":
            if c.train_from == "adapted":  # the FPFC synthetic code: start from the one-step adaptation
                w = ctx.descend(Descend(start=w, lr=c.alpha, phase="start", weight_decay=c.weight_decay, then=keep))
            return local_descent(c, w, keep)
        for s in range(ctx.max_steps("train")):
            _, g = ctx.loss_grad(w, "train", s)
            tmp = w - c.alpha * g
            fval, g2 = ctx.loss_grad(tmp, "train", s)
            live = ctx.is_active("train", s)
            ctx.record_loss(fval, live)
            w = torch.where(live, w - c.lr * g2, w)
        return {}, {"w": w}

    def eval_model(self, state, msg):
        """The adaptation each device runs from the global model right before it is scored (phase ``adapt`` of
        ``work(None)``), at step size alpha."""
        c = self.cfg
        return Descend(
            start=msg["w"], lr=c.alpha, phase="adapt", weight_decay=c.weight_decay, then=lambda w, steps: ({}, {"w": w})
        )


@register
class LGCode(FedAvg):
    """LG-FedAvg as the FPFC reference code runs it on one-layer models (spec 2.16 item 5), where
    LG-FedAvg proper (Liang et al. 2020: local lower layers, global head) has no lower layer to keep.

    Training is FedAvg. Each device is scored *before* the round's aggregation: a device that took part
    in the last round with the model it just trained locally from w^t, every other device with w^t
    itself. This is the number behind the paper's LG rows of Tables 1 and E.1-E.4 (``Synthetic/
    FLAlgorithms/LG.py`` evaluates, then averages). A newcomer gets w^K fine-tuned by one round of local
    work (the paper's rule for LG, spec 3.2).
    """

    name = "lg_code"
    description = (
        "LG-FedAvg as the FPFC code runs it on one-layer models: FedAvg, devices scored before "
        "aggregation (participants with their local model, the rest with the global one)"
    )

    def init(self, x0, rngs):
        m = self.num_clients
        server = {"w": x0.clone(), "w_start": x0.clone(), "round": torch.tensor(-1.0)}
        return server, ClientStates(m, {"local": repeat_rows(x0, m), "last": torch.full((m,), -2.0)})

    def local_update(self, state, msg, ctx):
        last = torch.full_like(state["last"], float(ctx.round))
        return replace(
            super().local_update(state, msg, ctx), then=lambda w, steps: ({"local": w, "last": last}, {"w": w})
        )

    def aggregate(self, server, ids, uploads, round_):
        return {
            "w": weighted_mean(uploads["w"], self.client_weights[ids]),
            "w_start": server["w"],
            "round": torch.tensor(float(round_)),
        }

    def broadcast(self, server, ids, round_):
        if round_ is None:  # scored with the model before the last aggregation, or the local one trained from it
            return {"w": expand(server["w_start"], ids), "round": server["round"].expand(ids.numel())}
        return super().broadcast(server, ids, round_)

    def eval_model(self, state, msg):
        return torch.where(state["last"] == msg["round"], state["local"], msg["w"])
