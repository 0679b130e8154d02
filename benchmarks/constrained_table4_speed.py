"""Table 4 (paper 002, App. E.2): Prox-AL FL in fedsolve against the authors' method, both timed in ONE process
on the same instances, interleaved, to the same tolerance.

For each (d, n, m~) of Table 4's grid (instance seed 10, w^0 on the unit sphere from ``--seed``, mu^0 = 0) and
each repeat, ours and every reference run from a fresh start to Eq. 11 one after another (the order reversed
on odd repeats), so that they share the machine's load:

* ours: the engine run of ``constrained_qp.ours`` (``solver: quadratic``, vectorized executor; round 0, where
  each client builds and packs its Hessian, included);
* ``authors``: ``authors_lcqp.authors_proxal`` with the paper's parties and the authors' subproblem solve (every
  round each party forms its d x d system and LU-solves it): the same iterates as ours, so the ratio compares the
  same iterations;
* ``code``: the authors' code as written (the server also an ADMM party, their Eq. 22): other iterates, the same
  point;
* ``cached``: ours' iterations in NumPy with Cholesky factors computed once (not the authors' method: the floor
  of a plain NumPy implementation).

Every run uses the parameters of ``--variant`` (default ``tuned``: beta 30, rho 4, eps1 = eps2 = 1e-4, the 1e-4
setting of results/constrained/README.md's Table 4); its rounds and distance to the exact optimum are printed, so
a reader sees that all reached the same point. Seconds are this one-threaded process's CPU clock (the steadier
one on a shared machine; the wall clock is printed too). Per instance: ``ratio constrained_table4 <instance>
<reference seconds / ours>``, the median over the repeats of the per-repeat ratios (each repeat's ratios and
their range on the line before), then the median over the instances and the range of the instance medians
(``constrained_table4_code``, ``constrained_table4_cached`` for the other references).

Usage: OMP_NUM_THREADS=1 python benchmarks/constrained_table4_speed.py [--repeats 5] [--only "500,10,5;100,1,1"]
       [--variant tuned] [--references authors,code,cached] [--seed 0] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling modules: the reference, constrained_qp
import numpy as np
import torch
from authors_lcqp import authors_proxal
from constrained_qp import GRIDS, PAPER, VARIANTS, load, make_sim, now, ours
from threadpoolctl import threadpool_limits

from fedsolve.engine.provenance import source_commit, versions
from fedsolve.families.constrained.kind import qp_exact_solution, qp_problem

#: reference name -> (authors_proxal's layout, solve) and the ratio's name
REFERENCES = {"authors": ("paper", "lu", "constrained_table4"), "code": ("code", "lu", "constrained_table4_code"),
              "cached": ("paper", "cached", "constrained_table4_cached")}


def reference(inst: dict, w0: np.ndarray, variant: str, name: str) -> tuple[np.ndarray, dict]:
    """One timed run of a reference: ``([wall, CPU] seconds, its result)``."""
    p = {**PAPER, **VARIANTS[variant]}
    layout, solve, _ = REFERENCES[name]
    stop = "paper" if p.get("inner_stop", "paper") == "paper" else "code"   # measured: exact solves' rounding
    t0 = now()
    out = authors_proxal(inst, w0, p["beta"], p["rho"], p["s_bar"], p["eps1"], p["eps2"], p["q"], stop, layout,
                         solve, p["max_outer"], p["max_inner"])
    return now() - t0, out


def errors(inst: dict, w: np.ndarray, w_star: np.ndarray, f_star: float) -> str:
    f = 0.5 * w @ inst["A"].sum(0) @ w + inst["b"].sum(0) @ w
    viol = max(float(np.abs(C @ w + dd).max()) for C, dd in zip(inst["C"], inst["d"]))
    return (f"rel_obj_err {abs(f - f_star) / abs(f_star):.2e} rel_w_err "
            f"{np.linalg.norm(w - w_star) / np.linalg.norm(w_star):.2e} max_violation {viol:.2e}")


def spread(values) -> str:
    return f"median {np.median(values):.2f}, range {min(values):.2f}-{max(values):.2f}, n = {len(values)}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default=None, help="instances d,n,m separated by ';' (default: Table 4's grid)")
    ap.add_argument("--variant", default="tuned", choices=sorted(VARIANTS))
    ap.add_argument("--references", default="authors,code,cached", help="comma-separated: " + ", ".join(REFERENCES))
    ap.add_argument("--seed", type=int, default=0, help="seed of w^0")
    ap.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (both sides)")
    a = ap.parse_args(argv)
    refs = [r for r in a.references.split(",") if r]
    if not refs or set(refs) - set(REFERENCES):
        ap.error(f"--references {a.references!r}; allowed: a comma-separated subset of {', '.join(REFERENCES)}")
    grid = [tuple(int(v) for v in g.split(",")) for g in a.only.split(";")] if a.only else GRIDS["full"]
    torch.set_num_threads(a.threads)
    commit, dirty = source_commit()
    print(f"# Table 4 speed, one process: {'; '.join(f'{d},{n},{m}' for d, n, m in grid)}; variant {a.variant} "
          f"{VARIANTS[a.variant]}; w^0 seed {a.seed}; {a.repeats} repeats; torch and BLAS threads {a.threads}; "
          f"commit {commit} (package tree dirty: {dirty}); {versions()}; {load()}", flush=True)
    out = {"instances": {}, "median": {}}
    with threadpool_limits(limits=a.threads):
        warm = qp_problem(5, 2, 1, seed=10)       # first-call costs of torch.func, LAPACK, imports
        ours(warm, a.seed, a.variant)
        for r in refs:
            reference(warm.extras["qp_instance"], np.ones(5) / 5 ** 0.5, a.variant, r)
        for d, n, m in grid:
            tag = f"d{d}_n{n}_m{m}"
            prob = qp_problem(d, n, m, seed=10)
            inst = prob.extras["qp_instance"]
            w_star, f_star = qp_exact_solution(inst)
            w0 = make_sim(prob, "quadratic", "vectorized", a.seed, 1, a.variant).server["w0"].numpy()
            secs = {k: [] for k in ["ours", *refs]}
            for rep in range(a.repeats):
                order = ["ours", *refs] if rep % 2 == 0 else [*refs, "ours"]
                for who in order:
                    if who == "ours":
                        s, rounds, server = ours(prob, a.seed, a.variant)
                        w, line = server["w"].numpy(), (f"rounds {rounds} outer {int(server['k'])} admm_rounds "
                                                        f"{int(server['admm_rounds'])} converged "
                                                        f"{int(server['converged'])}")
                    else:
                        s, res = reference(inst, w0, a.variant, who)
                        w, line = res["w"], (f"outer {res['outer']} admm_rounds {res['admm_rounds']} converged "
                                             f"{int(res['converged'])}")
                    secs[who].append(s)
                    if rep == 0:
                        print(f"qp {tag} {who}: {line} {errors(inst, w, w_star, f_star)}", flush=True)
            print(f"  {tag} CPU s: " + "; ".join(f"{k} " + " ".join(f"{v[1]:.3f}" for v in s)
                                                  for k, s in secs.items()) + f" ({load()})", flush=True)
            print(f"  {tag} wall s: " + "; ".join(f"{k} " + " ".join(f"{v[0]:.3f}" for v in s)
                                                   for k, s in secs.items()), flush=True)
            out["instances"][tag] = {}
            for r in refs:
                ratios = [ref[1] / mine[1] for ref, mine in zip(secs[r], secs["ours"])]   # paired by repeat
                walls = [ref[0] / mine[0] for ref, mine in zip(secs[r], secs["ours"])]
                out["instances"][tag][r] = ratios
                print(f"  {tag} {r} / ours per repeat (CPU): " + " ".join(f"{v:.2f}" for v in ratios) +
                      f" ({spread(ratios)}); wall clock: {spread(walls)}", flush=True)
                print(f"ratio {REFERENCES[r][2]} {tag} {np.median(ratios):.2f}", flush=True)
    for r in refs:
        med = [float(np.median(v[r])) for v in out["instances"].values()]
        out["median"][r] = float(np.median(med))
        print(f"# {REFERENCES[r][2]}: instance medians {spread(med)}", flush=True)
        print(f"ratio {REFERENCES[r][2]} median {np.median(med):.2f}", flush=True)
    return out


if __name__ == "__main__":
    main()
