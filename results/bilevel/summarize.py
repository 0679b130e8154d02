"""Tables for results/bilevel/README.md from the run folders of `fedsolve compare` (metrics.jsonl, timings.jsonl).

Usage: python results/bilevel/summarize.py <suite run folder> [--kind fig23|fig4]
  fig23: per seed, FedNest's final test accuracy and the first evaluated round at which each other method reaches
         it (the Figure 2/3 claim: SimFBO needs fewer communication rounds), plus accuracy against wall time.
  fig4:  per seed, the final test accuracy of every method and the ShroFBO - SimFBO difference (Figure 4 claim).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs(root: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for m in sorted(root.glob("*/seed*/metrics.jsonl")):
        label, seed = m.parent.parent.name, int(m.parent.name.removeprefix("seed"))
        t = m.with_name("timings.jsonl")
        out.setdefault(label, {})[seed] = {"metrics": load(m), "timings": load(t) if t.exists() else []}
    return out


def first_round(metrics: list[dict], target: float) -> int | None:
    return next((r["round"] for r in metrics if r.get("test_accuracy", 0) >= target), None)


def fig23(res: dict) -> None:
    seeds = sorted(res["FedNest"])
    others = [k for k in res if k != "FedNest"]
    print("| seed | FedNest final acc. (round) | " + " | ".join(f"{k}: first round >= it" for k in others) + " |")
    print("|---|---|" + "---|" * len(others))
    for s in seeds:
        fm = res["FedNest"][s]["metrics"]
        tgt = fm[-1]["test_accuracy"]
        cells = [str(first_round(res[k][s]["metrics"], tgt)) for k in others]
        print(f"| {s} | {tgt:.4f} ({fm[-1]['round']}) | " + " | ".join(cells) + " |")
    print()
    print("Test accuracy against wall-clock seconds (Figure 5; mean over seeds of the last evaluation at or "
          "before each time):")
    tmax = min(min(res[k][s]["timings"][-1]["time_s"] for s in res[k]) for k in res)
    grid = [round(tmax * f) for f in (0.1, 0.25, 0.5, 1.0)]
    print("| method | " + " | ".join(f"{t} s" for t in grid) + " |")
    print("|---|" + "---|" * len(grid))
    for k in res:
        row = []
        for t in grid:
            accs = []
            for s, r in res[k].items():
                rounds_by_time = [x["round"] for x in r["timings"] if x["time_s"] <= t]
                last = max(rounds_by_time) if rounds_by_time else 0
                accs.append(next(m["test_accuracy"] for m in r["metrics"] if m["round"] == last))
            row.append(f"{statistics.mean(accs):.4f}")
        print(f"| {k} | " + " | ".join(row) + " |")


def fig4(res: dict) -> None:
    labels = list(res)
    seeds = sorted(res[labels[0]])
    print("| seed | " + " | ".join(labels) + " | ShroFBO - SimFBO |")
    print("|---|" + "---|" * (len(labels) + 1))
    diffs = []
    for s in seeds:
        fin = {k: res[k][s]["metrics"][-1]["test_accuracy"] for k in labels}
        d = fin["ShroFBO"] - fin["SimFBO"]
        diffs.append(d)
        print(f"| {s} | " + " | ".join(f"{fin[k]:.4f}" for k in labels) + f" | {d:+.4f} |")
    print(f"\nShroFBO - SimFBO: mean {statistics.mean(diffs):+.4f}, ShroFBO ahead on "
          f"{sum(d > 0 for d in diffs)} of {len(diffs)} seeds.")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--kind", choices=["fig23", "fig4"], default="fig23")
    a = ap.parse_args()
    res = runs(a.root)
    (fig23 if a.kind == "fig23" else fig4)(res)


if __name__ == "__main__":
    main()
