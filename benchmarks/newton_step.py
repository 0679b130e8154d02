"""Prox-AL FL's client Newton step on a nonconvex subproblem: ``newton_step: modified`` (the default) against
``plain``, on the same fairness instance in the same process.

Workload: Table 2's fairness problem (Eq. 32, UCI Adult, 3,000 client rows and 1,000 server rows, the authors'
code parameters beta 50, s_bar 1e-2, rho 0.1, inner cap 2,000) at n = 20, vectorized executor, ``--rounds``
engine rounds from a fresh start. At seed 9 the clients' subproblems become indefinite in the first inner loop
(the fairness constraint is a difference of convex losses); at seed 0 few do. The two steps alternate, ``--reps``
times each after an untimed warm-up of each; the medians of the process CPU time (one thread) are compared.
Prints per seed

    ratio newton_step seed<s>_modified_vs_plain <plain CPU s / modified CPU s>

and, per step, the client solves stopped above Eq. 19's tolerance and the ADMM residual (``inner_gap``) at the end.
Usage: python benchmarks/newton_step.py [--seeds 9,0] [--rounds 150] [--reps 1]   (reads Adult from the data cache)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.experiments.config import load_config  # noqa: E402
from fedsolve.experiments.runner import build_problem  # noqa: E402
from fedsolve.engine import Simulation  # noqa: E402

EXPERIMENT = "experiments/constrained/table2_fairness_adult.yaml"
LABEL = "Prox-AL FL (code params)"


def one_run(seed: int, rounds: int, step: str) -> tuple[float, dict]:
    cfg = load_config(EXPERIMENT, ["data.num_clients=20", "simulation.executor=vectorized",
                                   f"simulation.rounds={rounds}", "simulation.eval_every=1000000"])
    entry = next(a for a in cfg.algorithms if a.label == LABEL)
    problem = build_problem(cfg, seed)
    algo = get_algorithm(entry.name)({**entry.params, "max_inner": 2000, "newton_step": step}, problem)
    sim = Simulation(problem, algo, cfg.simulation, seed=seed)
    t0 = time.process_time()
    result = sim.run()
    cpu = time.process_time() - t0
    return cpu, {"misses": int(result.server["solve_misses"]), "inner_gap": float(result.server["gap"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="9,0")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for seed in (int(s) for s in args.seeds.split(",")):
        times: dict[str, list[float]] = {"plain": [], "modified": []}
        info = {}
        for step in times:   # warm-up (first-call costs of torch.func and the data cache), not timed
            one_run(seed, 2, step)
        for _ in range(args.reps):
            for step in times:
                cpu, info[step] = one_run(seed, args.rounds, step)
                times[step].append(cpu)
        med = {k: statistics.median(v) for k, v in times.items()}
        for step in times:
            print(f"seed {seed} {step}: CPU {med[step]:.1f} s (runs {', '.join(f'{t:.1f}' for t in times[step])}), "
                  f"solves above tolerance {info[step]['misses']}, inner gap {info[step]['inner_gap']:.3g}")
        print(f"ratio newton_step seed{seed}_modified_vs_plain {med['plain'] / med['modified']:.2f}")


if __name__ == "__main__":
    main()
