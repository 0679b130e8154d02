"""CFL (Sattler et al. 2021): FedAvg inside clusters (n_i-weighted updates); a cluster with ||mean update|| < eps1 and
max ||update_i|| > eps2, more than 2 members and round > warmup is split in two by complete-linkage agglomerative
clustering of the members' latest updates on cosine distance (code: eps1 = 0.5, eps2 = 1 on synthetic; 0.05, 0.1 on
MNIST). The server records every split (the parameter tree newcomers walk)."""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.algorithm import AlgorithmConfig, register
from fedsolve.engine.wrappers import AttackSurface
from fedsolve.families.clustered.baselines.common import ClusterModels, local_descent


class CFLConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0)
    local_epochs: float | None = Field(10.0, gt=0)
    batch_size: int | None = Field(None, ge=1)
    eps1: float = Field(0.5, ge=0, description="split when ||n_i-weighted mean update|| < eps1 ...")
    eps2: float = Field(1.0, ge=0, description="... and max_i ||update_i|| > eps2")
    warmup_rounds: int = Field(20, ge=0, description="no split before this round (code: 20)")
    min_size: int = Field(3, ge=2, description="only clusters with at least this many members split (code: > 2)")


@register
class CFL(ClusterModels):
    name = "cfl"
    description = "CFL: FedAvg within clusters, recursive cosine bipartition (Sattler et al. 2021)"
    Config = CFLConfig
    cfg: CFLConfig
    #: uploads are model changes ``dw``; no own view is defined
    attack_surface = AttackSurface(model="dw")

    def init(self, x0, rngs):
        """Server: cluster models and labels, every client's latest update, and the parameter tree, one
        row per split: ``tree_w`` the cluster's model then, ``tree_ids`` [kept id, new id] and ``tree_dir``
        each side's mean unit-norm member update (so a newcomer's mean cosine similarity to a side is one
        dot product, and the tree costs 3 vectors per split)."""
        m, d = self.num_clients, x0.numel()
        return (
            {
                "W": repeat_rows(x0, m),
                "cluster": torch.zeros(m, dtype=torch.long),
                "dW": torch.zeros(m, d, dtype=x0.dtype),
                "seen": torch.zeros(m, dtype=torch.bool),
                "tree_w": torch.zeros(0, d, dtype=x0.dtype),
                "tree_ids": torch.zeros(0, 2, dtype=torch.long),
                "tree_dir": torch.zeros(0, 2, d, dtype=x0.dtype),
            },
            ClientStates(m),
        )

    def local_update(self, state, msg, ctx):
        return local_descent(self.cfg, msg["w"], lambda w, steps: ({}, {"dw": w - msg["w"]}))

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
