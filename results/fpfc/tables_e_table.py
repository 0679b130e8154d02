"""Tables E.1-E.4 (synthetic S2-S5, every method tuned on validation) from tuning passes kept in several folders.

Usage: python results/fpfc/tables_e_table.py SCENARIO=DIR[,DIR...] ...

Each DIR holds runs ``<DIR>/<method>/seed<k>/`` of one scenario that chose their hyper-parameter on validation
(``extras.tuned`` of the run's summary: the grid, the validation score of each value, the pick). A method and
seed tuned in several DIRs (a first pass, then a grid widened beyond a pick at its edge) is scored on the union
of its grids: the value with the best validation score over all of them is its pick, and the run trained at
that value is the one reported (ties: the value tried first, as in one tuning; when two folders trained the same
value, their test accuracies must agree).
Per scenario: one markdown row per method with the pick per seed (``*`` where the pick lies at the union's edge;
a pick of 0 at the bottom of the grid is not marked: lambda = 0, no fusion, is the edge of FPFC-l1's domain),
the test accuracy per seed and as mean ± sample SD, the clusters and the ARI; then the methods best first.
Bad input: one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ORDER = ["FPFC", "FPFC-l1", "IFCA", "CFL", "PACFL", "LOCAL", "FedAvg", "LG", "Per-FedAvg"]


def fail(msg: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def candidates(dirs: list[Path]) -> dict[tuple[str, int], list[dict]]:
    """(method, seed) -> the summaries of its runs in every folder, in the folders' order."""
    out: dict[tuple[str, int], list[dict]] = {}
    for i, d in enumerate(dirs):
        found = sorted(d.glob("*/seed*/summary.json"))
        if not found:
            fail(f"{d}: no <method>/seed<k>/summary.json under it")
        for p in found:
            s = json.loads(p.read_text())
            if "tuned" not in s.get("extras", {}):
                fail(f"{p.parent}: the run was not tuned (no extras.tuned in its summary)")
            s["_path"], s["_folder"] = p.parent.as_posix(), i + 1
            out.setdefault((s["label"], int(s["seed"])), []).append(s)
    return out


def choose(runs: list[dict]) -> tuple[dict, float, bool]:
    """The run at the best value of the union of its grids, that value, and whether it lies at the union's edge."""
    scores: dict[float, float] = {}
    for r in runs:
        t = r["extras"]["tuned"]
        for v, sc in zip(t["grid"], t["scores"]):
            if float(v) in scores and abs(scores[float(v)] - sc) > 1e-9:
                fail(f"{r['_path']}: {t['param']} = {v} scored {sc} here and {scores[float(v)]} in another pass")
            scores[float(v)] = sc
    tried = list(scores)  # in the order tried: the folders' order, then each grid's
    best = max(tried, key=lambda v: (scores[v], -tried.index(v)))  # ties: the first tried, as tune_spec does
    trained = [r for r in runs if float(r["extras"]["tuned"]["value"]) == best]
    if not trained:
        fail(f"{runs[0]['_path']}: no pass trained the union's pick {best:g}")
    accs = {round(r["metrics"]["final"]["test_accuracy"], 9) for r in trained}
    if len(accs) > 1:
        fail(f"{trained[0]['_path']}: two passes trained {best:g} and disagree on test accuracy {sorted(accs)}")
    at_edge = best in (min(scores), max(scores)) and not (best == 0.0 == min(scores))
    return trained[0], best, at_edge


def mean_sd(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def table(scenario: str, dirs: list[Path]) -> str:
    runs = candidates(dirs)
    lines = [
        f"### {scenario}",
        "",
        "| method | pick per seed | test accuracy per seed (%) | mean ± SD (%) | clusters | ARI | folders |",
        "|---|---|---|---|---|---|---|",
    ]
    means = {}
    for label in sorted({k[0] for k in runs}, key=lambda x: ORDER.index(x) if x in ORDER else len(ORDER)):
        seeds = sorted(s for (m, s) in runs if m == label)
        picks, accs, clusters, ari, where = [], [], [], [], []
        for seed in seeds:
            run, best, edge = choose(runs[(label, seed)])
            final = run["metrics"]["final"]
            picks.append(f"{best:g}{'*' if edge else ''}")
            accs.append(100 * final["test_accuracy"])
            clusters.append("-" if "num_clusters" not in final else f"{final['num_clusters']:g}")
            ari.append("-" if "ari" not in final else f"{final['ari']:.2f}")
            where.append(str(run["_folder"]))
        means[label] = statistics.fmean(accs)
        lines.append(
            f"| {label} | {', '.join(picks)} | {', '.join(f'{a:.2f}' for a in accs)} | {mean_sd(accs)} "
            f"(n = {len(accs)}) | {', '.join(clusters)} | {', '.join(ari)} | {', '.join(where)} |"
        )
    ranked = sorted(means, key=lambda m: -means[m])
    lines += ["", "Best first: " + ", ".join(f"{m} {means[m]:.2f}" for m in ranked), ""]
    lines += [f"folder {i + 1}: {d.as_posix()}" for i, d in enumerate(dirs)] + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenarios", nargs="+", help="SCENARIO=DIR[,DIR...]")
    for g in ap.parse_args().scenarios:
        name, sep, dirs = g.partition("=")
        if not sep or not dirs:
            fail(f"{g!r}: expected SCENARIO=DIR[,DIR...]")
        paths = [Path(d) for d in dirs.split(",")]
        for p in paths:
            if not p.is_dir():
                fail(f"{p}: not a folder")
        print(table(name, paths))


if __name__ == "__main__":
    main()
