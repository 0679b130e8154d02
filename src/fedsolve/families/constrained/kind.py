"""Constrained problem kinds (paper 002): ``problem: {kind: <name>, params: {...}}``.

* ``constrained_qp`` -- App. E.2, Eq. 86: ``min sum_i 1/2 w^T A_i w + b_i^T w  s.t. C_i w + d_i = 0 (0 <= i <= n)``;
* ``neyman_pearson`` -- Sec. 5.1, Eq. 30: class-0 logistic loss subject to class-1 loss <= r on every client;
* ``fairness`` -- Sec. 5.2, Eq. 32: logistic loss subject to |L_group0 - L_group1| <= r on every client AND
  on the server's data Z_0 (two scalar constraints per party; nonconvex).

Each builder rebuilds the parties from its params (the paper's split: equal, class-stratified folds,
remainder dropped), so the config's ``data`` section only names the dataset for the record.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.families.constrained.parties import quadratic_problem
from fedsolve.families.constrained.problem import (
    ConstrainedSpec,
    Constraint,
    ServerParty,
    constrained_problem,
    logistic_loss,
    masked_mean,
)
from fedsolve.families.constrained.rows import rows_data
from fedsolve.problems import FederatedProblem, parse_params, register_problem_kind

__all__ = [
    "fairness_problem",
    "np_problem",
    "qp_exact_solution",
    "qp_instance",
    "qp_problem",
    "rows_data",
    "stratified_folds",
]


# ------------------------------------------------------------------ App. E.2 QP
def qp_instance(d: int, n: int, m: int, seed: int = 10, d0_zero: bool = False) -> dict[str, np.ndarray]:
    """The instance recipe of App. E.2: A_i = U_i D_i U_i^T (D_i ~ U[0.5, 1], U_i orthogonal from the SVD of a
    Gaussian matrix), C_i ~ N(0, 1/d), b_i and d_i uniform on the unit sphere (d_0 = 0 with ``d0_zero``, the
    authors' code)."""
    for name, v in (("d", d), ("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"qp_instance: {name} = {v!r}; allowed: a whole number >= 1")
    rng = np.random.default_rng(seed)

    def sphere(k: int) -> np.ndarray:
        v = rng.standard_normal(k)
        return v / np.linalg.norm(v)

    A, R, b, C, dd = [], [], [], [], []
    for _ in range(n):
        U, _, _ = np.linalg.svd(rng.standard_normal((d, d)))
        D = rng.uniform(0.5, 1.0, d)
        A.append(U @ np.diag(D) @ U.T)
        R.append(np.sqrt(D)[:, None] * U.T)  # A_i = R_i^T R_i
        b.append(sphere(d))
    for i in range(n + 1):
        C.append(rng.normal(0.0, 1.0 / np.sqrt(d), (m, d)))
        dd.append(np.zeros(m) if (i == 0 and d0_zero) else sphere(m))
    return {"A": np.stack(A), "R": np.stack(R), "b": np.stack(b), "C": np.stack(C), "d": np.stack(dd)}


def qp_problem(d: int, n: int, m: int, seed: int = 10, d0_zero: bool = False) -> FederatedProblem:
    """Eq. 86 as a constrained problem (:func:`~fedsolve.families.constrained.parties.quadratic_problem`: the
    clients' A_i, b_i, C_i, d_i and the server's C_0, d_0; exact subproblem solves)."""
    inst = qp_instance(d, n, m, seed, d0_zero)
    prob = quadratic_problem(
        inst["A"], inst["b"], inst["C"][1:], inst["d"][1:], C0=inst["C"][0], e0=inst["d"][0], name=f"qp_d{d}_n{n}_m{m}"
    )
    prob.data.meta["qp"] = {"d": d, "n": n, "m": m, "seed": seed}
    prob.extras["qp_instance"] = inst
    return prob


def qp_exact_solution(inst: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """The optimum of Eq. 86 by one KKT linear solve: ``[A C^T; C 0] [w; nu] = [-b; -d]``."""
    A, b = inst["A"].sum(0), inst["b"].sum(0)
    C, dd = inst["C"].reshape(-1, A.shape[0]), inst["d"].reshape(-1)
    k = C.shape[0]
    K = np.block([[A, C.T], [C, np.zeros((k, k))]])
    sol = np.linalg.solve(K, np.concatenate([-b, -dd]))
    w = sol[: A.shape[0]]
    return w, float(0.5 * w @ A @ w + b @ w)


class QPParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    d: int = Field(100, ge=1, description="dimension d")
    m: int = Field(1, ge=1, description="equality constraints per party m~")
    instance_seed: int = Field(10, ge=0, description="seed of the instance (authors' code: 10); trials vary w^0")
    d0_zero: bool = Field(False, description="server d_0 = 0 (authors' code) instead of random on the sphere")


@register_problem_kind("constrained_qp")
def build_qp(problem: FederatedProblem, params, seed: int) -> FederatedProblem:
    p = parse_params(QPParams, params)
    return qp_problem(p.d, problem.num_clients, p.m, p.instance_seed, p.d0_zero)


# ------------------------------------------------------------------ Neyman-Pearson (Eq. 30)
def stratified_folds(y: np.ndarray, n: int, seed: int = 10) -> list[np.ndarray]:
    """The paper's split (authors' code): shuffle each class (seed 10), client i gets floor(N_c / n) of each
    class c; the remainder is dropped."""
    rng = np.random.default_rng(seed)
    per_class = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        per_class.append(np.array_split(idx[: (len(idx) // n) * n], n))
    return [np.sort(np.concatenate([pc[i] for pc in per_class])) for i in range(n)]


def np_spec(n: int, r: float) -> ConstrainedSpec:
    """Eq. 30: f_i = (1/n) mean class-0 logistic loss; c_i = mean class-1 logistic loss - r."""

    def f(w, x, y, mask):
        return masked_mean(logistic_loss(x @ w, y), mask * (y == 0)) / n

    def c(w, x, y, mask):
        return (masked_mean(logistic_loss(x @ w, y), mask * (y == 1)) - r).reshape(1)

    return ConstrainedSpec(
        objective=f,
        client_constraint=Constraint(c, 1, ("ineq",), ("class-1 loss - r",), label="neyman_pearson"),
        name="neyman_pearson",
    )


def np_problem(
    x: np.ndarray, y: np.ndarray, n: int, r: float = 0.2, split_seed: int = 10, name: str = "neyman_pearson"
) -> FederatedProblem:
    folds = stratified_folds(y, n, split_seed)
    train = [(x[ix], y[ix]) for ix in folds]
    data = rows_data(train, name=name, meta={"split": "stratified equal folds", "split_seed": split_seed})
    return constrained_problem(data, np_spec(n, r), x.shape[1], classes=2, name=name)


class NPParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: Literal["breast_cancer", "breast_cancer_wisc", "monks1", "adult", "adult_synthetic"] = Field(
        "breast_cancer", description="tabular dataset (fedsolve.data.tabular)"
    )
    r: float = Field(0.2, gt=0, description="class-1 loss threshold r_i")
    split_seed: int = Field(10, ge=0, description="seed of the stratified split (authors' code: 10)")
    limit: int | None = Field(None, ge=10, description="use at most this many rows (reduced runs)")
    scale: Literal["zscore", "unit"] | None = Field(
        None,
        description="re-scale every feature on the pool: z-score, or onto [0, 1] by its min and max "
        "(unit); none keeps the dataset's own (z-scored breast cancer, one-hot monks-1, adult-b)",
    )


@register_problem_kind("neyman_pearson")
def build_np(problem: FederatedProblem, params, seed: int) -> FederatedProblem:
    from fedsolve.data.tabular import load_tabular

    p = parse_params(NPParams, params)
    x, y = load_tabular(p.dataset, task="neyman_pearson", limit=p.limit, scale=p.scale)
    name = f"np_{p.dataset}" + (f"_{p.scale}" if p.scale else "")
    return np_problem(x, y, problem.num_clients, p.r, p.split_seed, name=name)


# ------------------------------------------------------------------ fairness (Eq. 32)
def fairness_spec(n: int, r: float, x0: np.ndarray, y0: np.ndarray) -> ConstrainedSpec:
    """Eq. 32: f_i = (1/n) mean logistic loss; per party L_g0 - L_g1 - r <= 0 and L_g1 - L_g0 - r <= 0, the
    group being the sensitive attribute in the LAST feature column (kept as a model input)."""

    def f(w, x, y, mask):
        return masked_mean(logistic_loss(x @ w, y), mask) / n

    def c(w, x, y, mask):
        loss = logistic_loss(x @ w, y)
        g1 = (x[:, -1] > 0.5).to(w.dtype)
        gap = masked_mean(loss, mask * (1 - g1)) - masked_mean(loss, mask * g1)
        return torch.stack([gap - r, -gap - r])

    names = ("L_female - L_male - r", "L_male - L_female - r")
    return ConstrainedSpec(
        objective=f,
        client_constraint=Constraint(c, 2, ("ineq", "ineq"), names, label="fairness (client)"),
        server=ServerParty(
            Constraint(c, 2, ("ineq", "ineq"), names, label="fairness (server)"),
            torch.as_tensor(x0, dtype=torch.float64),
            torch.as_tensor(y0, dtype=torch.float64),
        ),
        name="fairness",
    )


def fairness_problem(
    x: np.ndarray,
    y: np.ndarray,
    x0: np.ndarray,
    y0: np.ndarray,
    n: int,
    r: float = 0.1,
    split_seed: int = 10,
    name: str = "fairness",
) -> FederatedProblem:
    folds = stratified_folds(y, n, split_seed)
    train = [(x[ix], y[ix]) for ix in folds]
    data = rows_data(train, name=name, meta={"split": "stratified equal folds", "split_seed": split_seed})
    return constrained_problem(data, fairness_spec(n, r, x0, y0), x.shape[1], classes=2, name=name)


class FairnessParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: Literal["adult", "adult_synthetic"] = Field("adult", description="clients' data (server: its test split)")
    r: float = Field(0.1, gt=0, description="loss-disparity threshold r_i (every party)")
    split_seed: int = Field(10, ge=0, description="seed of the stratified split (authors' code: 10)")
    limit: int | None = Field(None, ge=10, description="use at most this many client rows (reduced runs)")
    server_limit: int | None = Field(None, ge=10, description="use at most this many server rows (reduced runs)")


@register_problem_kind("fairness")
def build_fairness(problem: FederatedProblem, params, seed: int) -> FederatedProblem:
    from fedsolve.data.tabular import load_tabular

    p = parse_params(FairnessParams, params)
    x, y, x0, y0 = load_tabular(p.dataset, task="fairness", limit=p.limit, server_limit=p.server_limit)
    return fairness_problem(x, y, x0, y0, problem.num_clients, p.r, p.split_seed, name=f"fair_{p.dataset}")
