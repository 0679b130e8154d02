"""Partial-model personalization baselines (Pillutla, Malik, Mohamed, Rabbat, Sanjabi, Xiao. "Federated Learning
with Partial Model Personalization", ICML 2022), on the shared machinery of ``partial.py``:

* **FedAlt** (Gauss-Seidel): ``v_i^{t+1} = LocalSGD_v f_i(., u^t)`` from ``v_i^t``, then
  ``u_i^{t+1} = LocalSGD_u f_i(v_i^{t+1}, .)`` from ``u^t``; server ``u^{t+1} = sum_S w_i u_i^{t+1}``.
* **FedSim** (Jacobi): joint SGD steps on ``(v_i, u_i)`` from ``(v_i^t, u^t)`` on the same minibatches.

Configurations of those two (not copies):

* **FedPer** (Arivazhagan et al. 2019) = FedSim with output (head) personalization;
* **LG-FedAvg** (Liang et al. 2020) = FedSim with input (lower-layer) personalization;
* **FedRep** (Collins et al. 2021) = FedAlt with output personalization, many head epochs (10)
  and one body epoch.

The full-model personalization baselines of FedAPM's Table 4 (Ditto, pFedMe) are in ``full.py``; both are
importable from here too.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.engine.algorithm import register
from fedsolve.families.personalized.full import Ditto, DittoConfig, PFedMe, PFedMeConfig
from fedsolve.families.personalized.partial import (
    BaselineConfig,
    PartialAlgorithm,
    PartialConfig,
    Personalization,
    drift,
)

__all__ = [
    "BaselineConfig",
    "Ditto",
    "DittoConfig",
    "FedAlt",
    "FedPer",
    "FedRep",
    "FedRepConfig",
    "FedSim",
    "LGFedAvg",
    "PFedMe",
    "PFedMeConfig",
    "PartialAlgorithm",
    "PartialConfig",
    "Personalization",
]


@register
class FedAlt(PartialAlgorithm):
    name = "fedalt"
    description = "FedAlt: alternating personal-then-shared local SGD, average shared block (Pillutla 2022)"

    def local_update(self, state, msg, ctx):
        u_t = msg["u"]
        v = state["v"]
        if self.d_v:
            v = ctx.descend(self.block_descent(ctx, "v", v, u_t))

        def then(u, steps):
            new = {"v": v, "u": u, "drift": drift(u, u_t)}
            return new, self.upload(state, new)

        return self.block_descent(ctx, "u", u_t, v, then=then)


@register
class FedSim(PartialAlgorithm):
    name = "fedsim"
    description = "FedSim: simultaneous local SGD on personal and shared blocks (Pillutla et al. 2022)"

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def local_update(self, state, msg, ctx):
        u_t, c = msg["u"], self.cfg
        lr = c.lr if c.personal_lr is None else torch.where(self.pmask, c.personal_lr, c.lr)

        def then(full, steps):
            v, u = self.split(full)
            new = {"v": v, "u": u, "drift": drift(u, u_t)}
            return new, self.upload(state, new)

        return Descend(
            start=self.join(state["v"], u_t), lr=lr, scale=self.alpha(ctx), weight_decay=c.weight_decay, then=then
        )


class _OutputConfig(BaselineConfig):
    personalization: Personalization = "output"


class _InputConfig(BaselineConfig):
    personalization: Personalization = "input"


class FedRepConfig(BaselineConfig):
    personalization: Personalization = "output"
    personal_epochs: float | None = Field(10.0, gt=0, description="head epochs (FedRep: many)")
    local_epochs: float | None = Field(1.0, gt=0, description="body epochs")


@register
class FedPer(FedSim):
    name = "fedper"
    description = "FedPer: FedSim with a personal head (output personalization; Arivazhagan et al. 2019)"
    Config = _OutputConfig
    cfg: _OutputConfig


@register
class LGFedAvg(FedSim):
    name = "lgfedavg"
    description = "LG-FedAvg: FedSim with personal lower layers (input personalization; Liang et al. 2020)"
    Config = _InputConfig
    cfg: _InputConfig


@register
class FedRep(FedAlt):
    name = "fedrep"
    description = "FedRep: FedAlt with a personal head, many head epochs then body epochs (Collins et al. 2021)"
    Config = FedRepConfig
    cfg: FedRepConfig
