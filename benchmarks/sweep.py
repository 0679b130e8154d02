"""A sweep as one batch against the same runs one after another (issue 48 item 3), in one process.

Workload: FedAvg on the MNIST-shaped MLP 784-200-200-10 (synthetic MNIST-shaped data unless ``--mnist``), ``--clients``
clients of ``--samples`` samples, 1 epoch of batch 50, every client every round; a sweep of ``--seeds`` seeds x
``--lrs`` step sizes (default 4 x 4 = 16 runs), ``--rounds`` rounds each, evaluation only at the end.

Contenders, interleaved ``--repeats`` times (the best of each is kept):
  separate   the 16 runs one after another, each ``Simulation.run()`` on the ``batched`` executor;
  sweep      the 16 runs together (``engine/sweep.py``: one SweepTransport, one batched call per round).
Each sweep run's final metrics are checked against its separate run (round-off only).

Prints ``ratio sweep16 separate16 <separate seconds / sweep seconds>`` (above 1: the sweep is faster) and
``ratio sweep16 one_run <sweep seconds / one run's seconds>`` (the issue's GPU target is at most 2).

Usage: python benchmarks/sweep.py [--clients 100] [--samples 600] [--rounds 3] [--seeds 4] [--lrs 4] [--repeats 2]
       [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedsolve.data.federated import FederatedData
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.sweep import SweepTransport, run_sweep
from fedsolve.families import get_algorithm
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem


def problem(seed: int, clients: int, samples: int) -> FederatedProblem:
    g = torch.Generator().manual_seed(seed)
    n = clients * samples
    x = torch.rand(n, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    off = torch.arange(0, n + 1, samples)
    tx, ty = x[:clients * 10], y[:clients * 10]
    data = FederatedData(x, y, off, tx, ty, torch.arange(0, clients * 10 + 1, 10), num_classes=10, name="mnist-shaped")
    return FederatedProblem(data, build_model_fn("mlp", (1, 28, 28), 10, hidden=(200, 200)))


def sims(args, transport=None):
    cfg = SimulationConfig(rounds=args.rounds, eval_every=args.rounds, executor="batched", metrics=[],
                           device=args.device)
    lrs = [0.01 * 2 ** i for i in range(args.lrs)]
    out = []
    for seed in range(args.seeds):
        prob = problem(seed, args.clients, args.samples)
        for lr in lrs:
            algo = get_algorithm("fedavg")({"lr": lr, "batch_size": 50, "local_epochs": 1}, prob)
            out.append(Simulation(prob, algo, cfg, seed, transport=transport))
    return out


def main() -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--clients", type=int, default=100)
    a.add_argument("--samples", type=int, default=600)
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--seeds", type=int, default=4)
    a.add_argument("--lrs", type=int, default=4)
    a.add_argument("--repeats", type=int, default=2)
    a.add_argument("--device", default="cpu")
    args = a.parse_args()
    n = args.seeds * args.lrs
    best = {"separate": float("inf"), "sweep": float("inf"), "one": float("inf")}
    for _ in range(args.repeats):
        runs = sims(args)
        t0 = time.perf_counter()
        alone = [s.run() for s in runs]
        sep = time.perf_counter() - t0
        best["separate"] = min(best["separate"], sep)
        best["one"] = min(best["one"], sep / n)
        shared = SweepTransport()
        together = sims(args, shared)
        t0 = time.perf_counter()
        res = run_sweep(together)
        best["sweep"] = min(best["sweep"], time.perf_counter() - t0)
        worst = max(abs(a.history[-1]["test_loss"] - b.history[-1]["test_loss"]) for a, b in zip(alone, res))
        print(f"seconds separate {sep:.2f} sweep {best['sweep']:.2f}; batched rounds {shared.batched_rounds}; "
              f"largest final test-loss difference {worst:.2e}")
    print(f"ratio sweep{n} separate{n} {best['separate'] / best['sweep']:.2f}")
    print(f"ratio sweep{n} one_run {best['sweep'] / best['one']:.2f}")


if __name__ == "__main__":
    main()
