"""PACFL (Vahidian et al. 2023): one shot before training. Each client sends the top ``n_basis`` left singular vectors
of its (per-class) data matrices; proximity(i, j) = min over basis pairs of arccos(u_a^T u_b) in degrees (the authors'
``calculating_adjacency``); agglomerative clustering that stops when the closest pair is farther than ``threshold``
(alpha: 4 synthetic, 2 MNIST); then FedAvg within each cluster. The authors' "average" linkage replaces the two merged
rows by their plain mean, which is WPGMA (scipy ``weighted``, our default ``linkage``), not UPGMA (scipy
``average``)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import AlgorithmConfig, register
from fedsolve.engine.wrappers import AttackSurface
from fedsolve.families.clustered.baselines.common import ClusterModels, local_descent


class PACFLConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    n_basis: int = Field(5, ge=1, description="left singular vectors per (class) data matrix")
    threshold: float = Field(4.0, gt=0, description="linkage cut in degrees (code: 4 synthetic, 2 MNIST)")
    linkage: Literal["weighted", "average"] = Field(
        "weighted",
        description="'weighted' (WPGMA: merged rows averaged, the PACFL/FPFC code's 'average') or "
        "'average' (UPGMA: mean over all member pairs)",
    )
    per_class: bool = Field(True, description="per-class data matrices side by side (classification; code)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="FedAvg weights within a cluster")


def pacfl_bases(data, n_basis: int, per_class: bool) -> list[np.ndarray]:
    """Each client's top-``n_basis`` left singular vectors, side by side (features x basis)."""
    out = []
    for i in range(data.num_clients):
        x, y = data.client_train(i)
        X = x.reshape(x.shape[0], -1).double().cpu().numpy()
        groups = (
            [X[(y == c).cpu().numpy()] for c in torch.unique(y).tolist()]
            if per_class and data.task == "classification"
            else [X]
        )
        us = []
        for G in groups:
            if G.shape[0] == 0:
                continue
            u, _, _ = np.linalg.svd(G.T, full_matrices=False)
            us.append(u[:, :n_basis])
        out.append(np.hstack(us))
    return out


def pacfl_proximity(bases: list[np.ndarray]) -> np.ndarray:
    """A_ij = min over basis pairs of arccos(clip(U_i^T U_j)) in degrees (authors' calculating_adjacency)."""
    m = len(bases)
    A = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            A[i, j] = A[j, i] = np.degrees(np.min(np.arccos(np.clip(bases[i].T @ bases[j], -1.0, 1.0))))
    return A


def pacfl_clusters(A: np.ndarray, threshold: float, linkage_method: str = "weighted") -> np.ndarray:
    """Flat clusters of the proximity matrix ``A``: merge the closest pair until it is farther than
    ``threshold`` (both methods are monotone, so this is the dendrogram cut at ``threshold``)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    if A.shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    Z = linkage(squareform(A, checks=False), method=linkage_method)
    return fcluster(Z, t=threshold, criterion="distance").astype(np.int64) - 1


@register
class PACFL(ClusterModels):
    name = "pacfl"
    description = "PACFL: one-shot principal-angle clustering, then FedAvg per cluster (Vahidian et al. 2023)"
    Config = PACFLConfig
    cfg: PACFLConfig
    #: the upload ``w`` is the client's model; a client that ignores the server starts from its own model
    attack_surface = AttackSurface(model="w", view="w")

    def init(self, x0, rngs):
        c = self.cfg
        bases = pacfl_bases(self.problem.data, c.n_basis, c.per_class)
        self.upload_floats = int(sum(b.size for b in bases))  # the one-shot upload
        lab = pacfl_clusters(pacfl_proximity(bases), c.threshold, c.linkage)
        m = self.num_clients
        return {"W": repeat_rows(x0, m), "cluster": torch.as_tensor(lab)}, ClientStates(m)

    def local_update(self, state, msg, ctx):
        return local_descent(self.cfg, msg["w"], lambda w, steps: ({}, {"w": w}))

    def aggregate(self, server, ids, uploads, round_):
        W, cl = server["W"].clone(), server["cluster"]
        n = self.problem.data.train_sizes.to(W.device, W.dtype)
        for c in torch.unique(cl[ids]).tolist():
            sel = cl[ids] == c
            part = ids[sel]
            wts = (
                n[part] / n[part].sum()
                if self.cfg.weighting == "samples"
                else torch.full((part.numel(),), 1.0 / part.numel())
            )
            W[cl == c] = (wts.unsqueeze(1) * uploads["w"][sel]).sum(0)
        return {"W": W, "cluster": cl}

    def report(self, server, clients, final: bool = False):
        out = super().report(server, clients, final)
        if final:
            out["one_shot_upload_floats"] = getattr(self, "upload_floats", 0)
        return out
