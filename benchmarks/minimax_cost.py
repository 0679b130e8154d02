"""Wall time of FedMM vs FedAvgGDA with the same M, batch, rounds and problem, measured in one run.

FedMM's extra work over FedAvgGDA is elementwise on the [d] parameter vector (the penalty mu (theta - theta_0) +
dual in every local step, the dual update and the corrected upload once per round), so the target is at most
2x FedAvgGDA's time (issue 33 acceptance).

Workloads (the from-scratch suite experiments/minimax/mnistm_dann_2clients.yaml):
  suite: that suite's problem (MNIST -> MNIST-M-like, 2 clients at p = 1, DANN, MLP features, M = 20, batch 64);
         needs the cached MNIST and scikit-image photos (fetched on first use);
  toy:   two moons -> rotated moons (no download), 2 clients at p = 1, the same solver settings.

Each algorithm runs ``--rounds`` rounds ``--repeats`` times, interleaved; the minimum time of each is compared.
Prints ``ratio fedmm fedavggda <FedMM time / FedAvgGDA time>`` (lower is better; 1.0 = the same cost).
Usage: python benchmarks/minimax_cost.py [--workload suite|toy] [--rounds 30] [--repeats 3] [--executor auto]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fedsolve.experiments.config import load_config
from fedsolve.experiments.runner import build_algorithm, build_problem
from fedsolve.engine.loop import Simulation

SUITE = Path(__file__).resolve().parent.parent / "experiments" / "minimax" / "mnistm_dann_2clients.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=["suite", "toy"], default="suite")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--executor", default="auto", choices=["auto", "sequential", "vectorized"])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    over = [f"simulation.rounds={a.rounds}", f"simulation.eval_every={a.rounds}", f"simulation.executor={a.executor}"]
    if a.workload == "toy":
        over += ["data.dataset=toy_domains", 'data.params={"p": 1.0, "n": 2000, "n_test": 200}']
    cfg = load_config(SUITE, over)
    problem = build_problem(cfg, seed=0)
    specs = {s.name: s for s in cfg.algorithms}
    times: dict[str, list[float]] = {"fedmm": [], "fedavggda": []}
    for _ in range(a.repeats):
        for name in times:
            algo = build_algorithm(cfg, specs[name], problem)
            sim = Simulation(problem, algo, cfg.simulation, seed=0)
            t0 = time.perf_counter()
            for t in range(a.rounds):
                sim.run_round(t)
            times[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    print(f"# workload {a.workload}, {a.rounds} rounds, M = {cfg.defaults.get('local_steps')}, "
          f"d = {problem.layout.dim}, executor {a.executor}; best of {a.repeats}: "
          + ", ".join(f"{k} {v:.3f} s" for k, v in best.items()))
    print(f"ratio fedmm fedavggda {best['fedmm'] / best['fedavggda']:.3f}")


if __name__ == "__main__":
    main()
