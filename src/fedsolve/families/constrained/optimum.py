"""The exact optimum of the Neyman-Pearson problem (Eq. 30) at n = 1, to see how far an eps-KKT point sits from it.

On the pooled data Eq. 30 is convex with a strictly feasible point, so its optimum minimises the Lagrangian
``L0(w) + mu L1(w)`` (class-0 and class-1 mean logistic losses) for the multiplier ``mu*`` at which the class-1
loss equals r (or mu* = 0 when the constraint is inactive). :func:`np_optimum` follows the minimisers along a path
of mu (SciPy's L-BFGS-B to a 1e-12 gradient) and then bisects log mu for ``L1 = r``. On WDBC (``breast_cancer``)
the optimum has objective ~1.7e-6 at ``||w||_inf`` ~ 900: the rows are nearly separable without an intercept, so
an eps = 1e-3 KKT point (objective ~5e-3) is far above it (results/constrained/README.md, Table 1 findings).

The suite ``experiments/constrained/np_optimum.yaml`` (protocol ``np_optimum``) reports it per dataset.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.families.constrained.runs import SetWhen, cell_context


def lagrangian_minimiser(x0: np.ndarray, x1: np.ndarray, mu: float, w: np.ndarray) -> np.ndarray:
    """``argmin_w L0(w) + mu L1(w)`` from ``w``: the mean logistic losses of the class-0 rows ``x0`` (label 0) and
    the class-1 rows ``x1`` (label 1)."""
    from scipy.optimize import minimize
    from scipy.special import expit

    def fun(v):
        z0, z1 = x0 @ v, x1 @ v
        val = np.logaddexp(0, z0).mean() + mu * np.logaddexp(0, -z1).mean()
        return val, x0.T @ expit(z0) / len(z0) - mu * x1.T @ expit(-z1) / len(z1)

    return minimize(
        fun, w, jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 100000, "maxcor": 50}
    ).x


def np_optimum(x: np.ndarray, y: np.ndarray, r: float, steps: int = 40) -> dict[str, Any]:
    """Eq. 30's optimum at n = 1 on the rows ``(x, y)`` (labels 0/1) with class-1 level ``r``: ``mu_star``,
    ``objective`` (L0), ``class1_loss`` (L1), ``w_inf`` (``||w*||_inf``), ``active`` (1 where the constraint binds)
    and ``path``, the Lagrangian minimisers ``(mu, L0, L1, ||w||_inf)`` for mu = 10, 10^0.5, ... until L1 > r."""
    x0, x1 = x[y == 0], x[y == 1]
    l0 = lambda v: float(np.logaddexp(0, x0 @ v).mean())
    l1 = lambda v: float(np.logaddexp(0, -(x1 @ v)).mean())
    w, path, last = np.zeros(x.shape[1]), [], []
    for mu in [10.0**e for e in np.arange(1.0, -6.5, -0.5)]:
        w = lagrangian_minimiser(x0, x1, mu, w)
        path.append((mu, l0(w), l1(w), float(np.abs(w).max())))
        last.append((mu, w.copy()))
        if l1(w) > r:
            break
    if l1(last[-1][1]) <= r:  # inactive down to the smallest mu: the unconstrained minimiser is optimal
        w = last[-1][1]
        return {
            "mu_star": 0.0,
            "objective": l0(w),
            "class1_loss": l1(w),
            "w_inf": float(np.abs(w).max()),
            "active": 0,
            "path": path,
        }
    (hi, w_hi), (lo, _) = last[-2] if len(last) > 1 else (math.inf, last[0][1]), last[-1]
    if not math.isfinite(hi):
        raise ValueError(
            f"np_optimum: the class-1 loss exceeds r = {r} already at mu = {lo:g}; allowed: a level r "
            f"the data can meet (Eq. 30 must be feasible)"
        )
    for _ in range(steps):  # L1 <= r at hi, > r at lo
        mid = math.sqrt(hi * lo)
        w_mid = lagrangian_minimiser(x0, x1, mid, w_hi)
        if l1(w_mid) <= r:
            hi, w_hi = mid, w_mid
        else:
            lo = mid
    return {
        "mu_star": hi,
        "objective": l0(w_hi),
        "class1_loss": l1(w_hi),
        "w_inf": float(np.abs(w_hi).max()),
        "active": 1,
        "path": path,
    }


class NpOptimumArgs(BaseModel):
    """Arguments of the ``np_optimum`` protocol."""

    model_config = ConfigDict(extra="forbid")
    set_when: list[SetWhen] = Field(default_factory=list, description="experiment settings for some cells only")
    steps: int = Field(40, ge=1, le=200, description="bisection steps on log mu")


def np_optimum_cell(ctx) -> list[dict[str, Any]]:
    """One dataset of the suite (its Neyman-Pearson experiment, n = 1): the optimum's row, then one row per
    point of the multiplier path (``point`` = its index)."""
    from fedsolve.data.tabular import load_tabular
    from fedsolve.families.constrained.kind import NPParams

    ctx = cell_context(ctx)
    cfg = ctx.experiment()
    if cfg.problem is None or cfg.problem.kind != "neyman_pearson":
        raise ValueError(
            f"protocol np_optimum: the experiment's problem.kind must be neyman_pearson, got "
            f"{cfg.problem.kind if cfg.problem else None!r}"
        )
    p = NPParams(**dict(cfg.problem.params))
    x, y = load_tabular(p.dataset, task="neyman_pearson", limit=p.limit, scale=p.scale)
    opt = np_optimum(x, y, p.r, ctx.args.steps)
    head = {"dataset": p.dataset + (f":{p.scale}" if p.scale else ""), "rows": len(y), "r": p.r}
    rows = [{**head, **{k: v for k, v in opt.items() if k != "path"}}]
    rows += [
        {**head, "point": j, "mu": mu, "path_objective": f0, "path_class1_loss": f1, "path_w_inf": wi}
        for j, (mu, f0, f1, wi) in enumerate(opt["path"])
    ]
    return rows
