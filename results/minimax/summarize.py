"""Tables of results/minimax/README.md from run folders of the experiments/minimax suites.

Usage: python results/minimax/summarize.py runs/minimax
Reads <root>/mnistm_dann_2clients, <root>/mnistm_dann_fedsgda, <root>/skew10_{dann,cdan,mdd},
<root>/p_sweep_{cdan,dann,mdd}[_s<seed>]/p<p>,
<root>/digits_dann_2clients, the grid <root>/grid/<regime>/<loss>/<source>_<target> and
<root>/pretrained_authors_code/<loss>/<source>_<target> (those present);
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
                         ("mnistm_mdd_2clients", "MDD, 2 clients at p = 1"),
                         ("digits_dann_2clients", "MNIST -> scikit-learn digits, DANN, 2 clients at p = 1")):
        p = root_p / extra
        if p.exists() and any(p.glob("*/seed*/summary.json")):
            print(f"\n### {title}\n")
            mnistm = extra.startswith("mnistm") and ("dann" in extra or "source" in extra)
            print("\n".join(table(runs(p), target if mnistm else None, (100, 200) if "mnistm" in extra else (50, 100))))
    for loss in ("dann", "cdan", "mdd"):
        p = root_p / f"skew10_{loss}"
        if p.exists() and (p / "summary.json").exists():
            print(f"\n### 10 class-skewed clients, {loss.upper()}\n")
            print("\n".join(table(runs(p), None, (20, 40))))
    p_sweep(root_p)
    grid(root_p / "grid")
    psi_gradient_check(root_p)


#: the paper's Office-31 tasks (Tables 1/2) and our stand-in pairs: A = mnist, D = digits, W = mnistm
TASKS = (("A->W", "mnist_mnistm"), ("D->W", "digits_mnistm"), ("W->D", "mnistm_digits"),
         ("A->D", "mnist_digits"), ("D->A", "digits_mnist"), ("W->A", "mnistm_mnist"))
#: Table 1 (accuracy %) and Table 2 (rounds x100) of the paper, cells DANN / MDD / CDAN, spec fedmm.md 3.5
PAPER_ACC = {"FedAvgGDA": {"A->W": (60.1, 73.2, 62.9), "D->W": (86.1, 93.6, 86.8), "W->D": (93.6, 97.8, 94.2),
                           "A->D": (63.5, 72.1, 65.1), "D->A": (33.7, 47.9, 40.3), "W->A": (40.5, 51.7, 45.5)},
             "FedSGDA": {"A->W": (60.3, 76.4, 55.3), "D->W": (84.9, 94.7, 83.4), "W->D": (93.7, 98.3, 94.0),
                         "A->D": (65.3, 75.3, 67.7), "D->A": (36.9, 49.2, 47.1), "W->A": (40.3, 52.6, 43.3)},
             "FedMM": {"A->W": (65.5, 79.7, 64.7), "D->W": (89.6, 95.9, 93.4), "W->D": (96.7, 98.5, 94.0),
                       "A->D": (67.8, 78.8, 66.9), "D->A": (44.3, 60.3, 51.4), "W->A": (48.7, 55.5, 59.6)}}
PAPER_ROUNDS = {"FedAvgGDA": {"A->W": (10, 31, 17), "D->W": (13, 27, 13), "W->D": (8, 11, 7), "A->D": (7, 22, 21),
                              "D->A": (24, 31, 34), "W->A": (18, 18, 14)},
                "FedSGDA": {"A->W": (59, 255, 78), "D->W": (40, 188, 49), "W->D": (29, 92, 16), "A->D": (56, 400, 13),
                            "D->A": (48, 300, 95), "W->A": (88, 321, 85)},
                "FedMM": {"A->W": (13, 23, 29), "D->W": (15, 18, 9), "W->D": (14, 19, 10), "A->D": (7.5, 22, 32),
                          "D->A": (39, 19, 17), "W->A": (25, 15, 13)}}
GRID_METHODS = ("FedAvgGDA", "FedProxGDA", "FedSGDA", "FedMM", "Centralized")
LOSS_COL = {"dann": 0, "mdd": 1, "cdan": 2}


FEDERATED = ("FedAvgGDA", "FedProxGDA", "FedSGDA", "FedMM")


def rounds_to(run: dict, target: float) -> str:
    """The first evaluated round at which the run's target accuracy reaches ``target`` (">R" if never)."""
    a = acc(run)
    return next((str(t) for t, v in a if v >= target), f">{a[-1][0]}")


