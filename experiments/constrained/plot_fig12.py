"""Figures 1/2 of paper 002 from one Prox-AL FL run folder (the drawing: fedsolve.families.constrained.figures,
which the compare report also uses).

Usage: python experiments/constrained/plot_fig12.py RUN_DIR [--x outer|round] [--title T] [--out fig.png]
RUN_DIR is a seed folder (metrics.jsonl and config.yaml of a proxal run); evaluate more often than an inner
loop lasts (e.g. --set simulation.eval_every=10), so that every outer iteration has a record: with --x outer
(default) the first record after outer step k stands for w^k (the output changes only at outer steps).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import yaml

from fedsolve.families.constrained.figures import default_title, outer_figure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--x", choices=["outer", "round"], default="outer")
    ap.add_argument("--title", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    run = Path(a.run_dir)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    n, kind = cfg["data"]["num_clients"], cfg["problem"]["kind"]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    title = a.title or default_title(recs[-1], n, kind, cfg["problem"]["params"]["dataset"])
    fig = outer_figure(recs, n, kind, float(cfg["problem"]["params"]["r"]), title=title, x=a.x)
    out = Path(a.out) if a.out else run / "fig12.png"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    out.write_bytes(buf.getvalue())
    print(out)


if __name__ == "__main__":
    main()
