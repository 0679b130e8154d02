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

``python -m fedsolve.families.personalized.figures FOLDER...`` prints both tables for each compare folder; with
``--merge`` the folders are one comparison kept in pieces (seed 0 in one folder, seeds 1 and 2 in another; or a run
re-done at a re-tuned pick in a folder of its own, which replaces the same method and seed); with ``--sweep`` one
training-loss table whose rows are the folders (Fig. 7's participation fractions).
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


def seed_runs(folder: Path) -> dict[str, dict[int, list[dict]]]:
    """``label -> {seed: records}`` of a compare folder, in the order of its ``summary.json``."""
    folder = Path(folder)
    labels = list(json.loads((folder / "summary.json").read_text()).get("algorithms") or [])
    if not labels:
        raise ValueError(f"{folder / 'summary.json'}: no algorithms; allowed: a compare folder's summary")
    out: dict[str, dict[int, list[dict]]] = {}
    for run in sorted(folder.glob("*/seed*/summary.json")):
        meta = json.loads(run.read_text())
        label = meta.get("label") or run.parent.parent.name
        seed = meta["seed"] if "seed" in meta else int(run.parent.name.removeprefix("seed"))
        if label in labels:
            out.setdefault(label, {})[int(seed)] = run_records(run.parent)
    missing = [k for k in labels if k not in out]
    if missing:
        raise FileNotFoundError(f"{folder}: no run folder of {missing[0]!r}")
    return {k: out[k] for k in labels}


def method_runs(folder: Path) -> dict[str, list[list[dict]]]:
    """``label -> [records of each seed]`` of a compare folder, in the order of its ``summary.json``."""
    return merged_runs([folder])


def merged_runs(folders: Sequence[Path]) -> dict[str, list[list[dict]]]:
    """``label -> [records of each seed]`` of one comparison kept in several compare folders: the first holds every
    method; a later folder's run adds a seed or replaces the same method and seed (a re-run at a re-tuned pick)."""
    base = seed_runs(folders[0])
    for f in folders[1:]:
        for label, runs in seed_runs(f).items():
            if label not in base:
                raise ValueError(
                    f"{f}: method {label!r}; allowed with --merge: the methods of {folders[0]} ({', '.join(base)})"
                )
            base[label].update(runs)
    return {k: [v[s] for s in sorted(v)] for k, v in base.items()}


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


def early_mean(curve: dict[int, float]) -> float | None:
    """Mean of a curve's evaluations in rounds 1-30 (Fig. 5's bar), None when it has none there."""
    early = [v for t, v in curve.items() if 1 <= t <= EARLY]
    return statistics.fmean(early) if early else None


def drift_rows(drifts: dict[str, dict[int, float]], per_seed: dict[str, list[float | None]] | None = None) -> list[str]:
    """Markdown rows ``| name | mean over the evaluations of rounds 1-30 | last round |`` (and, with ``per_seed``,
    each seed's own rounds 1-30 mean)."""
    rows = []
    for name, c in drifts.items():
        e = early_mean(c)
        row = f"| {name} | {e:.3f} | {c[max(c)]:.3f} |" if e is not None and c else f"| {name} | - | - |"
        if per_seed is not None:
            row += " " + ", ".join("-" if v is None else f"{v:.3f}" for v in per_seed[name]) + " |"
        rows.append(row)
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


def folder_report(folder: Path, runs: dict[str, list[list[dict]]] | None = None) -> str:
    """Figs. 4 and 5 of one compare folder (module docstring), as markdown; ``runs`` in place of the folder's own
    (``merged_runs``), ``folder`` then naming the table."""
    runs = method_runs(folder) if runs is None else runs
    n = {len(v) for v in runs.values()}
    lines = [f"### {Path(folder).name} (seeds per method: {', '.join(map(str, sorted(n)))})", ""]
    lines += _loss_section({k: seed_mean(v, "train_loss") for k, v in runs.items()}, "method", "Fig. 4")
    drifts = {k: seed_mean(v, "local_drift") for k, v in runs.items()}
    per_seed = {k: [early_mean(seed_mean([recs], "local_drift")) for recs in v] for k, v in runs.items()}
    lines += [
        "Model deviation (Fig. 5; seed-mean local_drift):",
        "",
        f"| method | mean of the evaluations in rounds 1-{EARLY} | last round | each seed's rounds 1-{EARLY} mean |",
        "|---|---|---|---|",
    ]
    lines += [*drift_rows(drifts, per_seed), ""]
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
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="one training-loss table, a row per folder (Fig. 7)")
    mode.add_argument(
        "--merge",
        action="store_true",
        help="the folders hold one comparison in pieces: one table (a later folder's run adds a seed or "
        "replaces the same method and seed)",
    )
    args = ap.parse_args(argv)
    try:
        if args.sweep:
            print(sweep_report(args.folders))
        elif args.merge:
            print(folder_report(Path(" + ".join(Path(f).name for f in args.folders)), merged_runs(args.folders)))
        else:
            print("\n".join(folder_report(f) for f in args.folders))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
