"""Fig. E.2 (S1, Byzantine attacks) with every method at its validation pick of Table 1 (issue 47).

Usage: python results/fpfc/robustness_tuned.py [--json OUT.json]

FPFC: results/fpfc/robustness_full_size (lambda 0.6, its validation pick on every seed, the same runs). IFCA,
LOCAL (and FedAvg, seed 0 only): results/fpfc/robustness_s1_tuned/seed<k>, one `fedsolve suite
experiments/fpfc/robustness_synthetic.yaml` per seed at that seed's picks (entry table1-synthetic: IFCA L = 8, 16,
24; LOCAL lr 0.8, 0.8, 0.4; FedAvg lr 0.2); seeds 1 and 2 in two suites each (same-value in seed<k>, sign-flip and
Gaussian in seed<k>_sign_flip_gaussian). Prints, per attack and malicious fraction, each method's benign
accuracy (%) per seed and mean ± sample SD (n), and the best method on the mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ATTACKS = ("same_value", "sign_flip", "gaussian")
FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8)


def recorded_fpfc() -> dict:
    rows = json.loads((HERE / "robustness_full_size" / "results.json").read_text())
    return {(r["attack"], r["fraction"]): {int(s): a for s, a in r["acc_by_seed"].items()}
            for r in rows if r["algorithm"] == "FPFC"}


def tuned_runs() -> dict:
    """(attack, fraction, method) -> {seed: benign accuracy} from the per-seed suites' cells."""
    out: dict = {}
    for cell in sorted(HERE.glob("robustness_s1_tuned/seed*/cells/*.json")):
        c = json.loads(cell.read_text())
        a = c["cell"]
        rows = c["rows"]
        if not rows:
            continue
        attack = a.get("attack") or "none"
        for att in (ATTACKS if attack == "none" else (attack,)):   # an unattacked run serves every attack
            out.setdefault((att, float(a["fraction"]), a["algorithm"]), {})[int(a["seed"])] = rows[0]["benign_accuracy"]
    return out


def table() -> dict:
    fp, tu = recorded_fpfc(), tuned_runs()
    methods = ["FPFC", *sorted({m for _, _, m in tu}, key=("IFCA", "LOCAL", "FedAvg").index)]
    res: dict = {}
    for att in ATTACKS:
        for f in FRACTIONS:
            cell = {}
            for m in methods:
                by_seed = fp.get((att, f)) if m == "FPFC" else tu.get((att, f, m))
                if not by_seed:
                    continue
                v = [100 * by_seed[s] for s in sorted(by_seed)]
                cell[m] = {"per_seed": [round(x, 2) for x in v], "mean": round(statistics.mean(v), 2),
                           "sd": round(statistics.stdev(v), 2) if len(v) > 1 else None, "n": len(v)}
            full = {m: c for m, c in cell.items() if c["n"] == 3}
            res.setdefault(att, {})[f] = {"methods": cell, "best": max(full, key=lambda m: full[m]["mean"])
                                          if full else None}
    return res


def markdown(res: dict) -> str:
    lines = []
    for att, by_f in res.items():
        lines += [f"**{att}**", "", "| method | " + " | ".join(str(f) for f in FRACTIONS) + " |",
                  "|---|" + "---|" * len(FRACTIONS)]
        methods = list(dict.fromkeys(m for f in by_f for m in by_f[f]["methods"]))
        for m in methods:
            cells = []
            for f in FRACTIONS:
                c = by_f[f]["methods"].get(m)
                if c is None:
                    cells.append("-")
                    continue
                txt = f"{c['mean']:.2f}" + (f" ± {c['sd']:.2f}" if c["sd"] is not None else f" (n = {c['n']})")
                cells.append(f"**{txt}**" if by_f[f]["best"] == m else txt)
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = table()
    print(markdown(res))
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
