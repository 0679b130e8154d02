"""Tables 1 and 2 of paper 002 from the per-seed certificates of `fedsolve compare` runs.

Usage: python experiments/constrained/collect.py [ROOT ...] [--table 1|2] [--copy DEST]

Reads every ROOT/**/seed*/summary.json (default root: runs/constrained) and groups the runs by what makes
them the same table cell: problem kind and dataset, n (data.num_clients), the data limits, the round budget
and the algorithm label. A seed found twice in one cell (two folders) counts once, the newest file. Prints
one markdown row per cell: mean (std over seeds) of the certificate's values (`extras.constrained`), the
seeds, outer iterations K, ADMM rounds and wall seconds per seed and how many seeds passed Eq. 11.
--copy DEST copies each counted seed's small files (summary.json, metrics.jsonl) to DEST/<folder>/<label>/seedK.
The grouping and the constrained losses are those of the suites experiments/constrained/table{1,2}_suite.yaml
(fedsolve.families.constrained.runs), which report the same numbers as per-metric tables next to the paper's.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from fedsolve.families.constrained.runs import constraint_loss, finished_runs, run_key, server_disparity

ORDER = {"Prox-AL FL": 0, "Prox-AL FL (paper params)": 0, "Prox-AL FL (code params)": 1, "cProx-AL": 2,
         "FedAvg (no constraints)": 3, "FedProx (no constraints)": 4}
NAMES = {"breast_cancer": "breast cancer (WDBC)", "breast_cancer_wisc:unit": "breast cancer (original Wisconsin, [0, 1])",
         "monks1": "monks-1 (rule)", "adult": "Adult"}
# the grouping rule and the certificate's constrained losses are shared with the Tables 1/2 suites
# (experiments/constrained/table{1,2}_suite.yaml, protocol constrained_runs)
cell_key = run_key


def load(roots: list[Path]) -> dict[tuple, dict[str, dict[int, tuple[Path, dict]]]]:
    """cell -> label -> seed -> (seed folder, summary), the newest summary when a seed was run twice
    (:func:`fedsolve.families.constrained.runs.finished_runs`)."""
    return finished_runs(roots)


def fmt(vals: list[float], digits: str = ".4f") -> str:
    """'mean (std)' over seeds, the value alone for one seed."""
    m = statistics.fmean(vals)
    if len(vals) == 1:
        return format(m, digits)
    return f"{format(m, digits)} ({format(statistics.pstdev(vals), '.1e')})"


def spread(vals: list) -> str:
    """Per-seed integers, e.g. K = '4, 4, 5', or one value when all agree."""
    vals = [int(v) for v in vals]
    return str(vals[0]) if len(set(vals)) == 1 else ", ".join(map(str, vals))


def rows(cells: dict, table: int, budgets: set[int] | None = None) -> list[str]:
    out = []
    kind_of_table = "neyman_pearson" if table == 1 else "fairness"
    for key in sorted(k for k in cells if k[0] == kind_of_table and (budgets is None or k[-1] in budgets)):
        kind, dataset, n, limit, server_limit, rounds = key
        labels = sorted(cells[key], key=lambda s: (ORDER.get(s, 9), s))
        ref = {seed: s["extras"]["constrained"]["objective"] for seed, (_, s) in cells[key].get("cProx-AL", {}).items()
               if s.get("status") != "diverged"}
        for label in labels:
            everything = sorted(cells[key][label].items())
            diverged = [seed for seed, (_, s) in everything if s.get("status") == "diverged"]
            runs = [run for seed, run in everything if seed not in diverged]
            seeds = [seed for seed, _ in everything if seed not in diverged]
            name = NAMES.get(dataset, dataset) + (f" ({limit:,} rows)" if limit else "")
            lead = f"| {name} | {n} |" if table == 1 else f"| {n} |"
            if not runs:
                out.append(f"{lead} {', '.join(map(str, diverged))} | {label} | diverged: every seed |")
                continue
            cs = [s["extras"]["constrained"] for _, s in runs]
            r = 0.2 if kind == "neyman_pearson" else 0.1
            loss = [constraint_loss(c, kind, r) for c in cs]
            rel = [abs(c["objective"] - ref[sd]) / abs(ref[sd]) for sd, c in zip(seeds, cs)
                   if sd in ref and label != "cProx-AL" and not label.startswith("FedAvg")]
            alg = runs[0][1]["algorithm"]
            conv = [c.get("converged") for c in cs]
            status = "" if alg == "fedavg_uncons" else (
                f"{sum(int(v or 0) for v in conv)}/{len(cs)} Eq. 11 passed"
                + (f", inner cap hit ({spread([c.get('inner_cap_hits', 0) for c in cs])})"
                   if any(c.get("inner_cap_hits") for c in cs) else ""))
            if diverged:
                status += f"{', ' if status else ''}diverged: seed {', '.join(map(str, diverged))}"
            eps = (f"{fmt([c['kkt_eps1'] for c in cs], '.1e')} / {fmt([c['kkt_eps2'] for c in cs], '.1e')}"
                   if alg != "fedavg_uncons" else "")
            k_col = spread([c["outer_iterations"] for c in cs]) if "outer_iterations" in cs[0] else ""
            admm = spread([c["admm_rounds"] for c in cs]) if alg == "proxal" else ""
            wall = ", ".join(f"{s['wall_time_s']:.0f}" for _, s in runs)
            seed_col = spread(seeds) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}" if seeds == list(
                range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))
            rel_col = fmt(rel, ".1e") if rel else ""
            if table == 1:
                lm = f"{fmt([x[0] for x in loss], '.3f')} / {fmt([x[1] for x in loss], '.3f')}"
                out.append(f"{lead} {seed_col} | {label} | {fmt([c['objective'] for c in cs])} | {rel_col} "
                           f"| {lm} | {eps} | {k_col} | {admm} | {wall} | {status} | {rounds} |")
            else:
                srv = [server_disparity(c, r) for c in cs]
                disp = f"{fmt([x[1] for x in loss], '.3f')} / {fmt(srv, '.3f')}" if None not in srv else ""
                out.append(f"{lead} {seed_col} | {label} | {fmt([c['objective'] for c in cs])} | {rel_col} | {disp} "
                           f"| {eps} | {k_col} | {admm} | {wall} | {status} | {rounds} |")
    return out


def copy_small(cells: dict, dest: Path) -> None:
    for labels in cells.values():
        for seeds in labels.values():
            for folder, _ in seeds.values():
                target = dest / folder.parent.parent.name / folder.parent.name / folder.name
                target.mkdir(parents=True, exist_ok=True)
                for name in ("summary.json", "metrics.jsonl"):
                    if (folder / name).exists():
                        shutil.copy2(folder / name, target / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="*", default=["runs/constrained"])
    ap.add_argument("--table", type=int, choices=[1, 2], default=None)
    ap.add_argument("--copy", default=None, help="copy the counted seeds' summary.json and metrics.jsonl here")
    ap.add_argument("--rounds", default=None,
                    help="only cells with these round budgets: Table 1's and Table 2's, e.g. 1500,600")
    ap.add_argument("--list-done", action="store_true",
                    help="one line per finished run: 'dataset n limit server_limit rounds seed label' (the suites' adoption rule)")
    a = ap.parse_args()
    cells = load([Path(r) for r in a.roots])
    if a.list_done:
        for (_, dataset, n, limit, server_limit, rounds), labels in cells.items():
            for label, seeds in labels.items():
                for seed in seeds:
                    print(dataset, n, limit, server_limit, rounds, seed, label)
        return
    for table in [a.table] if a.table else [1, 2]:
        if table == 1:
            print("| dataset | n | seeds | method | objective | rel. diff vs cProx-AL | class-1 loss mean / max "
                  "| KKT eps1 / eps2 | K | ADMM rounds | wall s | status | budget |")
        else:
            print("| n | seeds | method | objective | rel. diff | disparity client max / server | KKT eps1 / eps2 "
                  "| K | ADMM rounds | wall s | status | budget |")
        print("|" + "---|" * (13 if table == 1 else 12))
        budgets = {int(a.rounds.split(",")[table - 1])} if a.rounds else None
        print("\n".join(rows(cells, table, budgets)))
        print()
    if a.copy:
        copy_small(cells, Path(a.copy))


if __name__ == "__main__":
    main()
