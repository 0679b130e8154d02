"""Figures of the FPFC suites, drawn from a suite's rows (``plot:`` in the suite YAML).

* :func:`attack_grid_figure`: the layout of Fig. 7 / E.2 / E.3: one panel per attack, the benign devices'
  accuracy against the malicious fraction, one line per method (mean, bars +- std over seeds); a cell whose
  runs all diverged is marked with an x at the bottom.
* :func:`lambda_path_figure`: Fig. 1: the slopes w_i along the lambda grid, one panel per penalty, coloured
  by true group.
* :func:`pairwise_snapshots_figure`: Fig. 3: per snapshot round the heat map of ||w_i - w_j|| (devices in the
  order of their true clusters) above a t-SNE map of the w_i coloured by true cluster (the first seed's run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedsolve.engine.io import new_figure, save_figure


def attack_grid_figure(rows: list[dict], suite, path: Path) -> None:
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    labels = list(dict.fromkeys(r["algorithm"] for r in rows))
    fig, axes = new_figure(1, len(attacks), figsize=(4.0 * len(attacks), 3.4), sharey=True, squeeze=False)
    for ax, attack in zip(axes[0], attacks):
        for i, lab in enumerate(labels):
            mine = [r for r in rows if r["attack"] == attack and r["algorithm"] == lab]
            fracs = sorted({r["fraction"] for r in mine})
            ok = [
                (f, [r["benign_accuracy"] for r in mine if r["fraction"] == f and "benign_accuracy" in r])
                for f in fracs
            ]
            pts = [(f, v) for f, v in ok if v]
            ax.errorbar(
                [f for f, _ in pts],
                [100 * np.mean(v) for _, v in pts],
                yerr=[100 * np.std(v) for _, v in pts],
                marker="o",
                ms=4,
                capsize=2,
                label=lab,
                color=f"C{i}",
            )
            lost = [f for f, v in ok if not v]
            if lost:
                ax.plot(lost, [0.0] * len(lost), "x", ms=8, color=f"C{i}")
        ax.set_title(attack.replace("_", "-"))
        ax.set_xlabel("fraction of malicious devices")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("benign devices' mean test accuracy (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(suite.name, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def lambda_path_figure(rows: list[dict], suite, path: Path) -> None:
    labels = list(dict.fromkeys(r["algorithm"] for r in rows))
    seed = rows[0]["seed"]
    fig, axes = new_figure(1, len(labels), figsize=(4.2 * len(labels), 3.6), sharey=True, squeeze=False)
    for ax, lab in zip(axes[0], labels):
        recs = sorted((r for r in rows if r["algorithm"] == lab and r["seed"] == seed), key=lambda r: r["lam"])
        lams = np.array([r["lam"] for r in recs])
        S = np.array([r["slopes"] for r in recs])
        c = np.array(recs[0]["centres"])
        for i in range(S.shape[1]):  # the true group of a device: the sign of its slope's group centre at lambda 0
            group = int(np.argmin(np.abs(S[0, i] - c)))
            ax.plot(lams, S[:, i], color="tab:blue" if group == 0 else "tab:red", lw=0.7, alpha=0.7)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_title(lab)
        ax.set_xlabel("lambda")
        ax.axhline(-1, color="grey", ls=":", lw=0.8)
        ax.axhline(1, color="grey", ls=":", lw=0.8)
    axes[0][0].set_ylabel("slope w_i (blue: first true group, red: second)")
    fig.tight_layout()
    save_figure(fig, path)


def pairwise_snapshots_figure(rows: list[dict], suite, path: Path) -> None:
    seed = rows[0]["seed"]
    snaps = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["round"])
    fig, axes = new_figure(2, len(snaps), figsize=(3.2 * len(snaps), 6.2), squeeze=False)
    for k, r in enumerate(snaps):
        truth = np.asarray(r["truth"])
        order = np.argsort(truth, kind="stable")
        D = np.asarray(r["distances"])[np.ix_(order, order)]
        im = axes[0][k].imshow(D, cmap="viridis")
        fig.colorbar(im, ax=axes[0][k], fraction=0.046)
        axes[0][k].set_title(f"round {r['round']}: {r['num_clusters']} clusters, ARI {r['ari']:.2f}", fontsize=9)
        emb = np.asarray(r["embedding"])
        for g in np.unique(truth):
            axes[1][k].scatter(emb[truth == g, 0], emb[truth == g, 1], s=10, color=f"C{int(g) % 10}")
        axes[1][k].set_title(f"t-SNE; between / within {r['ratio']:.1f}", fontsize=9)
        axes[1][k].set_xticks([])
        axes[1][k].set_yticks([])
    axes[0][0].set_ylabel("||w_i - w_j|| (devices by true cluster)")
    fig.suptitle(f"{suite.name} (seed {seed})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
