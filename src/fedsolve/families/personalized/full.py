"""Full-model personalization baselines of FedAPM's Table 4: a global model trained as FedAvg trains it, and a
personal model per client.

* **Ditto** (Li, Hu, Beirami, Smith, ICML 2021): FedAvg on the global ``w``, plus a personal ``v_i`` solving
  ``min f_i(v) + (lam/2)||v - w^t||^2`` by local SGD from its previous value;
* **pFedMe** (Dinh, Tran, Nguyen, NeurIPS 2020): per local step, ``K`` inner steps on
  ``theta ~ argmin f_i(theta) + (lam/2)||theta - w||^2`` (on that step's minibatch), then
  ``w <- w - eta lam (w - theta)``; server ``w <- (1 - beta) w + beta mean_S w_i``.

Both take FedAvg's server (``init``, ``broadcast``, ``aggregate`` and its ``averages`` declaration, so the server
optimizers and DP wrap them as they wrap FedAvg) and state their own client update.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register, shared_mask
from fedsolve.families.classic.fedavg import FedAvg, FedAvgConfig, OwnPartsConfig


class DittoConfig(FedAvgConfig):
    lam: float = Field(0.1, ge=0, description="Ditto's lambda: pull of the personal model to the global one")
    personal_epochs: float | None = Field(None, gt=0, description="epochs of the personal solve (null: local_epochs)")
    personal_lr: float | None = Field(None, gt=0, description="personal learning rate (null: lr)")
    eval_model: Literal["personal", "global"] = Field("personal", description="model each client is scored with")


@register
class Ditto(FedAvg):
    name = "ditto"
    description = "Ditto: FedAvg global model + personal models pulled to it by (lam/2)||v - w||^2 (Li 2021)"
    Config = DittoConfig
    cfg: DittoConfig

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        return server, ClientStates(self.num_clients, defaults={"v": x0})

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        pe = c.personal_epochs if c.personal_epochs is not None else c.local_epochs
        return {
            "train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size),
            "personal": Work(
                epochs=pe, steps=c.local_steps if c.personal_epochs is None else None, batch_size=c.batch_size
            ),
        }

    def local_update(self, state, msg, ctx):
        c, w_t = self.cfg, msg["w"]
        mask = shared_mask(self)
        # the global model's local solve (FedAvg's), then the personal one pulled to w^t
        w = ctx.descend(Descend(start=w_t, lr=c.lr, weight_decay=c.weight_decay, mask=mask, then=None))
        return Descend(
            start=state["v"],
            lr=c.personal_lr or c.lr,
            phase="personal",
            weight_decay=c.weight_decay,
            prox=c.lam,
            anchor=w_t,
            mask=mask,
            then=lambda v, steps: ({"v": v}, {"w": w}),
        )

    def eval_model(self, state, msg):
        return state["v"] if self.cfg.eval_model == "personal" else msg["w"]


class PFedMeConfig(OwnPartsConfig):
    lr: float = Field(0.005, gt=0, description="local step size eta for the local model w")
    personal_lr: float = Field(0.01, gt=0, description="step size of the K inner steps on theta")
    lam: float = Field(15.0, gt=0, description="Moreau-envelope coefficient lambda")
    inner_steps: int = Field(5, ge=1, description="K: inner gradient steps on theta per local step")
    beta: float = Field(1.0, gt=0, description="server mixing beta (1: plain averaging)")
    eval_model: Literal["personal", "global"] = Field("personal", description="model each client is scored with")


@register
class PFedMe(FedAvg):
    name = "pfedme"
    description = "pFedMe: Moreau-envelope personalization, K inner steps per local step (Dinh et al. 2020)"
    Config = PFedMeConfig
    cfg: PFedMeConfig

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        return server, ClientStates(self.num_clients, defaults={"theta": x0})

    def local_update(self, state, msg, ctx):
        """K inner steps on the same minibatch (as in pFedMe's code) approximate the Moreau envelope's prox point
        theta; the local model then moves toward it. Computed here: no statement describes the nested steps."""
        c = self.cfg
        w = msg["w"]
        theta = w
        for s in range(ctx.max_steps()):
            live = ctx.is_active("train", s)
            th = theta
            for _ in range(c.inner_steps):
                fval, g = ctx.loss_grad(th, "train", s)
                th = th - c.personal_lr * (g + c.weight_decay * th + c.lam * (th - w))
            ctx.record_loss(fval, live)
            theta = torch.where(live, th, theta)
            w = torch.where(live, w - c.lr * c.lam * (w - theta), w)
        return {"theta": theta}, {"w": w}

    def aggregate(self, server, ids, uploads, round_):
        w = super().aggregate(server, ids, uploads, round_)["w"]
        return {"w": (1 - self.cfg.beta) * server["w"] + self.cfg.beta * w}

    def eval_model(self, state, msg):
        return state["theta"] if self.cfg.eval_model == "personal" else msg["w"]
