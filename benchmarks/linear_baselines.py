"""Seconds per round of FPFC's baselines on synthetic S2: the ``linear`` executor vs ``vectorized``.

Both executors run in this process on the same problem (FPFC synthetic S2 at the paper's sizes,
uniform features, multinomial logistic regression, 10 full-batch GD steps, lr 0.1, 30% participation)
and end in the same state up to float rounding (tests/test_linear_executor.py). Prints
``ratio <algorithm> vectorized/linear <value>``.

Usage: python benchmarks/linear_baselines.py [--rounds 50] [--algorithms local fedavg cfl pacfl]

IFCA is not among them: its client picks its start by the lowest loss among the cluster models, which is
not one stated descent, so the linear executor does not run it.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.data.synthetic import fpfc_synthetic  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.engine import Simulation, SimulationConfig  # noqa: E402

EXTRA = {"perfedavg": {"variant": "code"}}


def seconds_per_round(problem, name: str, executor: str, rounds: int) -> float:
    params = {"lr": 0.1, "local_epochs": 10, "batch_size": None, **EXTRA.get(name, {})}
    algo = get_algorithm(name)(params, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor,
                                                     metrics=[], sampling={"fraction": 0.3}), seed=0)
    sim.run_round(0)                      # warm-up
    t0 = time.perf_counter()
    for t in range(1, rounds):
        sim.run_round(t)
    return (time.perf_counter() - t0) / (rounds - 1)


def main(argv=None) -> dict[str, float]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--algorithms", nargs="+", default=["local", "fedavg", "cfl", "pacfl", "perfedavg"])
    ap.add_argument("--size-scale", type=float, default=1.0, help="scale the devices' sample sizes (smoke tests)")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds: at least 2 (the first round is a warm-up)")
    data = fpfc_synthetic("S2", seed=0, features="uniform", size_scale=args.size_scale)
    problem = FederatedProblem(data, build_model_fn("logreg", (60,), 10))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, S2 (m = 100), {args.rounds} rounds")
    ratios = {}
    for name in args.algorithms:
        lin = seconds_per_round(problem, name, "linear", args.rounds)
        vec = seconds_per_round(problem, name, "vectorized", args.rounds)
        ratios[name] = vec / lin
        print(f"{name}: linear {1000 * lin:.1f} ms  vectorized {1000 * vec:.1f} ms")
        print(f"ratio {name} vectorized/linear {vec / lin:.2f}")
    return ratios


if __name__ == "__main__":
    main()
