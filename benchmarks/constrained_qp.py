"""Prox-AL FL on the App. E.2 QP grid (paper 002, Table 4): time to Eq. 11's certificate and distance to the
exact optimum, against a SciPy client-by-client reference on the same instance in the same run.

For each (d, n, m~) and variant: Prox-AL FL (beta 10, s_bar 0.1, rho 1, q 0.9, mu^0 = 0, w^0 on the unit
sphere) runs in the engine from a fresh start with exact, batched subproblem solves (``solver: quadratic``,
vectorized executor by default; round 0, where each client builds its quadratic model and packs its Hessian
with its inverse, is included) until Eq. 11 passes. ``--repeats R``: our run and the dense reference are
timed R times, interleaved, and their medians are reported (the L-BFGS-B reference once).

Reference 1 (``vs_scipy_lbfgsb``): the SAME algorithm with ``solver: scipy`` (L-BFGS-B one client at a time, gtol = eps_{t+1}, as
the authors' code), sequential executor. Its round 0 is timed from a fresh start; then ``--ref-rounds``
rounds spread evenly over our run are timed from our run's own states at those rounds (every client's
mu_i, u_i, lambda_i, u~_i and the server state copied in), so the sample covers early loose and late tight
tolerances. Reference seconds = round 0 + mean sampled round x (our rounds - 1). The exact optimum comes
from one KKT linear solve. Reference 2 (``vs_scipy_dense_solve``): an ESTIMATE of a dense solve per party and
round, client by client (:func:`dense_reference_seconds`: Cholesky, 10 rounds timed and scaled; the authors'
code LU-solves a freshly formed system: benchmarks/authors_lcqp.py, run to Eq. 11 beside ours in
benchmarks/constrained_table4_speed.py, the same-run reference of the Table 4 speed claim).
Times are taken on both the wall clock and this process's CPU clock (one thread: on a shared, loaded
machine the CPU clock is the steadier; ratios without suffix are CPU, ``_wall`` wall clock). Prints per
instance ``ratio constrained_qp <instance>_vs_<reference> <reference seconds / ours>`` and 16.4 s / ours
(``vs_authors_16.4s``: a constant, a time once reported for the authors' code at (500, 10, 5), not a reference
run beside ours; kept for the older result files), with the load average.

Usage: python benchmarks/constrained_qp.py [--grid reduced|full] [--variants paper,tight] [--ref-rounds 10]
       [--only 500,10,5] [--repeats 3] [--references dense,lbfgsb] [--executor vectorized]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.core.states import ClientStates  # noqa: E402
from fedsolve.families.constrained.kind import qp_exact_solution, qp_problem  # noqa: E402
from fedsolve.engine import Simulation, SimulationConfig  # noqa: E402

PAPER = {"beta": 10.0, "s_bar": 0.1, "rho": 1.0, "q": 0.9, "eps1": 1e-3, "eps2": 1e-3, "max_outer": 10000,
         "max_inner": 10000}
#: ``paper``: Table 4's setting. ``tight``: eps1 = eps2 = 1e-4 and Eq. 23 with the server's measured residual
#: (exact solves: Theorem 10 holds with it in place of q^t, spec 3.1), the setting that meets 1e-4 relative.
VARIANTS = {"paper": {}, "tight": {"eps1": 1e-4, "eps2": 1e-4, "inner_stop": "measured"},
            "tight3": {"eps1": 3e-5, "eps2": 3e-5, "inner_stop": "measured"},   # tight with eps 3e-5 (n = 1 rows)
            "code": {"inner_stop": "code"},   # code: the authors' Eq. 23 (no server term), paper's eps
            # tuned: tight with beta 30, rho 4 (a sweep over beta in {10..50}, rho in {0.5..5}, s_bar in {0.01..0.1}
            # on the grid, results/constrained/README.md): 1e-4 relative on every row, fewer rounds at n = 10
            "tuned": {"eps1": 1e-4, "eps2": 1e-4, "inner_stop": "measured", "beta": 30.0, "rho": 4.0},
            # tuned5: tuned with eps 5e-5 -- also the objective within 1e-4 relative at n = 1 for every w^0 tried
            # (at (500, 1, 5) f* = -0.042, so 1e-4 of it is 4e-6: tuned gives up to 3e-4 there, its point 1.4e-5)
            "tuned5": {"eps1": 5e-5, "eps2": 5e-5, "inner_stop": "measured", "beta": 30.0, "rho": 4.0}}
GRIDS = {"reduced": [(20, 1, 1), (20, 5, 1), (50, 5, 2), (100, 5, 1), (100, 10, 1)],
         "full": [(d, n, m) for n in (1, 5, 10) for d, m in ((100, 1), (300, 3), (500, 5))]}


def now() -> np.ndarray:
    """``[wall, CPU]`` seconds: differences give both clocks (the CPU clock of this one-threaded process is the
    steadier one on a shared machine)."""
    return np.array([time.perf_counter(), time.process_time()])


def load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def make_sim(prob, solver: str, executor: str, seed: int, rounds: int, variant: str = "paper") -> Simulation:
    algo = get_algorithm("proxal")({**PAPER, **VARIANTS[variant], "solver": solver}, prob)
    return Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=10 ** 9, executor=executor, metrics=[],
                                                   sampling={"fraction": 1.0}), seed=seed)


def ours(prob, seed: int, variant: str, cap: int = 20000, visit=None, executor: str = "vectorized"
         ) -> tuple[np.ndarray, int, dict]:
    """Our run to Eq. 11 (or ``cap`` rounds): ``([wall, CPU] seconds, rounds, server state)``; ``visit(sim, t)`` is called
    before round t (untimed runs only)."""
    sim = make_sim(prob, "quadratic", executor, seed, cap, variant)
    t0 = now()
    t = 0
    while t < cap and not sim.algo.phases.finished(sim.server):
        if visit is not None:
            visit(sim, t)
        sim.run_round(t)
        t += 1
    return now() - t0, t, sim.server


def reference_seconds(prob, seed: int, variant: str, rounds: int, samples: int) -> tuple[np.ndarray, ...]:
    """SciPy client by client: ``(estimated [wall, CPU] seconds for our round count, its round 0, mean sampled
    round)``."""
    ref = make_sim(prob, "scipy", "sequential", seed, rounds, variant)
    t0 = now()
    ref.run_round(0)
    first = now() - t0
    marks = sorted({int(v) for v in np.linspace(1, rounds - 1, samples)}) if rounds > 1 else []
    times: list[np.ndarray] = []

    def visit(sim, t):
        if t not in marks:
            return
        server = {k: v.clone() for k, v in sim.server.items() if k != "hkey"}
        ref.set_state(server, ClientStates(sim.problem.num_clients, {k: sim.clients[k].clone()
                                                                     for k in ("mu", "wk", "u", "lam", "ut")}))
        t1 = now()
        ref.run_round(t)
        times.append(now() - t1)

    ours(prob, seed, variant, rounds, visit)      # untimed: the same iterates again, with the snapshots
    mean = np.mean(times, axis=0) if times else np.zeros(2)
    return first + mean * (rounds - 1), first, mean


def dense_reference_seconds(inst: dict, variant: str, w0: np.ndarray, rounds: int, outer: int,
                            samples: int) -> np.ndarray:
    """An estimate of a dense solve per party and round, client by client: every round the server and then each
    client solve their dense d x d system (``scipy.linalg.solve``, Cholesky-based ``assume_a="pos"``; the authors'
    code LU-solves, ``authors_lcqp.py``) and each client
    forms ``H_i w`` for Eq. 22. The cost of a round does not depend on the iterates: ``samples`` real ADMM rounds
    from w^0 are timed (after the systems are formed, which is counted once per outer iteration) and scaled to
    our round count."""
    from scipy.linalg import solve

    p = {**PAPER, **VARIANTS[variant]}
    A, b, C, dd = inst["A"], inst["b"], inst["C"], inst["d"]
    n, d = A.shape[0], A.shape[1]
    beta, rho = p["beta"], p["rho"]
    sig, eye = 1.0 / ((n + 1) * beta), np.eye(d)
    t0 = now()
    Q = [A[i] + beta * C[i + 1].T @ C[i + 1] + (sig + rho) * eye for i in range(n)]
    Q0 = beta * C[0].T @ C[0] + (sig + n * rho) * eye
    g0 = [b[i] + beta * C[i + 1].T @ dd[i + 1] - sig * w0 for i in range(n)]    # grad P_i(0) at mu = 0
    form = now() - t0
    lam = np.stack([-(Q[i] @ w0 - rho * w0 + g0[i]) for i in range(n)])
    ut = w0 + lam / rho
    times = []
    for _ in range(samples):
        t1 = now()
        z = solve(Q0, sig * w0 + rho * ut.sum(0) - beta * C[0].T @ dd[0], assume_a="pos")
        for i in range(n):
            np.abs(Q[i] @ z - rho * z + g0[i] - rho * (z - ut[i])).max()              # Eq. 22
            u = solve(Q[i], rho * z - g0[i] - lam[i], assume_a="pos")                  # Eq. 19
            lam[i] = lam[i] + rho * (u - z)
            ut[i] = u + lam[i] / rho
        times.append(now() - t1)
    return form * outer + np.mean(times, axis=0) * rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", choices=sorted(GRIDS), default="reduced")
    ap.add_argument("--ref-rounds", type=int, default=10, help="sampled reference rounds per instance")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="paper,tight", help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--only", default=None, help="instances d,n,m separated by ';' (e.g. 500,10,5)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of ours and the dense reference (medians)")
    ap.add_argument("--references", default="dense,lbfgsb", help="comma-separated: dense, lbfgsb")
    ap.add_argument("--executor", default="vectorized", choices=("vectorized", "sequential"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    refs = set(a.references.split(",")) - {""}
    print(f"# grid {a.only or a.grid}, seed {a.seed}, torch threads {a.threads}, executor {a.executor}, "
          f"{a.repeats} repeats, {a.ref_rounds} sampled reference rounds, {load()}")
    grid = [tuple(int(v) for v in g.split(",")) for g in a.only.split(";")] if a.only else GRIDS[a.grid]
    warm = qp_problem(5, 2, 1, seed=10)          # warm-up: first-call costs of torch.func, SciPy, imports
    ours(warm, a.seed, "paper", executor=a.executor)
    reference_seconds(warm, a.seed, "paper", 5, 2)
    for (d, n, m), variant in ((g, v) for g in grid for v in a.variants.split(",")):
        prob = qp_problem(d, n, m, seed=10)
        inst = prob.extras["qp_instance"]
        w_star, f_star = qp_exact_solution(inst)
        w0 = make_sim(prob, "quadratic", "vectorized", a.seed, 1, variant).server["w0"].numpy()
        mine, dense = [], []
        for _ in range(a.repeats):   # interleaved: both see the same load
            secs, rounds, server = ours(prob, a.seed, variant, executor=a.executor)
            mine.append(secs)
            if "dense" in refs:
                dense.append(dense_reference_seconds(inst, variant, w0, rounds, int(server["k"]), a.ref_rounds))
        secs = np.median(mine, axis=0)
        refs_s = {}
        if dense:
            refs_s["scipy_dense_solve"] = np.median(dense, axis=0)
        if "lbfgsb" in refs:
            ref, first, per_round = reference_seconds(prob, a.seed, variant, rounds, a.ref_rounds)
            refs_s["scipy_lbfgsb"] = ref
        w = server["w"].numpy()
        f = 0.5 * w @ inst["A"].sum(0) @ w + inst["b"].sum(0) @ w
        viol = max(float(np.abs(inst["C"][i] @ w + inst["d"][i]).max()) for i in range(n + 1))
        tag = f"d{d}_n{n}_m{m}_{variant}"
        print(f"qp {tag} rounds {rounds} outer {int(server['k'])} converged {int(server['converged'])} "
              f"rel_obj_err {abs(f - f_star) / abs(f_star):.2e} max_violation {viol:.2e} "
              f"|w-w*|_inf {np.abs(w - w_star).max():.2e} "
              f"rel_w_err {np.linalg.norm(w - w_star) / np.linalg.norm(w_star):.2e} ({load()})", flush=True)
        for j, clock in enumerate(("wall", "cpu")):
            spread = " ".join(f"{v[j]:.2f}" for v in mine)
            print(f"  {clock}: ours {secs[j]:.2f} s ({1e3 * secs[j] / rounds:.1f} ms per round; runs {spread}), "
                  + ", ".join(f"{k} {v[j]:.1f} s" for k, v in refs_s.items()), flush=True)
            suffix = "" if clock == "cpu" else "_wall"
            for k, v in refs_s.items():
                print(f"ratio constrained_qp {tag}_vs_{k}{suffix} {v[j] / secs[j]:.1f}", flush=True)
            print(f"ratio constrained_qp {tag}_vs_authors_16.4s{suffix} {16.4 / secs[j]:.2f}", flush=True)


if __name__ == "__main__":
    main()
