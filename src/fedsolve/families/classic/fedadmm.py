"""FedADMM: inexact consensus ADMM with one dual per client (Zhou & Li 2023; Gong et al. 2022).

Consensus form  min sum_i f_i(w_i)  s.t.  w_i = z.  Client i (selected) solves inexactly

    w_i^{t+1} ~ argmin_w  f_i(w) + <lam_i^t, w - z^t> + (rho/2)||w - z^t||^2     (local SGD)
    lam_i^{t+1} = lam_i^t + rho (w_i^{t+1} - z^t)
    upload  u_i = w_i^{t+1} + lam_i^{t+1} / rho

and the server sets z^{t+1} = mean_i u_i over ALL m clients, using the cached (stale) u_i of
clients that were not selected: it keeps their float64 running sum, and a participant uploads
u_i^{t+1} - u_i^t (formed from its own w_i, lam_i), so a round costs O(participants), not O(m).
The dual lam_i is client state keyed by client id, never shared between clients (the FL-bench
pitfall in specs/prior-art.md).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import (
    Algorithm,
    AlgorithmConfig,
    aggregation_weights,
    expand,
    register,
    shared_mask,
    stale_mean_step,
    weighted_mean,
)


class FedADMMConfig(AlgorithmConfig):
    rho: float = Field(0.1, gt=0, description="ADMM penalty rho")
    aggregate_over: Literal["all", "selected"] = Field(
        "all", description="'all': mean over all m cached uploads (inexact ADMM); 'selected': only this round's"
    )
    warm_start: Literal["server", "local"] = Field("server", description="local solve starts at z^t or at w_i^t")
    weighting: Literal["uniform", "samples"] = Field("uniform", description="server mean weights")
    shared_only: bool = Field(False, description="train only the shared block (FedAPM paper's baseline code)")


@register
class FedADMM(Algorithm):
    name = "fedadmm"
    description = "FedADMM: inexact consensus ADMM, per-client duals, server averages w_i + lam_i/rho"
    Config = FedADMMConfig
    cfg: FedADMMConfig

    def init(self, x0, rngs):
        server = {"z": x0.clone()}
        if self.cfg.aggregate_over == "all":  # S = sum_i w_i u_i over all m clients, u_i^0 = z^0
            server["usum"] = self._weights(None, x0).double().sum() * x0.double()
        clients = ClientStates(self.num_clients, defaults={"w": x0, "lam": torch.zeros_like(x0)})
        return server, clients

    def _weights(self, ids, like):
        return aggregation_weights(self, ids, like, self.cfg.weighting)

    def broadcast(self, server, ids, round_):
        return {"z": expand(server["z"], ids)}

    def local_update(self, state, msg, ctx):
        z, lam, rho = msg["z"], state["lam"], self.cfg.rho
        start = z if self.cfg.warm_start == "server" else state["w"]

        def then(w, steps):
            lam_new = lam + rho * (w - z)
            u = w + lam_new / rho
            if self.cfg.aggregate_over == "all":  # the server keeps the sum: send the change of this client's u_i
                return {"w": w, "lam": lam_new}, {"du": u - (state["w"] + lam / rho)}
            return {"w": w, "lam": lam_new}, {"u": u}

        return Descend(
            start=start,
            lr=self.cfg.lr,
            weight_decay=self.cfg.weight_decay,
            linear=lam,
            prox=rho,
            anchor=z,
            mask=shared_mask(self),
            then=then,
        )

    def aggregate(self, server, ids, uploads, round_):
        if self.cfg.aggregate_over == "all":
            du = uploads["du"]
            total = self._weights(None, server["usum"]).sum()
            usum, z = stale_mean_step(server["usum"], du, self._weights(ids, du), total)
            return {"z": z, "usum": usum}
        return {"z": weighted_mean(uploads["u"], self._weights(ids, uploads["u"]))}

    def eval_model(self, state, msg):
        return msg["z"]
