"""Tables of results/minimax/README.md for MNIST -> MNIST-M-like at 16x16 (issue 47) from the suite folders.

Usage: python results/minimax/summarize_mnistm16.py TUNE SEEDS12 [--source TWIN] [--json OUT.json]

TUNE: the folder of experiments/minimax/mnistm16_tune_suite.yaml (seed 0, every method and reference tuned on the
target validation images); SEEDS12: the folder of mnistm16_suite.yaml (seeds 1 and 2 at the seed-0 picks);
TWIN: the same suite at seed 0 with ``data.params.test_on=source`` (the same training, the SOURCE test images
scored: the source accuracy curve). Prints, per loss, every method and both references with the lr grid, the
validation score of each value and the pick, the final and best target test accuracy as mean ± sample SD over
the 3 seeds with every seed's value, and the source accuracy of seed 0; then the per-round means; ``--json``
writes the same numbers (for claims.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedsolve.experiments.folders import read_jsonl, slug

LOSSES = ("dann", "cdan", "mdd")
METHODS = ("FedMM", "FedAvgGDA", "FedProxGDA", "FedSGDA", "centralized", "source only")
FOLDER = {"centralized": "central", "source only": "source_only"}   # references sit in their cell's subfolder


def run_dir(root: Path, loss: str, label: str, seed: int) -> Path:
    sub = f"{loss}/{FOLDER[label]}" if label in FOLDER else loss
    return root / sub / slug(label) / f"seed{seed}"


def curve(root: Path, loss: str, label: str, seed: int) -> list[tuple[int, float]]:
    """(round, test accuracy) of one run's per-round log (plain or gzipped)."""
    return [(r["round"], r["test_accuracy"]) for r in read_jsonl(run_dir(root, loss, label, seed) / "metrics.jsonl")
            if "test_accuracy" in r]


def stat(vals: list[float]) -> dict:
    """Mean, sample SD (n - 1) and n, in percent, with every value."""
    pct = [100 * v for v in vals]
    return {"mean": round(statistics.mean(pct), 2), "sd": round(statistics.stdev(pct), 2) if len(pct) > 1 else 0.0,
            "n": len(pct), "per_seed": [round(v, 2) for v in pct]}


def summary(tune: Path, seeds12: Path, twin: Path | None) -> dict:
    out: dict = {}
    for loss in LOSSES:
        for label in METHODS:
            runs = [(tune, 0), (seeds12, 1), (seeds12, 2)]
            curves = [curve(root, loss, label, s) for root, s in runs]
            if not all(curves):
                continue
            tuned = (json.loads((run_dir(tune, loss, label, 0) / "summary.json").read_text()).get("extras")
                     or {}).get("tuned") or {}
            entry = {"final": stat([c[-1][1] for c in curves]), "best": stat([max(a for _, a in c) for c in curves]),
                     "rounds": curves[0][-1][0],
                     "by_round": {r: stat([dict(c)[r] for c in curves]) for r, _ in curves[0] if r and r % 50 == 0},
                     "tuning": {"grid": tuned.get("grid"), "split": "validation (labelled target images, seed 0)",
                                "scores": tuned.get("scores"), "pick": tuned.get("value"), "edge": tuned.get("edge"),
                                "rounds": tuned.get("rounds")}}
            src = curve(twin, loss, label, 0) if twin is not None else []
            if src:
                entry["source_seed0"] = {r: round(100 * a, 1) for r, a in src if r % 25 == 0 or r == src[-1][0]}
            out.setdefault(loss, {})[label] = entry
    return out


def markdown(res: dict) -> str:
    lines = []
    for loss, rows in res.items():
        lines += [f"### {loss.upper()}", "",
                  "| method | lr grid: validation acc. per value (%) | pick | final target acc. (%) | per seed | "
                  "best over rounds (%) | source acc. seed 0 (%) |", "|---|---|---|---|---|---|---|"]
        for label, e in rows.items():
            t = e["tuning"]
            scores = ", ".join(f"{g}: {'diverged' if s is None else f'{100 * s:.1f}'}"
                               for g, s in zip(t["grid"] or [], t["scores"] or []))
            src = e.get("source_seed0") or {}
            last = src[max(src)] if src else None
            lines.append(f"| {label} | {scores} | {t['pick']}{' (edge)' if t['edge'] else ''} | "
                         f"{e['final']['mean']:.1f} ± {e['final']['sd']:.1f} | "
                         f"{', '.join(f'{v:.1f}' for v in e['final']['per_seed'])} | "
                         f"{e['best']['mean']:.1f} ± {e['best']['sd']:.1f} | {'-' if last is None else last} |")
        lines += ["", "Target test accuracy by round (mean ± sample SD, n = 3):", "",
                  "| method | " + " | ".join(f"@{r}" for r in next(iter(rows.values()))["by_round"]) + " |",
                  "|---|" + "---|" * len(next(iter(rows.values()))["by_round"])]
        for label, e in rows.items():
            lines.append(f"| {label} | " + " | ".join(f"{s['mean']:.1f} ± {s['sd']:.1f}" for s in e["by_round"].values())
                         + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tune", type=Path)
    ap.add_argument("seeds12", type=Path)
    ap.add_argument("--source", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = summary(a.tune, a.seeds12, a.source)
    print(markdown(res))
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