def grid(root: Path) -> None:
    """<root>/<regime>/<loss>/<source>_<target>/ (+ central/): Tables 1/2 analogues per regime and loss. Table 2's
    "rounds for training" (criterion not stated, spec 3.4 (b)) becomes the rounds each method needs to go 90% of the
    way from the round-0 accuracy to the best final accuracy of the federated methods in its cell (one bar for every
    method of a cell)."""
    if not root.exists():
        return
    for regime in ("scratch", "pretrained"):
        for loss in ("dann", "cdan", "mdd"):
            base = root / regime / loss
            cells = {}
            for task, pair in TASKS:
                folder = base / pair
                r: dict[str, list[dict]] = {}
                if (folder / "summary.json").exists():
                    r.update(runs(folder))
                if (folder / "central" / "summary.json").exists():
                    r.update(runs(folder / "central"))
                if r:
                    cells[task] = (pair, r)
            if not cells:
                continue
            col = LOSS_COL[loss]
            title = "from scratch" if regime == "scratch" else "pretrained (source-only stage, feature step x 0.05)"
            print(f"\n### Grid, {loss.upper()}, {title}: target accuracy (%) after the last round\n")
            print("| task (paper) | our pair | round 0 | " + " | ".join(GRID_METHODS)
                  + " | paper: FedAvgGDA / FedSGDA / FedMM |")
            print("|---|---|---|" + "---|" * len(GRID_METHODS) + "---|")
            for task, (pair, r) in cells.items():
                first = next(iter(r.values()))[0]
                ours = " | ".join(", ".join(f"{100 * acc(x)[-1][1]:.1f}" for x in r[m]) if m in r else "-"
                                  for m in GRID_METHODS)
                pap = " / ".join(f"{PAPER_ACC[m][task][col]:g}" for m in ("FedAvgGDA", "FedSGDA", "FedMM"))
                print(f"| {task} | {pair.replace('_', ' -> ')} | {100 * acc(first)[0][1]:.1f} | {ours} | {pap} |")
            if len(cells) > 1:
                avg = []
                for m in GRID_METHODS:
                    vals = [acc(x)[-1][1] for _, r in cells.values() for x in r.get(m, [])]
                    avg.append(f"{100 * sum(vals) / len(vals):.1f}" if vals else "-")
                pap = " / ".join(f"{sum(PAPER_ACC[m][t][col] for t, _ in TASKS) / 6:.1f}"
                                 for m in ("FedAvgGDA", "FedSGDA", "FedMM"))
                print(f"| average | {len(cells)} pairs | | " + " | ".join(avg) + f" | {pap} |")
            print(f"\n### Grid, {loss.upper()}, {title}: rounds to 90% of the gain\n")
            print("| task (paper) | our pair | bar (%) | " + " | ".join(GRID_METHODS)
                  + " | paper (rounds x100): FedAvgGDA / FedSGDA / FedMM |")
            print("|---|---|---|" + "---|" * len(GRID_METHODS) + "---|")
            for task, (pair, r) in cells.items():
                start = acc(next(iter(r.values()))[0])[0][1]
                gain = max(acc(x)[-1][1] for m in FEDERATED for x in r.get(m, [])) - start
                bar = start + 0.9 * gain
                ours = " | ".join("no gain" if gain < 0.005 else ", ".join(rounds_to(x, bar) for x in r[m])
                                  if m in r else "-" for m in GRID_METHODS)
                pap = " / ".join(f"{PAPER_ROUNDS[m][task][col]:g}" for m in ("FedAvgGDA", "FedSGDA", "FedMM"))
                print(f"| {task} | {pair.replace('_', ' -> ')} | {100 * bar:.1f} | {ours} | {pap} |")


