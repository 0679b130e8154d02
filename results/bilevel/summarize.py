"""Tables for results/bilevel/README.md from the run folders of `fedsolve compare` (metrics.jsonl, timings.jsonl).

Usage: python results/bilevel/summarize.py <suite run folder> [--kind fig23|fig4|grid]
  fig23: per seed, FedNest's final test accuracy and the first evaluated round at which each other method reaches
         it (the Figure 2/3 claim: SimFBO needs fewer communication rounds), plus accuracy against wall time.
  fig4:  per seed, the final test accuracy of every method and the ShroFBO - SimFBO difference (Figure 4 claim).
  grid:  <folder> holds one `fedsolve compare --only` folder per step-size cell, named by its values (e.g.
         gx2.0_gy0.2_gv0.1): per cell, the final test accuracy per seed, its mean ± std (population, as the compare
         report), the mean at round 100 and best over rounds, and the median wall seconds of one run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from fedsolve.experiments.folders import read_jsonl


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs(root: Path) -> dict[str, dict[int, dict]]:
    """label -> seed -> its per-round log (kept plain or gzipped) and timings."""
    out: dict[str, dict[int, dict]] = {}
    for d in sorted({m.parent for m in root.glob("*/seed*/metrics.jsonl*")}):
        label, seed = d.parent.name, int(d.name.removeprefix("seed"))
        t = d / "timings.jsonl"
        out.setdefault(label, {})[seed] = {"metrics": read_jsonl(d / "metrics.jsonl"),
                                           "timings": load(t) if t.exists() else []}
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
    grid = sorted({round(tmax * f, 1) for f in (0.1, 0.25, 0.5, 1.0)})  # tenths of a second: short runs keep 4 columns
    print("| method | " + " | ".join(f"{t:g} s" for t in grid) + " |")
    print("|---|" + "---|" * len(grid))
    for k in res:
        row = []
        for t in grid:
            accs = []
            for r in res[k].values():
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


CELL = re.compile(r"([a-z]+)([0-9.]+)")


def cell_values(name: str) -> dict[str, float] | None:
    """``gx2.0_gy0.2_gv0.1`` -> {"gx": 2.0, "gy": 0.2, "gv": 0.1} (a grid cell's folder name); None if not one."""
    parts = [CELL.fullmatch(p) for p in name.split("_")]
    return {m.group(1): float(m.group(2)) for m in parts} if all(parts) else None


def step_grid(root: Path) -> None:
    cells = sorted((c for c in root.iterdir() if c.is_dir() and cell_values(c.name)),
                   key=lambda c: tuple(cell_values(c.name).values())[::-1])
    keys = list(cell_values(cells[0].name))
    print("| " + " | ".join(keys) + " | final, per seed | final, mean ± std | round 100 | best over rounds "
          "| wall s per run |")
    print("|" + "---|" * (len(keys) + 5))
    for cell in cells:
        for label, by_seed in runs(cell).items():
            fin = [by_seed[s]["metrics"][-1]["test_accuracy"] for s in sorted(by_seed)]
            r100 = [next(m["test_accuracy"] for m in by_seed[s]["metrics"] if m["round"] == 100) for s in by_seed]
            best = [max(m["test_accuracy"] for m in by_seed[s]["metrics"]) for s in by_seed]
            wall = [json.loads(p.read_text())["wall_time_s"] for p in sorted((cell / label).glob("seed*/summary.json"))]
            vals = cell_values(cell.name)
            print("| " + " | ".join(f"{vals[k]:g}" for k in keys) + " | " + " / ".join(f"{a:.4f}" for a in fin)
                  + f" | {statistics.mean(fin):.4f} ± {statistics.pstdev(fin):.4f} | {statistics.mean(r100):.4f} "
                  f"| {statistics.mean(best):.4f} | {statistics.median(wall):.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--kind", choices=["fig23", "fig4", "grid"], default="fig23")
    a = ap.parse_args()
    if a.kind == "grid":
        step_grid(a.root)
        return
    res = runs(a.root)
    (fig23 if a.kind == "fig23" else fig4)(res)


if __name__ == "__main__":
    main()
