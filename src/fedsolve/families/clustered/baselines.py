"""Clustered / personalized FL baselines of the FPFC paper (spec fpfc.md 4.2, 2.15, 2.16).

* **IFCA** (Ghosh et al. 2020): L cluster models (L told); each selected client scores every cluster
  model on its full training set (a ``Work`` phase with ``batch_size=None``), picks the lowest loss,
  trains it locally and uploads it with its one-hot choice; cluster l becomes the mean of the
  uploads of the clients that chose l (``normalize='assigned'``, correct). The FPFC reference code
  divides the sum of updates by the number of *sampled* clients (``normalize='sampled'``, a bug that
  shrinks small clusters' steps); exposed as an option to reproduce the paper's numbers.
* **CFL** (Sattler et al. 2021): FedAvg inside clusters (n_i-weighted updates); a cluster with
  ||mean update|| < eps1 and max ||update_i|| > eps2, more than 2 members and round > warmup is split
  in two by complete-linkage agglomerative clustering of the members' latest updates on cosine
  distance (code: eps1 = 0.5, eps2 = 1 on synthetic; 0.05, 0.1 on MNIST).
* **PACFL** (Vahidian et al. 2023): one shot before training. Each client sends the top ``n_basis``
  left singular vectors of its (per-class) data matrices; proximity(i, j) = min over basis pairs of
  arccos(u_a^T u_b) in degrees (the authors' ``calculating_adjacency``); agglomerative clustering that
  stops when the closest pair is farther than ``threshold`` (alpha: 4 synthetic, 2 MNIST); then FedAvg
  within each cluster. The authors' "average" linkage replaces the two merged rows by their plain mean,
  which is WPGMA (scipy ``weighted``, our default ``linkage``), not UPGMA (scipy ``average``).
* **Per-FedAvg** (Fallah et al. 2020): ``variant='fo'`` first-order MAML local steps
  (w' = w - alpha g(w); w <- w - beta g(w')); ``variant='code'``: FedAvg local steps (what the FPFC
  reference code does). Evaluation: every device adapts the current global model before it is scored
  (``eval_model`` states the adaptation, ``work(None)`` plans it): one full-batch GD step of size ``alpha``, as
  Fallah et al. and the reference code's synthetic scripts do after every aggregation, or ``adapt_epochs`` epochs
  of SGD (its label-swap scripts).

LG-FedAvg lives in ``families/personalized/baselines.py``; on a one-layer model it has no lower layer to keep local,
and the FPFC reference code's "LG" is FedAvg with every device scored before the aggregation
(``lg_code``, :class:`LGCode`). The clustering methods report ``num_clusters`` and ``ari``. Each solver declares
its ``attack_surface`` (the upload key of its model, the message key an attacker ignoring the server fills with its
own model) for the ``attack`` wrapper (``byzantine.py``).

Newcomers (FPFC Sec. 6.4.2 / Table 3: "each method's own procedure"; the rules are in
``fedsolve.families.clustered.protocols.newcomers``):
IFCA, the cluster model with the lowest training loss; CFL, Sattler et al.'s parameter tree (the
newcomer walks the recorded splits from the root, moving to the side whose members' updates its own
update resembles more); PACFL, the PACFL code's unseen-client rule (one-shot clustering of all
signatures, the cluster's model, one round of local training); Per-FedAvg, the global model and its
one-step adaptation; LG (``lg_code``), the global model after one round of local training.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, register, weighted_mean
from fedsolve.engine.wrappers import AttackSurface
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.clustered.clusters import adjusted_rand


def _clustering_report(labels: np.ndarray, problem, final: bool) -> dict:
    """The clusters found: their number and ARI against the true clusters (where known); ``final``: also every
    client's label."""
    out: dict = {"clusters": labels.tolist()} if final else {}
    out["num_clusters"] = float(len(np.unique(labels)))
    if problem.data.clusters is not None:
        out["ari"] = adjusted_rand(labels, problem.data.clusters.cpu().numpy())
    return out


