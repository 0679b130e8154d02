"""Relative differences to cProx-AL of finished `fedsolve compare` runs, per client (the paper's metric) and of
the total objective, for every cell and method found under the given folders.

Usage: python experiments/constrained/reldiff.py [ROOT ...] [--ref cProx-AL]

A cell is what fedsolve.families.constrained.runs.run_key groups (problem kind, dataset, n, data limits, round
budget); within it each method's seeds are paired with the reference method's same seed (the same w^0). Per
client: |L_i - L_i^ref| / |L_i^ref| for every client of every paired seed, mean (std) pooled over clients x
seeds as paper 002's Tables 1 and 2 report it (f_i from the certificate's ``objective_clients``, or recomputed
from the run's final ``w`` for runs recorded before that list existed). Total: |f - f^ref| / |f^ref| per seed,
mean (std) over seeds. Prints one markdown row per (cell, method).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import yaml

from fedsolve.families.constrained.kkt import client_objectives
from fedsolve.experiments.config import parse_config
from fedsolve.experiments.runner import build_problem
from fedsolve.families.constrained.runs import finished_runs

_PROBLEMS: dict[tuple, object] = {}


def per_client(key: tuple, folder, summary: dict) -> list[float] | None:
    """f_i(w) of every client of a run (None: it recorded neither the list nor its final w)."""
    cert = summary["extras"]["constrained"]
    if "objective_clients" in cert:
        return list(cert["objective_clients"])
    if cert.get("w") is None:
        return None
    if key not in _PROBLEMS:
        raw = yaml.safe_load((folder / "config.yaml").read_text())
        raw["algorithm"] = {"name": "cproxal"}   # the parties only: an old run's options may be gone since
        cfg = parse_config(raw)
        _PROBLEMS[key] = build_problem(cfg, int(summary["seed"]))
    problem = _PROBLEMS[key]
    return client_objectives(problem.extras["constraints"], problem.data,
                             torch.tensor(cert["w"], dtype=torch.float64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="*", default=["runs/constrained"])
    ap.add_argument("--ref", default="cProx-AL")
    a = ap.parse_args()
    print("| kind | dataset | n | limit | rounds | method | seeds | per client: mean (std) | total: mean (std) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, labels in sorted(finished_runs(a.roots).items(), key=lambda kv: str(kv[0])):
        ref = labels.get(a.ref)
        if ref is None:
            continue
        kind, dataset, n, limit, _, rounds = key
        for label, seeds in sorted(labels.items()):
            if label == a.ref:
                continue
            pcs, tot, used = [], [], []
            for seed, (folder, summ) in sorted(seeds.items()):
                if seed not in ref or "constrained" not in (summ.get("extras") or {}):
                    continue
                rfolder, rsumm = ref[seed]
                mine, theirs = per_client(key, folder, summ), per_client(key, rfolder, rsumm)
                if mine is None or theirs is None:
                    continue
                pcs += [abs(x - y) / abs(y) for x, y in zip(mine, theirs) if y != 0]
                f, fr = summ["extras"]["constrained"]["objective"], rsumm["extras"]["constrained"]["objective"]
                tot.append(abs(f - fr) / abs(fr))
                used.append(seed)
            if used:
                print(f"| {kind} | {dataset} | {n} | {limit} | {rounds} | {label} | {len(used)} | "
                      f"{statistics.mean(pcs):.2e} ({statistics.pstdev(pcs):.2e}) | "
                      f"{statistics.mean(tot):.2e} ({statistics.pstdev(tot):.2e}) |")


if __name__ == "__main__":
    main()
