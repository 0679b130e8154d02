"""A quadratic bilevel problem with a known answer and two knobs for how much the clients differ: the problem on
which the regime where ShroFBO must beat SimFBO is mapped (SimFBO Theorems 1-2; issue 47).

Client i of n states (``client_problem``)

    g_i(x, y) = 1/2 y^T A_i y - y^T B_i x - c_i^T y            f_i(x, y) = 1/2 ||y - d_i||^2 + mu/2 ||x||^2

    (A_i, B_i, c_i) = (1 - s_g) (A, B, c) + s_g (A'_i, B'_i, c'_i)        d_i = (1 - s_f) d + s_f d'_i

where A and every A'_i are M M^T / d_y + I (M standard normal; so every A_i is positive definite and g_i strongly
convex in y) and every other entry is standard normal, all drawn from one seed. ``lower_het`` s_g and
``upper_het`` s_f in [0, 1] go from identical clients (0) to independent ones (1); the shared part is the same for
every value of the knobs, so a sweep over them moves one problem.

With client weights w (summing to 1), A_w = sum_i w_i A_i (B_w, c_w, d_w likewise), y*(x) = A_w^-1 (B_w x + c_w) and
the stationary point of Phi_w(x) = sum_i w_i f_i(x, y*(x)) solves

    (mu I + B_w^T A_w^-2 B_w) x = B_w^T A_w^-1 (d_w - A_w^-1 c_w)

(:func:`stationary_point`; Phi_w is a convex quadratic, so this is its minimiser). The true point x* takes the
objective's weights p_i = 1/n. Without client drift (eta = 0) and with persistent tau_i, SimFBO lands on the point of
the weights w_i ~ p_i tau_i (Theorem 1), ShroFBO on x* (Theorem 2).

Problem kind ``bilevel_quadratic`` (``problem: {kind: bilevel_quadratic, params: {...}}``; the config's ``data``
only gives the number of clients, ``data.num_clients``): its evaluation records hold ``x_dist_true`` = ||x - x*||
and, when ``tau`` lists the clients' persistent tau_i, ``x_dist_reweighted`` = ||x - x~*|| (x~*: the point of the
weights p_i tau_i / sum_j p_j tau_j, where SimFBO lands without client drift).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedsolve.families.bilevel.functions import client_problem
from fedsolve.problems import FederatedProblem, parse_params, register_problem_kind

F64 = torch.float64


def quadratic_clients(
    n: int, dx: int, dy: int, lower_het: float, upper_het: float, mu: float, seed: int
) -> dict[str, Tensor]:
    """The per-client tensors ``A [n, dy, dy]``, ``B [n, dy, dx]``, ``c``, ``d [n, dy]`` and ``mu [n]`` of the
    module's problem (float64), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=g, dtype=F64)

    def spd(k: int) -> Tensor:
        M = normal(k, dy, dy)
        return M @ M.transpose(1, 2) / dy + torch.eye(dy, dtype=F64)

    shared = {"A": spd(1)[0], "B": normal(dy, dx), "c": normal(dy), "d": normal(dy)}
    own = {"A": spd(n), "B": normal(n, dy, dx), "c": normal(n, dy), "d": normal(n, dy)}
    mix = lambda k, s: (1 - s) * shared[k].expand_as(own[k]) + s * own[k]
    return {
        "A": mix("A", lower_het),
        "B": mix("B", lower_het),
        "c": mix("c", lower_het),
        "d": mix("d", upper_het),
        "mu": torch.full((n,), float(mu), dtype=F64),
    }


def stationary_point(clients: dict[str, Tensor], w: Tensor) -> Tensor:
    """The stationary point (the minimiser) of Phi_w for client weights ``w`` (``[n]``, summing to 1)."""
    w = w.to(F64)
    A, B, c, d = (torch.einsum("i,i...->...", w, clients[k]) for k in "ABcd")
    mu = float(clients["mu"][0])
    Ai = torch.linalg.inv(A)
    eye = torch.eye(B.shape[1], dtype=F64)
    return torch.linalg.solve(mu * eye + B.T @ Ai @ Ai @ B, B.T @ Ai @ (d - Ai @ c))


def reweighted_weights(tau: Tensor, p: Tensor | None = None) -> Tensor:
    """SimFBO's effective weights w_i = p_i tau_i / sum_j p_j tau_j (Theorem 1; p: equal by default)."""
    tau = tau.to(F64)
    p = torch.full_like(tau, 1.0 / tau.numel()) if p is None else p.to(F64)
    return p * tau / (p * tau).sum()


def lower(i, x, y, data):
    """g_i(x, y) = 1/2 y^T A_i y - y^T B_i x - c_i^T y."""
    return 0.5 * y @ data["A"] @ y - y @ data["B"] @ x - data["c"] @ y


def upper(i, x, y, data):
    """f_i(x, y) = 1/2 ||y - d_i||^2 + mu/2 ||x||^2."""
    return 0.5 * (y - data["d"]).pow(2).sum() + 0.5 * data["mu"] * x.pow(2).sum()


class QuadraticParams(BaseModel):
    """``problem.params`` of the ``bilevel_quadratic`` kind."""

    model_config = ConfigDict(extra="forbid")

    dx: int = Field(3, ge=1, le=1000, description="dimension of x")
    dy: int = Field(4, ge=1, le=1000, description="dimension of y")
    mu: float = Field(0.5, gt=0, description="upper-level ridge mu/2 ||x||^2")
    lower_het: float = Field(
        1.0,
        ge=0,
        le=1,
        description="how much the clients' lower levels (A_i, B_i, c_i) differ: 0 identical, 1 independent draws",
    )
    upper_het: float = Field(
        1.0, ge=0, le=1, description="how much the clients' upper levels (d_i) differ: 0 identical, 1 independent draws"
    )
    instance_seed: int | None = Field(None, ge=0, description="seed of the matrices (null: the run's seed)")
    tau: list[int] | None = Field(
        None,
        description="the clients' persistent tau_i (one per client, >= 1): also "
        "report x_dist_reweighted, the distance to SimFBO's drift-free limit x~*",
    )


@register_problem_kind("bilevel_quadratic")
def bilevel_quadratic(problem: FederatedProblem, params, seed: int) -> FederatedProblem:
    """The module's problem for the config's ``data.num_clients`` clients (the data itself is not used)."""
    p = parse_params(QuadraticParams, params)
    n = problem.num_clients
    if p.tau is not None and (len(p.tau) != n or min(p.tau) < 1):
        raise ValueError(f"problem.params.tau: {p.tau}; allowed: {n} integers >= 1 (one tau_i per client)")
    clients = quadratic_clients(
        n, p.dx, p.dy, p.lower_het, p.upper_het, p.mu, seed if p.instance_seed is None else p.instance_seed
    )
    refs = {"true": stationary_point(clients, torch.full((n,), 1.0 / n, dtype=F64))}
    if p.tau is not None:
        refs["reweighted"] = stationary_point(clients, reweighted_weights(torch.tensor(p.tau)))
    zeros = lambda d: torch.zeros(d, dtype=F64)
    return client_problem(
        upper,
        lower,
        zeros(p.dx),
        zeros(p.dy),
        client_data=clients,
        references=refs,
        name=f"bilevel quadratic (n = {n}, lower_het = {p.lower_het}, upper_het = {p.upper_het})",
    )