def _train(cfg: AlgorithmConfig, start, then) -> Descend:
    """Local SGD on the client's loss from ``start`` with the config's step size and weight decay."""
    return Descend(start=start, lr=cfg.lr, weight_decay=cfg.weight_decay, then=then)


# ====================================================================== IFCA
class IFCAConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1, description="null = full-batch GD (FPFC synthetic budget)")
    num_clusters: int = Field(4, ge=1, description="L, the true number of clusters (IFCA is told it)")
    normalize: Literal["assigned", "sampled"] = Field(
        "assigned", description="divide the cluster update by its assigned clients (correct) or by all sampled "
                                "clients (FPFC reference code)")
    init: Literal["model", "normal"] = Field("model", description="cluster model init: fresh model inits or "
                                                                  "N(0, init_std^2) entries")
    init_std: float = Field(1.0, gt=0)


@register
class IFCA(Algorithm):
    name = "ifca"
    description = "IFCA: L cluster models, clients pick the lowest-loss one (Ghosh et al. 2020)"
    Config = IFCAConfig
    #: the upload ``w`` is the client's model; a client that ignores the server is sent its own model as every
    #: cluster model
    attack_surface = AttackSurface(model="w", view="models")

    def work(self, round_: int | None = 0):
        c = self.cfg
        if round_ is None:
            return {}
        return {"assign": Work(steps=1, batch_size=None),
                "train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

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
        models = msg["models"]
        L = models.shape[0]
        losses = torch.stack([ctx.loss(models[l], "assign", 0) for l in range(L)])
        onehot = torch.nn.functional.one_hot(torch.argmin(losses), L).to(models.dtype)
        w0 = (onehot.unsqueeze(1) * models).sum(0)
        return _train(self.cfg, w0, lambda w, steps: ({"assign": onehot}, {"w": w, "assign": onehot}))

    def aggregate(self, server, ids, uploads, round_):
        models = server["models"].clone()
        A = uploads["assign"]                       # [k, L]
        cnt = A.sum(0)                              # assigned clients per cluster
        delta = A.T @ (uploads["w"] - A @ models)   # sum of updates per cluster
        den = cnt if self.cfg.normalize == "assigned" else torch.full_like(cnt, float(ids.numel()))
        upd = cnt > 0
        models[upd] = models[upd] + delta[upd] / den[upd].unsqueeze(1)
        return {"models": models}

    def eval_model(self, state, msg):
        return (state["assign"].unsqueeze(1) * msg["models"]).sum(0)

    def labels(self, clients) -> np.ndarray:
        return clients["assign"].argmax(1).cpu().numpy()

    def report(self, server, clients, final: bool = False):
        return _clustering_report(self.labels(clients), self.problem, final)


# ====================================================================== CFL
class _ClusterModels(Algorithm):
    """Shared server read-out of CFL and PACFL: server rows ``W`` (each client's cluster model) and
    ``cluster`` labels; each client is sent, and scored with, its cluster's model."""

    def broadcast(self, server, ids, round_):
        return {"w": server["W"][ids]}

    def eval_model(self, state, msg):
        return msg["w"]

    def report(self, server, clients, final: bool = False):
        return _clustering_report(server["cluster"].cpu().numpy(), self.problem, final)


class CFLConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    eps1: float = Field(0.5, ge=0, description="split when ||n_i-weighted mean update|| < eps1 ...")
    eps2: float = Field(1.0, ge=0, description="... and max_i ||update_i|| > eps2")
    warmup_rounds: int = Field(20, ge=0, description="no split before this round (code: 20)")
    min_size: int = Field(3, ge=2, description="only clusters with at least this many members split (code: > 2)")


@register
class CFL(_ClusterModels):
    name = "cfl"
    description = "CFL: FedAvg within clusters, recursive cosine bipartition (Sattler et al. 2021)"
    Config = CFLConfig
    #: uploads are model changes ``dw``; no own view is defined
    attack_surface = AttackSurface(model="dw")

    def init(self, x0, rngs):
        """Server: cluster models and labels, every client's latest update, and the parameter tree, one
        row per split: ``tree_w`` the cluster's model then, ``tree_ids`` [kept id, new id] and ``tree_dir``
        each side's mean unit-norm member update (so a newcomer's mean cosine similarity to a side is one
        dot product, and the tree costs 3 vectors per split)."""
        m, d = self.num_clients, x0.numel()
        return ({"W": repeat_rows(x0, m), "cluster": torch.zeros(m, dtype=torch.long),
                 "dW": torch.zeros(m, d, dtype=x0.dtype), "seen": torch.zeros(m, dtype=torch.bool),
                 "tree_w": torch.zeros(0, d, dtype=x0.dtype), "tree_ids": torch.zeros(0, 2, dtype=torch.long),
                 "tree_dir": torch.zeros(0, 2, d, dtype=x0.dtype)},
                ClientStates(m))

    def local_update(self, state, msg, ctx):
        return _train(self.cfg, msg["w"], lambda w, steps: ({}, {"dw": w - msg["w"]}))

    def aggregate(self, server, ids, uploads, round_):
        from sklearn.cluster import AgglomerativeClustering

        W, cl = server["W"].clone(), server["cluster"].clone()
        dW, seen = server["dW"].clone(), server["seen"].clone()
        tree = {k: [server[k]] for k in ("tree_w", "tree_ids", "tree_dir")}
        dW[ids] = uploads["dw"]
        seen[ids] = True
        n = self.problem.data.train_sizes.to(W.device, W.dtype)
        next_id = int(cl.max()) + 1
        for c in torch.unique(cl[ids]).tolist():
            part = ids[cl[ids] == c]
            wts = n[part] / n[part].sum()
            mean_upd = (wts.unsqueeze(1) * dW[part]).sum(0)
            members = torch.nonzero(cl == c).flatten()
            w_then = W[members[0]].clone()
            W[members] = w_then + mean_upd
            if round_ < self.cfg.warmup_rounds or members.numel() < self.cfg.min_size:
                continue
            max_norm = float(dW[part].norm(dim=1).max())
            if float(mean_upd.norm()) < self.cfg.eps1 and max_norm > self.cfg.eps2:
                known = members[seen[members]]
                if known.numel() < 2:
                    continue
                U = torch.nn.functional.normalize(dW[known].double(), dim=1)
                dist = (1 - U @ U.T).clamp_min(0).cpu().numpy()
                lab = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(dist).labels_
                second = known[torch.as_tensor(lab == 1)]
                if 0 < second.numel() < members.numel():
                    cl[second] = next_id
                    tree["tree_w"].append(w_then.unsqueeze(0))
                    tree["tree_ids"].append(torch.tensor([[c, next_id]]))
                    side = torch.as_tensor(lab == 1)
                    tree["tree_dir"].append(torch.stack([U[~side].mean(0), U[side].mean(0)]).unsqueeze(0).to(W.dtype))
                    next_id += 1
        return {"W": W, "cluster": cl, "dW": dW, "seen": seen, **{k: torch.cat(v) for k, v in tree.items()}}

# ====================================================================== PACFL
class PACFLConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    n_basis: int = Field(5, ge=1, description="left singular vectors per (class) data matrix")
    threshold: float = Field(4.0, gt=0, description="linkage cut in degrees (code: 4 synthetic, 2 MNIST)")
    linkage: Literal["weighted", "average"] = Field(
        "weighted", description="'weighted' (WPGMA: merged rows averaged, the PACFL/FPFC code's 'average') or "
                                "'average' (UPGMA: mean over all member pairs)")
    per_class: bool = Field(True, description="per-class data matrices side by side (classification; code)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="FedAvg weights within a cluster")


def pacfl_bases(data, n_basis: int, per_class: bool) -> list[np.ndarray]:
    """Each client's top-``n_basis`` left singular vectors, side by side (features x basis)."""
    out = []
    for i in range(data.num_clients):
        x, y = data.client_train(i)
        X = x.reshape(x.shape[0], -1).double().cpu().numpy()
        groups = [X[(y == c).cpu().numpy()] for c in torch.unique(y).tolist()] if per_class and data.task == \
            "classification" else [X]
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
class PACFL(_ClusterModels):
    name = "pacfl"
    description = "PACFL: one-shot principal-angle clustering, then FedAvg per cluster (Vahidian et al. 2023)"
    Config = PACFLConfig
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
        return _train(self.cfg, msg["w"], lambda w, steps: ({}, {"w": w}))

    def aggregate(self, server, ids, uploads, round_):
        W, cl = server["W"].clone(), server["cluster"]
        n = self.problem.data.train_sizes.to(W.device, W.dtype)
        for c in torch.unique(cl[ids]).tolist():
            sel = cl[ids] == c
            part = ids[sel]
            wts = n[part] / n[part].sum() if self.cfg.weighting == "samples" else torch.full((part.numel(),),
                                                                                           1.0 / part.numel())
            W[cl == c] = (wts.unsqueeze(1) * uploads["w"][sel]).sum(0)
        return {"W": W, "cluster": cl}

    def report(self, server, clients, final: bool = False):
        out = super().report(server, clients, final)
        if final:
            out["one_shot_upload_floats"] = getattr(self, "upload_floats", 0)
        return out

# ====================================================================== Per-FedAvg
class PerFedAvgConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0, description="beta: outer (meta) step size; FedAvg step size in variant 'code'")
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    alpha: float = Field(0.1, gt=0, description="inner / adaptation step size")
    variant: Literal["fo", "code"] = Field("fo", description="'fo': Per-FedAvg first-order MAML local steps; "
                                                             "'code': FedAvg local steps (FPFC reference code)")
    adapt_epochs: float | None = Field(None, gt=0, description="adaptation before scoring: null = one full-batch "
                                                               "GD step of size alpha; k = k epochs of SGD "
                                                               "(batch_size, step alpha), the FPFC label-swap code")
    train_from: Literal["global", "adapted"] = Field(
        "global", description="variant 'code': local training starts from the global model, or from its one-step "
                              "adaptation (the FPFC synthetic code, whose devices keep their adapted model)")

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
        keep = lambda w, steps: ({}, {"w": w})   # noqa: E731
        if c.variant == "code":
            if c.train_from == "adapted":   # the FPFC synthetic code: start from the one-step adaptation
                w = ctx.descend(Descend(start=w, lr=c.alpha, phase="start", weight_decay=c.weight_decay, then=keep))
            return _train(c, w, keep)
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
        return Descend(start=msg["w"], lr=c.alpha, phase="adapt", weight_decay=c.weight_decay,
                       then=lambda w, steps: ({}, {"w": w}))

# ---------------------------------------------------------------------- LG as the FPFC code runs it
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
    description = ("LG-FedAvg as the FPFC code runs it on one-layer models: FedAvg, devices scored before "
                   "aggregation (participants with their local model, the rest with the global one)")

    def init(self, x0, rngs):
        m = self.num_clients
        server = {"w": x0.clone(), "w_start": x0.clone(), "round": torch.tensor(-1.0)}
        return server, ClientStates(m, {"local": repeat_rows(x0, m), "last": torch.full((m,), -2.0)})

    def local_update(self, state, msg, ctx):
        last = torch.full_like(state["last"], float(ctx.round))
        return replace(super().local_update(state, msg, ctx), then=lambda w, steps: ({"local": w, "last": last},
                                                                                        {"w": w}))

    def aggregate(self, server, ids, uploads, round_):
        return {"w": weighted_mean(uploads["w"], self.client_weights[ids]), "w_start": server["w"],
                "round": torch.tensor(float(round_))}

    def broadcast(self, server, ids, round_):
        if round_ is None:   # scored with the model before the last aggregation, or the local one trained from it
            return {"w": expand(server["w_start"], ids), "round": server["round"].expand(ids.numel())}
        return super().broadcast(server, ids, round_)

    def eval_model(self, state, msg):
        return torch.where(state["last"] == msg["round"], state["local"], msg["w"])
