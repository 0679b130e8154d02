"""Fig. 3 of Yu et al. (arXiv:2211.04218v3, Sec. 6.2): FPFC's pairwise distances ||w_i - w_j|| and a t-SNE map of
the devices' models at a few rounds (the paper: rounds 0, 5, 50 and 600 on synthetic S1, lambda 0.6), the per-cell
protocol ``pairwise_snapshots`` of ``fedsolve suite``.

At each chosen round the snapshot records, for the fused block of every device's own model w_i (not its cluster's
average): the m x m distances, their mean within the true clusters and between them (and the ratio between /
within: how far apart the clusters are relative to their spread), the clusters FPFC reads off ||theta_ij|| <= nu
with their ARI, and a 2-D t-SNE embedding of the w_i (scikit-learn, seeded). The figure ``pairwise_snapshots``
draws the heat maps above the embeddings, coloured by true cluster.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.families.clustered.clusters import adjusted_rand


class SnapshotArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rounds: list[int] = Field([0, 5, 50, 600], min_length=1, description="rounds to snapshot (0: the start)")
    perplexity: float = Field(20.0, gt=0, description="t-SNE perplexity (below the number of devices)")


def distances(W: torch.Tensor) -> np.ndarray:
    """The m x m distances ||w_i - w_j|| in float64, computed pairwise (equal rows give exactly 0)."""
    Wd = W.detach().cpu().double()
    return torch.cdist(Wd, Wd, compute_mode="donot_use_mm_for_euclid_dist").numpy()


def distance_summary(W: torch.Tensor, truth: np.ndarray) -> dict[str, float]:
    """Mean ||w_i - w_j|| over the pairs i < j inside a true cluster and between two, and between / within (NaN
    while all models are equal, as at the common start)."""
    D = distances(W)
    same = truth[:, None] == truth[None, :]
    upper = np.triu(np.ones_like(same), 1)
    within = float(D[same & upper].mean()) if (same & upper).any() else float("nan")
    between = float(D[~same & upper].mean()) if (~same & upper).any() else float("nan")
    return {"within": within, "between": between, "ratio": between / within if within > 0 else float("nan")}


class Snapshots:
    """Callback: a snapshot (module docstring) after each round in ``rounds`` (0: before the first)."""

    def __init__(self, algo, rounds: list[int], perplexity: float, seed: int):
        self.algo, self.rounds, self.perplexity, self.seed = algo, set(rounds), perplexity, seed
        self.truth = algo.problem.data.clusters.numpy()
        self.rows: list[dict] = []

    def snapshot(self, sim, round_: int) -> None:
        from sklearn.manifold import TSNE

        server = sim.state()[0]
        W = self.algo.fused(server["W"]).detach().cpu()
        labels = self.algo.cluster_labels(server)
        m = W.shape[0]
        D = distances(W)
        if D.max() == 0:  # every device at the common start: one point
            emb = np.zeros((m, 2))
        else:  # exact t-SNE: m is small, and Barnes-Hut fails on near-equal points
            emb = TSNE(
                n_components=2,
                perplexity=min(self.perplexity, m - 1),
                random_state=self.seed,
                init="pca",
                method="exact",
            ).fit_transform(W.double().numpy())
        self.rows.append(
            {
                "round": round_,
                **distance_summary(W, self.truth),
                "num_clusters": int(labels.max() + 1),
                "ari": float(adjusted_rand(labels, self.truth)),
                "truth": self.truth.tolist(),
                "distances": np.round(D, 5).tolist(),
                "embedding": np.round(emb, 4).tolist(),
            }
        )

    def on_start(self, sim):
        if 0 in self.rounds and sim.round == 0:
            self.snapshot(sim, 0)

    def on_round(self, sim, round_, info):
        if round_ + 1 in self.rounds:
            self.snapshot(sim, round_ + 1)

    def on_eval(self, sim, record):
        pass

    def on_end(self, sim):
        pass


def pairwise_snapshots(ctx) -> list[dict]:
    """FPFC (the cell's algorithm) for the largest of ``rounds`` rounds; one row per snapshot round: the distances
    ||w_i - w_j||, their mean within and between the true clusters, the clusters read off theta and a t-SNE map."""
    a = ctx.args
    problem = ctx.problem()
    algo = ctx.algorithm(problem)
    if not hasattr(algo, "cluster_labels"):
        raise ValueError(
            f"algorithms: pairwise_snapshots reads FPFC's pairwise state; {ctx.spec.name} has none; "
            f"allowed: fpfc, fpfc_l1"
        )
    cb = Snapshots(algo, a.rounds, a.perplexity, ctx.seed)
    ctx.run(problem, algo, max(max(a.rounds), 1), callbacks=[cb])
    return sorted(cb.rows, key=lambda r: r["round"])
