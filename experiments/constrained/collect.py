"""Tables 1 and 2 of paper 002 from the per-seed certificates of `fedsolve compare` runs.

Usage: python experiments/constrained/collect.py [ROOT ...] [--table 1|2] [--copy DEST]

Reads every ROOT/**/seed*/summary.json (default root: runs/constrained) and groups the runs by what makes
them the same table cell: problem kind and dataset, n (data.num_clients), the data limits, the round budget
and the algorithm label. A seed found twice in one cell (two folders) counts once, the newest file. Prints
one markdown row per cell: mean (std over seeds) of the certificate's values (`extras.constrained`), the
seeds, outer iterations K, ADMM rounds and wall seconds per seed and how many seeds passed Eq. 11.
--copy DEST copies each counted seed's small files (summary.json, metrics.jsonl) to DEST/<folder>/<label>/seedK.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

ORDER = {"Prox-AL FL": 0, "Prox-AL FL (paper params)": 0, "Prox-AL FL (code params)": 1, "cProx-AL": 2,
         "FedAvg (no constraints)": 3}
VARIANT_FIELDS = ("inner_stop", "eps_tilde")  # algorithm options that make a separate row when not 'paper'
NAMES = {"breast_cancer": "breast cancer (WDBC)", "monks1": "monks-1 (rule)", "adult": "Adult"}


def cell_key(cfg: dict) -> tuple:
    """The fields that make two runs the same table cell (everything else is cosmetic: eval_every, out_dir)."""
    p = cfg["problem"]["params"]
    return (cfg["problem"]["kind"], p["dataset"], cfg["data"]["num_clients"], p.get("limit"),
            p.get("server_limit"), cfg["simulation"]["rounds"])


def load(roots: list[Path]) -> dict[tuple, dict[str, dict[int, tuple[Path, dict]]]]:
    """cell -> label -> seed -> (seed folder, summary), the newest summary when a seed was run twice."""
    cells: dict = defaultdict(lambda: defaultdict(dict))
    for root in roots:
        for path in sorted(root.glob("**/seed*/summary.json")):
            cfg = yaml.safe_load((path.parent / "config.yaml").read_text())
            summ = json.loads(path.read_text())
            label, seed = summ["label"], summ["seed"]
            variant = {k: v for k, v in cfg["algorithm"]["params"].items() if k in VARIANT_FIELDS and v != "paper"}
            if variant:  # the authors' code's stopping tests: another row
                label += " [" + ", ".join(f"{k}: {v}" for k, v in sorted(variant.items())) + "]"
            old = cells[cell_key(cfg)][label].get(seed)
            if old is None or path.stat().st_mtime > (old[0] / "summary.json").stat().st_mtime:
                cells[cell_key(cfg)][label][seed] = (path.parent, summ)
    return cells


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


def constraint_loss(c: dict, kind: str, r: float) -> tuple[float, float]:
    """(client mean, client max) of the constrained loss: class-1 loss (Table 1) or disparity (Table 2)."""
    means = [v for k, v in c.items() if k.startswith("c_client_mean[")]
    maxes = [v for k, v in c.items() if k.startswith("c_client_max[")]
    if kind == "fairness":  # |L_f - L_m| <= r is two constraints; the disparity is the larger one + r
        return max(means) + r, max(maxes) + r
    return means[0] + r, maxes[0] + r


def server_disparity(c: dict, r: float) -> float | None:
    vals = [v for k, v in c.items() if k.startswith("c_server[")]
    return max(vals) + r if vals else None


def rows(cells: dict, table: int, budgets: set[int] | None = None) -> list[str]:
    out = []
    kind_of_table = "neyman_pearson" if table == 1 else "fairness"
    for key in sorted(k for k in cells if k[0] == kind_of_table and (budgets is None or k[-1] in budgets)):
        kind, dataset, n, limit, server_limit, rounds = key
        labels = sorted(cells[key], key=lambda s: (ORDER.get(s, 9), s))
        ref = {seed: s["extras"]["constrained"]["objective"] for seed, (_, s) in cells[key].get("cProx-AL", {}).items()}
        for label in labels:
            runs = [cells[key][label][seed] for seed in sorted(cells[key][label])]
            seeds = sorted(cells[key][label])
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
            eps = (f"{fmt([c['kkt_eps1'] for c in cs], '.1e')} / {fmt([c['kkt_eps2'] for c in cs], '.1e')}"
                   if alg != "fedavg_uncons" else "")
            k_col = spread([c["outer_iterations"] for c in cs]) if "outer_iterations" in cs[0] else ""
            admm = spread([c["admm_rounds"] for c in cs]) if alg == "proxal" else ""
            wall = ", ".join(f"{s['wall_time_s']:.0f}" for _, s in runs)
            name = NAMES.get(dataset, dataset) + (f" ({limit:,} rows)" if limit else "")
            seed_col = spread(seeds) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}" if seeds == list(
                range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))
            rel_col = fmt(rel, ".1e") if rel else ""
            if table == 1:
                lm = f"{fmt([x[0] for x in loss], '.3f')} / {fmt([x[1] for x in loss], '.3f')}"
                out.append(f"| {name} | {n} | {seed_col} | {label} | {fmt([c['objective'] for c in cs])} | {rel_col} "
                           f"| {lm} | {eps} | {k_col} | {admm} | {wall} | {status} | {rounds} |")
            else:
                srv = [server_disparity(c, r) for c in cs]
                disp = f"{fmt([x[1] for x in loss], '.3f')} / {fmt(srv, '.3f')}" if None not in srv else ""
                out.append(f"| {n} | {seed_col} | {label} | {fmt([c['objective'] for c in cs])} | {rel_col} | {disp} "
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
                    help="one line per finished run: 'dataset n limit server_limit rounds seed label' (tables.sh)")
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
