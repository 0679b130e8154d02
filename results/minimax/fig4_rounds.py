"""FedMM Fig. 4 on MNIST -> MNIST-M-like at 16x16 (issue 47): the communication rounds FedMM needs for FedSGDA's
accuracy, from the committed per-round logs.

Usage: python results/minimax/fig4_rounds.py [--json OUT.json]

FedSGDA: experiments/minimax/mnistm16_fig4_suite.yaml (1,500 rounds; seed 0 tuned in two passes,
results/minimax/mnistm16_fig4 on {0.2, 0.4, 0.8} and results/minimax/mnistm16_fig4_wide on {0.05, 0.1, 0.2}, whose
final runs at the pick are the seed-0 runs; seeds 1 and 2 at seed 0's picks in results/minimax/mnistm16_fig4_seeds12).
FedMM: the Fig. 5 comparison's runs at its validation picks (150 rounds of M = 20 local steps; entries
fig5-mnistm16-dann, -cdan, -mdd). A run's level is the mean of its evaluations in the last tenth of its rounds
(FedMM rounds 140-150, FedSGDA 1,350-1,500: single evaluations of FedSGDA move by several points). Per loss and
seed, for two target accuracies A, FedMM's level and FedSGDA's: R_M and R_S, the first evaluated round at which
FedMM and FedSGDA reach A (None when a run does not within its rounds), and the rounds FedMM saves, 1 - R_M / R_S
(the paper's Fig. 4 claim: more than 90%).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedsolve.experiments.folders import read_jsonl

HERE = Path(__file__).resolve().parent
LOSSES = ("dann", "cdan", "mdd")
FEDMM = {  # (loss, seed) -> FedMM's run folder (Fig. 5 at the picks)
    **{("dann", 0): "mnistm16_dann/seed0_tune/FedMM/seed0"},
    **{("dann", s): f"mnistm16_dann/seeds12/dann/FedMM/seed{s}" for s in (1, 2)},
    **{(loss, 0): f"mnistm16_cdan_mdd/{loss}_seed0_tune/{loss}/FedMM/seed0" for loss in ("cdan", "mdd")},
    **{(loss, s): f"mnistm16_cdan_mdd/{loss}_seeds12/{loss}/FedMM/seed{s}" for loss in ("cdan", "mdd") for s in (1, 2)},
}


def fedsgda(loss: str, seed: int) -> str:
    return f"mnistm16_fig4_{'wide' if seed == 0 else 'seeds12'}/{loss}/FedSGDA/seed{seed}"


def curve(rel: str) -> list[tuple[int, float]]:
    return [(r["round"], r["test_accuracy"]) for r in read_jsonl(HERE / rel / "metrics.jsonl") if "test_accuracy" in r]


def level(c: list[tuple[int, float]]) -> float:
    """The mean of the evaluations in the last tenth of the run's rounds."""
    last = c[-1][0]
    return sum(tail := [a for r, a in c if r >= 0.9 * last]) / len(tail)


def first_at(c: list[tuple[int, float]], target: float) -> int | None:
    return next((r for r, a in c if r > 0 and a >= target), None)


def saved(r_m: int | None, r_s: int | None, n_m: int, n_s: int) -> str | None:
    """1 - R_M / R_S as a percentage; a bound where one run does not reach the target within its rounds (more than
    1 - R_M / n_s when FedSGDA does not; less than 1 - n_m / R_S when FedMM does not); None when neither does."""
    if r_m is not None and r_s is not None:
        return f"{1 - r_m / r_s:.1%}"
    if r_m is not None:
        return f"> {1 - r_m / n_s:.1%}"
    return None if r_s is None else f"< {1 - n_m / r_s:.1%}"


def cells() -> dict:
    out: dict = {}
    for loss in LOSSES:
        rows = []
        for seed in (0, 1, 2):
            sg, mm = curve(fedsgda(loss, seed)), curve(FEDMM[(loss, seed)])
            if not sg or not mm:
                continue
            row: dict = {"seed": seed, "fedmm": {"rounds": mm[-1][0], "final": round(100 * mm[-1][1], 2),
                                                 "level": round(100 * level(mm), 2)},
                         "fedsgda": {"rounds": sg[-1][0], "final": round(100 * sg[-1][1], 2),
                                     "level": round(100 * level(sg), 2)}}
            for name, target in (("to_fedmm_level", level(mm)), ("to_fedsgda_level", level(sg))):
                r_m, r_s = first_at(mm, target), first_at(sg, target)
                row[name] = {"fedmm_round": r_m, "fedsgda_round": r_s, "saved": saved(r_m, r_s, mm[-1][0], sg[-1][0])}
            rows.append(row)
        if rows:
            out[loss] = rows
    return out


def _cell(c: dict) -> str:
    m = "not reached" if c["fedmm_round"] is None else c["fedmm_round"]
    s = "not reached" if c["fedsgda_round"] is None else c["fedsgda_round"]
    return f"{m} / {s} | {c['saved'] or '-'}"


def markdown(res: dict) -> str:
    lines = ["| loss | seed | FedMM level (final) | FedSGDA level (final) | to FedMM's level: rounds FedMM / FedSGDA "
             "| saved | to FedSGDA's level: rounds FedMM / FedSGDA | saved |", "|---|---|---|---|---|---|---|---|"]
    for loss, rows in res.items():
        for r in rows:
            mm, sg = r["fedmm"], r["fedsgda"]
            lines.append(f"| {loss} | {r['seed']} | {mm['level']:.2f}% ({mm['final']:.2f}) | {sg['level']:.2f}% "
                         f"({sg['final']:.2f}) | {_cell(r['to_fedmm_level'])} | {_cell(r['to_fedsgda_level'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = cells()
    print(markdown(res))
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
