"""Fig. 9's image panels (communication strategies) as a table, from runs kept in several folders.

Usage: python results/fpfc/fig9_tuned_table.py NAME=DIR[,DIR...] ...

Each DIR holds one strategy's runs ``<DIR>/seed<k>/`` (for example ``results/fpfc/fig9_comm_images_tuned/seed0/mnist/
T_10``: seed 0 tuned there, seeds 1 and 2 at the seed-0 pick in another folder); NAME pools them (a seed twice is an
error). One markdown row per NAME: the lambda each seed ran with, the test accuracy after 62 rounds (where the paper
compares the strategies; ``-`` for a run that ended before round 62) and at the end of the budget, per seed and as
mean ± sample SD, and the clusters and ARI at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

from fedsolve.experiments.folders import read_jsonl

ROUND = 62


def fail(msg: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def runs(dirs: list[Path]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for d in dirs:
        found = sorted(d.glob("seed*/summary.json"))
        if not found:
            fail(f"{d}: no seed<k>/summary.json under it")
        for p in found:
            seed = int(json.loads(p.read_text())["seed"])
            if seed in out:
                fail(f"{p.parent}: seed {seed} appears twice")
            out[seed] = p.parent
    return dict(sorted(out.items()))


def mean_sd(xs: list[float]) -> str:
    sd = f" ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
    return f"{statistics.fmean(xs):.2f}{sd} (n = {len(xs)})"


def row(name: str, dirs: list[Path]) -> str:
    lams, at62, end, clusters, ari = [], [], [], [], []
    for run in runs(dirs).values():
        lams.append(yaml.safe_load((run / "config.yaml").read_text())["algorithm"]["params"]["lam"])
        recs = [r for r in read_jsonl(run / "metrics.jsonl") if "test_accuracy" in r]  # or its .gz
        hit = [r for r in recs if r["round"] == ROUND]
        at62.append(100 * hit[0]["test_accuracy"] if hit else None)
        final = json.loads((run / "summary.json").read_text())["metrics"]["final"]
        end.append(100 * final["test_accuracy"])
        clusters.append(int(final["num_clusters"]))
        ari.append(final["ari"])
    seen = [x for x in at62 if x is not None]
    return (
        f"| {name} | {', '.join(f'{v:g}' for v in lams)} | "
        f"{', '.join('-' if x is None else f'{x:.2f}' for x in at62)} | {mean_sd(seen) if seen else '-'} | "
        f"{', '.join(f'{x:.2f}' for x in end)} | {mean_sd(end)} | "
        f"{', '.join(map(str, clusters))} | {', '.join(f'{x:.2f}' for x in ari)} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="+", help="NAME=DIR[,DIR...]")
    print(
        f"| strategy | lambda per seed | accuracy after {ROUND} rounds per seed (%) | mean ± SD | "
        "accuracy at the end of the budget per seed (%) | mean ± SD | clusters | ARI |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for g in ap.parse_args().groups:
        name, _, dirs = g.rpartition("=")  # a name may hold "=" (T=5), a folder not
        print(row(name, [Path(d) for d in dirs.split(",")]))


if __name__ == "__main__":
    main()
