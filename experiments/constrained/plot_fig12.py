"""Figures 1/2 of paper 002 from a run's metrics.jsonl: per-client objective and constraint values along the
run (mean with the min-max band over clients), the server's constraint, and the threshold line.

Usage: python experiments/constrained/plot_fig12.py RUN_DIR [--threshold 0.2] [--out fig.png]
(RUN_DIR holds metrics.jsonl of a proxal run; evaluate often, e.g. --set simulation.eval_every=25.)
The constraint values are plotted as c + threshold, i.e. the loss itself for Eqs. 30/32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--threshold", type=float, default=0.2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in (Path(a.run_dir) / "metrics.jsonl").read_text().splitlines()]
    x = [r["round"] for r in recs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [r["objective_client_mean"] for r in recs], color="tab:blue", label="objective f_i (mean, min-max band)")
    ax.fill_between(x, [r["objective_client_min"] for r in recs], [r["objective_client_max"] for r in recs],
                    color="tab:blue", alpha=0.2)
    for key in sorted(k for k in recs[-1] if k.startswith("c_client_mean[")):
        name = key[len("c_client_mean["):-1]
        ax.plot(x, [r[key] + a.threshold for r in recs], color="tab:brown", label=f"{name.replace(' - r', '')} (mean, min-max band)")
        ax.fill_between(x, [r[f"c_client_min[{name}]"] + a.threshold for r in recs],
                        [r[f"c_client_max[{name}]"] + a.threshold for r in recs], color="tab:brown", alpha=0.2)
    for key in sorted(k for k in recs[-1] if k.startswith("c_server[")):
        ax.plot(x, [r[key] + a.threshold for r in recs], "-.", color="tab:blue", label=f"server {key[9:-1]} + r")
    ax.axhline(a.threshold, color="black", ls="--", label=f"threshold {a.threshold}")
    ax.set_xlabel("communication round (outer iterations: "
                  f"{recs[-1].get('outer_iterations', '?')}, ADMM rounds: {recs[-1].get('admm_rounds', '?')})")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    out = Path(a.out) if a.out else Path(a.run_dir) / "fig12.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
