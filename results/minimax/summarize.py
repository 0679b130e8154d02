"""Tables of results/minimax/README.md from run folders of the experiments/minimax suites.

Usage: python results/minimax/summarize.py runs/minimax
Reads <root>/mnistm_dann_2clients, <root>/mnistm_dann_fedsgda and <root>/skew10_{dann,cdan,mdd} (those present);
prints markdown: target accuracy (final and best over rounds, mean ± std over seeds), wall time, and the rounds
each method needs to reach FedSGDA's final accuracy (per seed, first evaluated round at or above it).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def runs(folder: Path) -> dict[str, list[dict]]:
    """{label: [{"seed", "history", "wall"}]} of a compare folder."""
    out: dict[str, list[dict]] = {}
    for alg in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "plots"):
        for sd in sorted(alg.glob("seed*")):
            if not (sd / "summary.json").exists():
                continue   # a run still going (or interrupted)
            hist = [json.loads(line) for line in (sd / "metrics.jsonl").read_text().splitlines() if line.strip()]
            summ = json.loads((sd / "summary.json").read_text())
            out.setdefault(alg.name, []).append({"seed": int(sd.name[4:]), "history": hist,
                                                 "wall": float(summ.get("wall_time_s", 0.0))})
    return out


def ms(vals: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not vals:
        return "-"
    m = statistics.mean(vals) * scale
    s = statistics.stdev(vals) * scale if len(vals) > 1 else 0.0
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def acc(run: dict) -> list[tuple[int, float]]:
    return [(r["round"], r["test_accuracy"]) for r in run["history"] if "test_accuracy" in r]


def table(groups: dict[str, list[dict]], target: dict[int, float] | None = None, at: tuple[int, ...] = ()) -> list[str]:
    lines = ["| method | seeds | rounds | " + "".join(f"acc. @{t} (%) | " for t in at)
             + "final target acc. (%) | best (%) | wall time (s) |"
             + (" rounds to FedSGDA's final acc. (per seed) |" if target else ""),
             "|---|---|---|" + "---|" * len(at) + "---|---|---|" + ("---|" if target else "")]
    for label, rs in groups.items():
        fin = [acc(r)[-1][1] for r in rs]
        best = [max(a for _, a in acc(r)) for r in rs]
        cells = "".join(f"{ms([dict(acc(r)).get(t, float('nan')) for r in rs])} | " for t in at)
        row = (f"| {label} | {len(rs)} | {acc(rs[0])[-1][0]} | {cells}{ms(fin)} | {ms(best)} | "
               f"{ms([r['wall'] for r in rs], 1.0, 0)} |")
        if target:
            reach = []
            for r in rs:
                thr = target.get(r["seed"])
                hit = next((t for t, a in acc(r) if thr is not None and a >= thr), None)
                reach.append("never" if hit is None else str(hit))
            row += f" {', '.join(reach)} |"
        lines.append(row)
    return lines


def main(root: str) -> None:
    root_p = Path(root)
    sg = root_p / "mnistm_dann_fedsgda"
    main_p = root_p / "mnistm_dann_2clients"
    target = None
    groups: dict[str, list[dict]] = {}
    if sg.exists():
        sgr = runs(sg)
        groups.update(sgr)
        target = {r["seed"]: acc(r)[-1][1] for r in sgr.get("FedSGDA", [])}
    if main_p.exists():
        groups = {**runs(main_p), **groups}
    if groups:
        print("### MNIST -> MNIST-M-like, DANN, 2 clients at p = 1\n")
        print("\n".join(table(groups, target, (100, 200))))
    for extra, title in (("mnistm_dann_centralized", "centralized (pooled data, one client)"),
                         ("mnistm_source_only", "source only (pooled, nu = 1e-6)"),
                         ("mnistm_dann_variants", "FedMM variants, 2 clients at p = 1"),
                         ("mnistm_cdan_2clients", "CDAN, 2 clients at p = 1"),
                         ("mnistm_mdd_2clients", "MDD, 2 clients at p = 1")):
        p = root_p / extra
        if p.exists() and any(p.glob("*/seed*/summary.json")):
            print(f"\n### {title}\n")
            print("\n".join(table(runs(p), target if "dann" in extra or "source" in extra else None, (100, 200))))
    for loss in ("dann", "cdan", "mdd"):
        p = root_p / f"skew10_{loss}"
        if p.exists() and (p / "summary.json").exists():
            print(f"\n### 10 class-skewed clients, {loss.upper()}\n")
            print("\n".join(table(runs(p), None, (20, 40))))
    p_sweep(root_p)


def p_sweep(root: Path) -> None:
    """<root>/p_sweep/p<p>/: final target accuracy per method and p (Fig. 2 analogue)."""
    folders = sorted((root / "p_sweep").glob("p*"), key=lambda q: float(q.name[1:]))
    res = {q.name[1:]: runs(q) for q in folders if any(q.glob("*/seed*/summary.json"))}
    if not res:
        return
    methods = sorted({m for r in res.values() for m in r})
    print("\n### p sweep, CDAN, 2 clients (final target acc. %)\n")
    print("| p | " + " | ".join(methods) + " |")
    print("|---|" + "---|" * len(methods))
    for pv, r in res.items():
        print(f"| {pv} | " + " | ".join(ms([acc(x)[-1][1] for x in r.get(m, [])]) for m in methods) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/minimax")
