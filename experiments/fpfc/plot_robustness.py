"""Draw a Byzantine figure (Fig. 7 / E.2 / E.3 layout) from saved ``robustness.py`` results.

``robustness.py`` draws ``OUT/robustness.png`` itself. This script draws one figure from the
``results.json`` of several calls (one call per attack or per fraction, or reports merged by hand, whose
rows give ``acc_by_seed``). A cell present in two files must have the same seeds' results in both.

usage: python experiments/fpfc/plot_robustness.py OUT.png RESULTS.json [RESULTS.json ...] [--title TEXT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness import plot  # noqa: E402


def load_rows(files) -> list[dict]:
    """The rows of every file, one per (attack, fraction, algorithm); ``acc_by_seed`` becomes ``acc``."""
    cells: dict[tuple, dict] = {}
    for f in map(Path, files):
        if not f.is_file():
            raise SystemExit(f"plot_robustness: no file {f}")
        for r in json.loads(f.read_text()):
            acc = r["acc"] if "acc" in r else [r["acc_by_seed"][s] for s in sorted(r["acc_by_seed"], key=int)]
            row = {"attack": r["attack"], "fraction": float(r["fraction"]), "algorithm": r["algorithm"],
                   "acc": acc, "diverged": r.get("diverged", [])}
            key = (row["attack"], row["fraction"], row["algorithm"])
            if key in cells and cells[key] != row:
                raise SystemExit(f"plot_robustness: {key} differs between files ({cells[key]['acc']} and "
                                 f"{row['acc']} in {f})")
            cells[key] = row
    return sorted(cells.values(), key=lambda r: r["fraction"])


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the PNG to write")
    p.add_argument("results", nargs="+", help="results.json files written by robustness.py")
    p.add_argument("--title", default="Byzantine robustness (FPFC Sec. 6.4.1)")
    a = p.parse_args(argv)
    rows = load_rows(a.results)
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    labels = list(dict.fromkeys(r["algorithm"] for r in rows))
    plot(rows, attacks, labels, a.title, Path(a.out))
    print(f"wrote {a.out}: {len(rows)} cells, attacks {attacks}, methods {labels}")
    return rows


if __name__ == "__main__":
    main()