def psi_gradient_check(root: Path) -> None:
    """<root>/pretrained_authors_code/<loss>/<pair>/ (problem.params.psi_gradient: authors_code, lr_psi 0.01) next to
    the grid's pretrained runs with the paper's psi step (<root>/grid/pretrained/<loss>/<pair>/): final target
    accuracy of FedMM and FedAvgGDA after the last round."""
    base = root / "pretrained_authors_code"
    for loss in ("dann", "cdan", "mdd"):
        cells = [(task, pair) for task, pair in TASKS if (base / loss / pair / "summary.json").exists()]
        if not cells:
            continue
        print(f"\n### Pretrained {loss.upper()}: psi step as in the paper vs the authors' code (final target acc. %)\n")
        print("| task (paper) | our pair | round 0 | FedAvgGDA, paper | FedAvgGDA, authors' code | FedMM, paper | "
              "FedMM, authors' code |")
        print("|---|---|---|---|---|---|---|")
        for task, pair in cells:
            code = runs(base / loss / pair)
            paper_p = root / "grid" / "pretrained" / loss / pair
            paper = runs(paper_p) if (paper_p / "summary.json").exists() else {}
            def cell(r: dict, m: str) -> str:
                return f"{100 * acc(r[m][0])[-1][1]:.1f}" if m in r else "-"
            start = acc(next(iter(code.values()))[0])[0][1]
            print(f"| {task} | {pair.replace('_', ' -> ')} | {100 * start:.1f} | {cell(paper, 'FedAvgGDA')} | "
                  f"{cell(code, 'FedAvgGDA')} | {cell(paper, 'FedMM')} | {cell(code, 'FedMM')} |")


#: the p sweep's read-out rounds (Fig. 2 analogue, 150 rounds)
SWEEP_AT = (50, 100, 150)


def sweep_runs(root: Path, loss: str) -> dict[float, dict[str, list[dict]]]:
    """{p: {label: runs}} of <root>/p_sweep_<loss>/p<p>/ and the other seeds' <root>/p_sweep_<loss>_s<k>/p<p>/
    (the seed folders of one p may also sit together in the first)."""
    out: dict[float, dict[str, list[dict]]] = {}
    for base in sorted(root.glob(f"p_sweep_{loss}")) + sorted(root.glob(f"p_sweep_{loss}_s*")):
        for q in base.glob("p*"):
            for label, rs in runs(q).items():
                have = out.setdefault(float(q.name[1:]), {}).setdefault(label, [])
                have += [r for r in rs if r["seed"] not in {x["seed"] for x in have}]
    return dict(sorted(out.items()))


def msv(vals: list[float]) -> str:
    """The mean ± std over seeds, or the single value of one seed."""
    return ms(vals) if len(vals) != 1 else f"{100 * vals[0]:.1f}"


def p_sweep(root: Path) -> None:
    """Fig. 2 analogue: target accuracy of FedAvgGDA and FedMM at rounds 50, 100 and 150 per loss and split p,
    FedMM's lead (per seed, then mean ± std over seeds) and the best accuracy over all evaluated rounds (the paper:
    FedAvgGDA degrades, so FedMM's lead grows, as p -> 1)."""
    for loss in ("cdan", "dann", "mdd"):
        res = sweep_runs(root, loss)
        if not res:
            continue
        print(f"\n### p sweep, {loss.upper()}, 2 clients: target accuracy (%) at rounds {SWEEP_AT}\n")
        print("| p | seeds | " + " | ".join(f"FedAvgGDA @{t}" for t in SWEEP_AT) + " | "
              + " | ".join(f"FedMM @{t}" for t in SWEEP_AT) + " | " + " | ".join(f"lead @{t}" for t in SWEEP_AT)
              + " | best FedAvgGDA | best FedMM |")
        print("|---|---|" + "---|" * (3 * len(SWEEP_AT) + 2))
        for pv, r in res.items():
            avg, mm = r.get("FedAvgGDA", []), r.get("FedMM", [])
            at = {m: [[dict(acc(x)).get(t, float("nan")) for x in rs] for t in SWEEP_AT]
                  for m, rs in (("FedAvgGDA", avg), ("FedMM", mm))}
            seeds = sorted({x["seed"] for x in avg} & {x["seed"] for x in mm})
            lead = []
            for t in SWEEP_AT:
                a = {x["seed"]: dict(acc(x)).get(t, float("nan")) for x in avg}
                b = {x["seed"]: dict(acc(x)).get(t, float("nan")) for x in mm}
                lead.append(msv([b[k] - a[k] for k in seeds]))
            print(f"| {pv:g} | {', '.join(map(str, seeds))} | " + " | ".join(msv(v) for v in at["FedAvgGDA"]) + " | "
                  + " | ".join(msv(v) for v in at["FedMM"]) + " | " + " | ".join(lead) + " | "
                  + " | ".join(msv([max(a for _, a in acc(x)) for x in rs]) for rs in (avg, mm)) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/minimax")
