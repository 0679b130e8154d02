"""FedAPM's Figs. 4, 5 and 7 as numbers, read from compare folders' per-round logs (Zhu et al., KDD'25, Sec. 6.2).

A compare folder holds ``<label>/seed<k>/metrics.jsonl`` (or ``metrics.jsonl.gz``, as ``results/`` keeps them): one
record per evaluated round. From them, per method (or per folder, for a sweep of folders):

* **training loss (Figs. 4, 7)**: the seed-mean ``train_loss`` of each evaluated round (the round's participants'
  mean per-sample loss over their local steps; the paper's CIFAR10 curves sum minibatch losses instead), its mean
  over the evaluated rounds (lower: lower sooner) and the first evaluated round at which the seed-mean curve is
  at or below a common level ``L*``: the highest last-round loss of the compared curves, so every curve reaches it;
* **model deviation (Fig. 5)**: the seed-mean ``local_drift`` (mean over clients of ``||u_i^{t+1} - u^t||`` on the
  shared block at each client's latest round; FedAvg/FedProx through ``wrap: drift``) averaged over the evaluated
  rounds 1-30 (the paper's bar: the mean of rounds 1-30) and at the last round.

``python -m fedsolve.families.personalized.figures FOLDER...`` prints both tables for each compare folder, and with
``--sweep`` one training-loss table whose rows are the folders (Fig. 7's participation fractions).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

EARLY = 30  # Fig. 5's bar averages rounds 1-30


def run_records(run_dir: Path) -> list[dict]:
    """The evaluation records of one run folder (``metrics.jsonl``, else ``metrics.jsonl.gz``)."""
    plain, packed = run_dir / "metrics.jsonl", run_dir / "metrics.jsonl.gz"
    if plain.exists():
        text = plain.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl or metrics.jsonl.gz")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def method_runs(folder: Path) -> dict[str, list[list[dict]]]:
    """``label -> [records of each seed]`` of a compare folder, in the order of its ``summary.json``."""
    folder = Path(folder)
    labels = list(json.loads((folder / "summary.json").read_text()).get("algorithms") or [])
    if not labels:
        raise ValueError(f"{folder / 'summary.json'}: no algorithms; allowed: a compare folder's summary")
    out: dict[str, list[list[dict]]] = {}
    for run in sorted(folder.glob("*/seed*/summary.json")):
        label = json.loads(run.read_text()).get("label") or run.parent.parent.name
        if label in labels:
            out.setdefault(label, []).append(run_records(run.parent))
    missing = [k for k in labels if k not in out]
    if missing:
        raise FileNotFoundError(f"{folder}: no run folder of {missing[0]!r}")
    return {k: out[k] for k in labels}


def seed_mean(runs: Sequence[list[dict]], key: str) -> dict[int, float]:
    """``round -> mean over seeds of key`` at the rounds every seed evaluated with a finite value."""
    per = [
        {r["round"]: r[key] for r in recs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])}
        for recs in runs
    ]
    common = sorted(set.intersection(*(set(p) for p in per))) if per else []
    return {t: statistics.fmean(p[t] for p in per) for t in common}


def loss_table(curves: dict[str, dict[int, float]], rounds: Sequence[int]) -> tuple[list[str], float]:
    """Markdown rows ``| name | loss at each of rounds | mean | first round <= L* |`` and ``L*``."""
    level = max(c[max(c)] for c in curves.values())
    rows = []
    for name, c in curves.items():
        at = [f"{c[t]:.3f}" if t in c else "-" for t in rounds]
        reach = next(t for t in sorted(c) if c[t] <= level)
        rows.append(f"| {name} | {' | '.join(at)} | {statistics.fmean(c.values()):.3f} | {reach} |")
    return rows, level


def drift_rows(drifts: dict[str, dict[int, float]]) -> list[str]:
    """Markdown rows ``| name | mean over the evaluations of rounds 1-30 | last round |``."""
    rows = []
    for name, c in drifts.items():
        early = [v for t, v in c.items() if 1 <= t <= EARLY]
        rows.append(
            f"| {name} | {statistics.fmean(early):.3f} | {c[max(c)]:.3f} |" if early and c else f"| {name} | - | - |"
        )
    return rows


def _rounds(curves: dict[str, dict[int, float]]) -> list[int]:
    """The table's columns: rounds 5, 10, 20, 40 and the last, where some curve has them."""
    last = max(max(c) for c in curves.values())
    return sorted({t for t in (5, 10, 20, 40, last) if any(t in c for c in curves.values())})


def _loss_section(curves: dict[str, dict[int, float]], first: str, what: str) -> list[str]:
    rounds = _rounds(curves)
    rows, level = loss_table(curves, rounds)
    return [
        f"Training loss ({what}; seed mean per evaluated round):",
        "",
        f"| {first} | " + " | ".join(f"round {t}" for t in rounds) + f" | mean over rounds | first round <= "
        f"{level:.3f} (L*) |",
        "|---" * (len(rounds) + 3) + "|",
        *rows,
        "",
    ]


def folder_report(folder: Path) -> str:
    """Figs. 4 and 5 of one compare folder (module docstring), as markdown."""
    runs = method_runs(folder)
    n = {len(v) for v in runs.values()}
    lines = [f"### {Path(folder).name} (seeds per method: {', '.join(map(str, sorted(n)))})", ""]
    lines += _loss_section({k: seed_mean(v, "train_loss") for k, v in runs.items()}, "method", "Fig. 4")
    drifts = {k: seed_mean(v, "local_drift") for k, v in runs.items()}
    lines += [
        "Model deviation (Fig. 5; seed-mean local_drift):",
        "",
        f"| method | mean of the evaluations in rounds 1-{EARLY} | last round |",
        "|---|---|---|",
    ]
    lines += [*drift_rows(drifts), ""]
    return "\n".join(lines)


def sweep_report(folders: Sequence[Path], label: str | None = None) -> str:
    """One training-loss table whose rows are ``folders`` (one method each, or ``label`` of each), as markdown:
    Fig. 7's participation sweep."""
    curves = {}
    for f in folders:
        runs = method_runs(f)
        key = label if label is not None else next(iter(runs))
        curves[Path(f).name] = seed_mean(runs[key], "train_loss")
    return "\n".join(_loss_section(curves, "folder", "Fig. 7"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedsolve.families.personalized.figures", description=__doc__.split("\n")[0]
    )
    ap.add_argument("folders", nargs="+", type=Path, help="compare folders")
    ap.add_argument("--sweep", action="store_true", help="one training-loss table, a row per folder (Fig. 7)")
    args = ap.parse_args(argv)
    try:
        print(sweep_report(args.folders) if args.sweep else "\n".join(folder_report(f) for f in args.folders))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
