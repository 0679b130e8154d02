"""What the clustering baselines share: the read-out of the clusters found, the plain local descent, and the server
read-out of CFL and PACFL (one model per cluster)."""

from __future__ import annotations

import numpy as np

from fedsolve.core.statements import Descend
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig
from fedsolve.families.clustered.clusters import adjusted_rand


def clustering_report(labels: np.ndarray, problem, final: bool) -> dict:
    """The clusters found: their number and ARI against the true clusters (where known); ``final``: also every
    client's label."""
    out: dict = {"clusters": labels.tolist()} if final else {}
    out["num_clusters"] = float(len(np.unique(labels)))
    if problem.data.clusters is not None:
        out["ari"] = adjusted_rand(labels, problem.data.clusters.cpu().numpy())
    return out


def local_descent(cfg: AlgorithmConfig, start, then) -> Descend:
    """Local SGD on the client's loss from ``start`` with the config's step size and weight decay."""
    return Descend(start=start, lr=cfg.lr, weight_decay=cfg.weight_decay, then=then)


class ClusterModels(Algorithm):
    """Shared server read-out of CFL and PACFL: server rows ``W`` (each client's cluster model) and
    ``cluster`` labels; each client is sent, and scored with, its cluster's model."""

    def broadcast(self, server, ids, round_):
        return {"w": server["W"][ids]}

    def eval_model(self, state, msg):
        return msg["w"]

    def report(self, server, clients, final: bool = False):
        return clustering_report(server["cluster"].cpu().numpy(), self.problem, final)
