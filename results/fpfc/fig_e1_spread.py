"""Fig. E.1 (spread over initializations on one data set) as numbers, from compare folders of one method.

Usage: python results/fpfc/fig_e1_spread.py NAME=FOLDER[,FOLDER...] ...

Each NAME pools the runs ``<FOLDER>/<label>/seed<k>/summary.json`` of its folders (one data set, each seed a new
initialization and participation draw) and prints: the number of runs, final test accuracy (%) min-max, median,
mean and sample SD, how many runs found each number of clusters, and the ARI values with their counts.
Examples: results/fpfc/fig_e1_ifca/seeds_a,results/fpfc/fig_e1_ifca/seeds_b (IFCA at L = 4 on S1);
results/fpfc/fig_e1_tuned/s1_ifca_L8 (IFCA at its validation pick).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path


def finals(folders: list[Path]) -> list[dict]:
    """The final metrics of every run under ``folders`` (seeds pooled; a seed twice is an error)."""
    out: dict[tuple[str, int], dict] = {}
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"error: {folder}: no such folder")
        for p in sorted(folder.glob("*/seed*/summary.json")):
            s = json.loads(p.read_text())
            key = (s["label"], int(s["seed"]))
            if key in out:
                raise SystemExit(f"error: {p}: {key} appears twice among the folders")
            out[key] = s["metrics"]["final"]
    if not out:
        raise SystemExit(f"error: no run under {', '.join(map(str, folders))}")
    return [out[k] for k in sorted(out)]


def spread(runs: list[dict]) -> str:
    acc = [100 * r["test_accuracy"] for r in runs]
    sd = f"{statistics.stdev(acc):.2f}" if len(acc) > 1 else "-"
    clusters = Counter(int(r["num_clusters"]) for r in runs)
    ari = Counter(round(r["ari"], 3) for r in runs)
    return (f"n = {len(acc)}; test accuracy {min(acc):.2f}-{max(acc):.2f}%, median {statistics.median(acc):.2f}, "
            f"mean {statistics.fmean(acc):.2f}, sample SD {sd}; clusters "
            + ", ".join(f"{k}: {v} runs" for k, v in sorted(clusters.items()))
            + "; ARI " + ", ".join(f"{k:.3f}: {v}" for k, v in sorted(ari.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="+", help="NAME=FOLDER[,FOLDER...]")
    for g in ap.parse_args().groups:
        name, _, folders = g.rpartition("=")
        print(f"{name}: {spread(finals([Path(f) for f in folders.split(',')]))}")


if __name__ == "__main__":
    main()
