"""IFCA (Ghosh et al. 2020): L cluster models (L told); each selected client scores every cluster model on its full
training set (a ``Work`` phase with ``batch_size=None``), picks the lowest loss, trains it locally and uploads it with
its one-hot choice; cluster l becomes the mean of the uploads of the clients that chose l (``normalize='assigned'``,
correct). The FPFC reference code divides the sum of updates by the number of *sampled* clients
(``normalize='sampled'``, a bug that shrinks small clusters' steps); exposed as an option to reproduce the paper's
numbers."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, register
from fedsolve.engine.wrappers import AttackSurface
from fedsolve.families.clustered.baselines.common import clustering_report, local_descent


class IFCAConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1, description="null = full-batch GD (FPFC synthetic budget)")
    num_clusters: int = Field(4, ge=1, description="L, the true number of clusters (IFCA is told it)")
    normalize: Literal["assigned", "sampled"] = Field(
        "assigned",
        description="divide the cluster update by its assigned clients (correct) or by all sampled "
        "clients (FPFC reference code)",
    )
    init: Literal["model", "normal"] = Field(
        "model", description="cluster model init: fresh model inits or N(0, init_std^2) entries"
    )
    init_std: float = Field(1.0, gt=0)


@register
class IFCA(Algorithm):
    name = "ifca"
    description = "IFCA: L cluster models, clients pick the lowest-loss one (Ghosh et al. 2020)"
    Config = IFCAConfig
    cfg: IFCAConfig
    #: the upload ``w`` is the client's model; a client that ignores the server is sent its own model as every
    #: cluster model
    attack_surface = AttackSurface(model="w", view="models")

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        return {
            "assign": Work(steps=1, batch_size=None),
            "train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size),
        }

    def init(self, x0, rngs):
        L, m = self.cfg.num_clusters, self.num_clients
        models = [x0.clone()]
        for l in range(1, L):
            g = rngs.torch("ifca_init", l)
            if self.cfg.init == "normal":
                models.append(torch.randn(x0.shape, generator=g, dtype=x0.dtype) * self.cfg.init_std)
            else:
                models.append(self.problem.init_params(g).to(x0.dtype))
        if self.cfg.init == "normal":
            models[0] = torch.randn(x0.shape, generator=rngs.torch("ifca_init", 0), dtype=x0.dtype) * self.cfg.init_std
        assign = torch.zeros(m, L, dtype=x0.dtype)
        assign[:, 0] = 1
        return {"models": torch.stack(models)}, ClientStates(m, {"assign": assign})

    def broadcast(self, server, ids, round_):
        return {"models": expand(server["models"], ids)}

    def local_update(self, state, msg, ctx):
        """IFCA's client: the cluster model with the lowest loss on its full training set (phase ``assign``),
        then local SGD from it; it keeps and uploads its one-hot choice."""
        models = msg["models"]  # [L, d]; indexed from the end, so leading axes broadcast
        L = models.shape[-2]
        losses = torch.stack([ctx.loss(models[..., l, :], "assign", 0) for l in range(L)], -1)
        onehot = torch.nn.functional.one_hot(torch.argmin(losses, -1), L).to(models.dtype)
        w0 = (onehot.unsqueeze(-1) * models).sum(-2)
        return local_descent(self.cfg, w0, lambda w, steps: ({"assign": onehot}, {"w": w, "assign": onehot}))

    def aggregate(self, server, ids, uploads, round_):
        models = server["models"].clone()
        A = uploads["assign"]  # [k, L]
        cnt = A.sum(0)  # assigned clients per cluster
        delta = A.T @ (uploads["w"] - A @ models)  # sum of updates per cluster
        den = cnt if self.cfg.normalize == "assigned" else torch.full_like(cnt, float(ids.numel()))
        upd = cnt > 0
        models[upd] = models[upd] + delta[upd] / den[upd].unsqueeze(1)
        return {"models": models}

    def eval_model(self, state, msg):
        return (state["assign"].unsqueeze(1) * msg["models"]).sum(0)

    def labels(self, clients) -> np.ndarray:
        return clients["assign"].argmax(1).cpu().numpy()

    def report(self, server, clients, final: bool = False):
        return clustering_report(self.labels(clients), self.problem, final)
