"""Prox-AL FL on the App. E.2 QP grid (paper 002, Table 4): time to Eq. 11's certificate and distance to the
exact optimum, against a SciPy client-by-client reference on the same instance in the same run.

For each (d, n, m~): Prox-AL FL with the paper's parameters (beta 10, s_bar 0.1, rho 1, q 0.9,
eps1 = eps2 = 1e-3, mu^0 = 0, w^0 on the unit sphere) runs in the engine with exact, batched subproblem
solves (``solver: quadratic``, vectorized executor) until Eq. 11 passes. The reference runs the SAME
algorithm with ``solver: scipy`` (L-BFGS-B one client at a time, gtol = eps_{t+1}, as the authors' code
does) for ``--ref-rounds`` rounds; its seconds per round times our round count is its time to the same
certificate. The exact optimum comes from one KKT linear solve. Prints per instance
``ratio qp(d,n,m) scipy_client_by_client/fedsolve <value>`` and the relative objective error.

Usage: python benchmarks/constrained_qp.py [--grid reduced|full] [--ref-rounds 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedsolve.algorithms import get_algorithm  # noqa: E402
from fedsolve.problem_kinds.constrained import qp_exact_solution, qp_problem  # noqa: E402
from fedsolve.simulation import Simulation, SimulationConfig  # noqa: E402

PAPER = {"beta": 10.0, "s_bar": 0.1, "rho": 1.0, "q": 0.9, "eps1": 1e-3, "eps2": 1e-3, "max_outer": 10000,
         "max_inner": 10000}
#: ``paper``: Table 4's setting. ``tight``: eps1 = eps2 = 1e-4 and Eq. 23 with the server's measured residual
#: (exact solves: Theorem 10 holds with it in place of q^t, spec 3.1), the setting that meets 1e-4 relative.
VARIANTS = {"paper": {}, "tight": {"eps1": 1e-4, "eps2": 1e-4, "inner_stop": "measured"}}
GRIDS = {"reduced": [(20, 1, 1), (20, 5, 1), (50, 5, 2), (100, 5, 1), (100, 10, 1)],
         "full": [(d, n, m) for n in (1, 5, 10) for d, m in ((100, 1), (300, 3), (500, 5))]}


def make_sim(prob, solver: str, executor: str, seed: int, rounds: int, variant: str = "paper") -> Simulation:
    algo = get_algorithm("proxal")({**PAPER, **VARIANTS[variant], "solver": solver}, prob)
    return Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=10 ** 9, executor=executor, metrics=[],
                                                   sampling={"fraction": 1.0}), seed=seed)


def ours(prob, seed: int, variant: str, cap: int = 20000) -> tuple[float, int, dict]:
    sim = make_sim(prob, "quadratic", "vectorized", seed, cap, variant)
    t0 = time.perf_counter()
    t = 0
    while t < cap and int(sim.server["phase"]) != 3:
        sim.run_round(t)
        t += 1
    return time.perf_counter() - t0, t, sim.server


def reference_seconds_per_round(prob, seed: int, rounds: int, variant: str) -> float:
    sim = make_sim(prob, "scipy", "sequential", seed, rounds, variant)
    t0 = time.perf_counter()
    for t in range(rounds):
        sim.run_round(t)
    return (time.perf_counter() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", choices=sorted(GRIDS), default="reduced")
    ap.add_argument("--ref-rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="paper,tight", help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--only", default=None, help="one instance d,n,m (e.g. 500,10,5)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"# grid {a.only or a.grid}, seed {a.seed}, torch threads {a.threads}")
    grid = [tuple(int(v) for v in a.only.split(","))] if a.only else GRIDS[a.grid]
    ours(qp_problem(5, 2, 1, seed=10), a.seed, "paper")      # warm-up: first-call costs of torch.func, imports
    reference_seconds_per_round(qp_problem(5, 2, 1, seed=10), a.seed, 2, "paper")
    for (d, n, m), variant in ((g, v) for g in grid for v in a.variants.split(",")):
        prob = qp_problem(d, n, m, seed=10)
        inst = prob.extras["qp_instance"]
        w_star, f_star = qp_exact_solution(inst)
        secs, rounds, server = ours(prob, a.seed, variant)
        w = server["w"].numpy()
        f = 0.5 * w @ inst["A"].sum(0) @ w + inst["b"].sum(0) @ w
        viol = max(float(np.abs(inst["C"][i] @ w + inst["d"][i]).max()) for i in range(n + 1))
        ref = reference_seconds_per_round(prob, a.seed, min(a.ref_rounds, rounds), variant)
        tag = f"qp(d={d},n={n},m={m},{variant})"
        print(f"{tag} rounds {rounds} outer {int(server['k'])} converged {int(server['converged'])} "
              f"seconds {secs:.2f} rel_obj_err {abs(f - f_star) / abs(f_star):.2e} "
              f"max_violation {viol:.2e} |w-w*|_inf {np.abs(w - w_star).max():.2e}")
        print(f"ratio {tag} scipy_client_by_client/fedsolve {ref * rounds / secs:.1f}")
        print(f"ratio {tag} authors_16.4s/fedsolve {16.4 / secs:.2f}")


if __name__ == "__main__":
    main()
