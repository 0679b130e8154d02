"""Figures 1/2 of paper 002 from a Prox-AL FL run's metrics.jsonl: per outer iteration k, the clients' local
objective (mean with the min-max band over clients) and their constraint (mean with the band), the server's
constraint (Figure 2, dash-dot) and the threshold (dashed).

Usage: python experiments/constrained/plot_fig12.py RUN_DIR [--x outer|round] [--out fig.png]
RUN_DIR is a seed folder (metrics.jsonl and config.yaml of a proxal run); evaluate more often than an inner
loop lasts (e.g. --set simulation.eval_every=10), so that every outer iteration has a record: with --x outer
(default) the first record after outer step k stands for w^k (the output changes only at outer steps).

Plotted quantities (the paper's, without the 1/n of f_i = L_i / n): objective = the client's own loss L_i =
n f_i. Neyman-Pearson (Eq. 30): class-1 loss = c_i + r against the threshold r. Fairness (Eq. 32): the
signed disparity D = L_female - L_male of each party, from the two constraints D - r <= 0 and -D - r <= 0
(client mean = c_mean[first] + r, max = c_max[first] + r, min = -(c_max[second] + r)), against +-r.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def per_outer(recs: list[dict]) -> list[dict]:
    """The first record of every outer iteration k (w^k), in order."""
    seen, out = set(), []
    for r in recs:
        k = r.get("outer_iterations", 0)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--x", choices=["outer", "round"], default="outer")
    ap.add_argument("--title", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(a.run_dir)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    n, kind = cfg["data"]["num_clients"], cfg["problem"]["kind"]
    r = float(cfg["problem"]["params"]["r"])
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = recs[-1]  # the run's end, for the title (per_outer keeps the first record of the last k)
    if a.x == "outer":
        recs = per_outer(recs)
        x = [rec.get("outer_iterations", 0) for rec in recs]
        xlabel = "outer iteration k"
    else:
        x = [rec["round"] for rec in recs]
        xlabel = "communication round"
    last = recs[-1]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax0.plot(x, [n * rec["objective_client_mean"] for rec in recs], "o-", color="tab:blue", ms=3,
             label="local objective L_i (mean)")
    if "objective_client_min" in last:
        lo, hi, band = ([n * rec["objective_client_min"] for rec in recs],
                        [n * rec["objective_client_max"] for rec in recs], "min-max over clients")
    else:  # runs recorded before the min/max read-outs existed
        lo, hi, band = ([n * (rec["objective_client_mean"] - rec["objective_client_std"]) for rec in recs],
                        [n * (rec["objective_client_mean"] + rec["objective_client_std"]) for rec in recs],
                        "mean +- std over clients")
    ax0.fill_between(x, lo, hi, color="tab:blue", alpha=0.2, label=band)
    ax0.set_xlabel(xlabel)
    ax0.set_ylabel("loss")
    ax0.legend(fontsize=7)
    names = sorted(k[len("c_client_mean["):-1] for k in last if k.startswith("c_client_mean["))
    if kind == "fairness":
        first, second = names[0], names[1]  # 'L_female - L_male - r', 'L_male - L_female - r'
        mean = [rec[f"c_client_mean[{first}]"] + r for rec in recs]
        lo = [-(rec[f"c_client_max[{second}]"] + r) for rec in recs]
        hi = [rec[f"c_client_max[{first}]"] + r for rec in recs]
        label = "L_female - L_male"
        ax1.plot(x, mean, "o-", color="tab:brown", ms=3, label=f"clients' {label} (mean)")
        ax1.fill_between(x, lo, hi, color="tab:brown", alpha=0.2, label="min-max over clients")
        if f"c_server[{first}]" in last:
            ax1.plot(x, [rec[f"c_server[{first}]"] + r for rec in recs], "-.", color="tab:blue",
                     label=f"server's {label}")
        for t in (r, -r):
            ax1.axhline(t, color="black", ls="--", lw=1)
        ax1.set_ylabel(f"loss disparity (threshold +-{r})")
    else:
        for name in names:
            ax1.plot(x, [rec[f"c_client_mean[{name}]"] + r for rec in recs], "o-", color="tab:brown", ms=3,
                     label=f"{name.replace(' - r', '')} (mean)")
            ax1.fill_between(x, [rec[f"c_client_min[{name}]"] + r for rec in recs],
                             [rec[f"c_client_max[{name}]"] + r for rec in recs], color="tab:brown", alpha=0.2,
                             label="min-max over clients")
        for key in sorted(k for k in last if k.startswith("c_server[")):
            ax1.plot(x, [rec[key] + r for rec in recs], "-.", color="tab:blue", label=f"server {key[9:-1]} + r")
        ax1.axhline(r, color="black", ls="--", lw=1, label=f"threshold {r}")
        ax1.set_yscale("log")
        ax1.set_ylabel("constraint loss")
    ax1.set_xlabel(xlabel)
    ax1.legend(fontsize=7)
    title = (f"{cfg['problem']['params']['dataset']}, {kind}, n = {n}: {final.get('outer_iterations', '?')} outer "
             f"iterations, {final.get('admm_rounds', '?')} ADMM rounds, "
             + ("Eq. 11 passed" if final.get("converged") else "Eq. 11 not passed (budget ended)"))
    fig.suptitle(a.title or title, fontsize=9)
    out = Path(a.out) if a.out else run / "fig12.png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
