"""cProx-AL (paper 002, App. D, Algorithm 3; Lu & Zhou): the centralized proximal AL baseline.

    l_k(w) = f(w) + h(w) + (1/(2 beta)) ( ||[mu^k + beta c(w)]_+||^2 - ||mu^k||^2 ) + (1/(2 beta)) ||w - w^k||^2
    w^{k+1} ~ argmin l_k  with  dist_inf(0, d l_k(w^{k+1})) <= tau_k = s_bar/(k+1)^2
    mu^{k+1} = [mu^k + beta c(w^{k+1})]_+
    stop if ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and ||mu^{k+1} - mu^k||_inf <= beta eps2

Algorithm 1 with the subproblem solved on the pooled data (no ADMM, no communication): a reference
run in one process, not a federated protocol. The prox weight is 1/beta (the paper; the authors' QP
code's n/((n+1) beta) is a bug, spec 4).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.func import vmap

from fedsolve.algorithms.constrained import subproblem as sp
from fedsolve.algorithms.constrained.al import penalty, shifted
from fedsolve.algorithms.constrained.kkt import certificate
from fedsolve.constraints import ConstrainedSpec, stack_rows
from fedsolve.data.federated import FederatedData


@dataclass
class CProxALResult:
    w: Tensor
    mu0: Tensor
    mu_clients: Tensor
    outer_iterations: int
    converged: bool
    wall_s: float
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "converged (Eq. 11 passed)" if self.converged else "did not converge: outer cap reached"


def cproxal(spec: ConstrainedSpec, data: FederatedData, w0: Tensor, *, beta: float, s_bar: float, eps1: float = 1e-3,
            eps2: float = 1e-3, mu0: float = 0.0, max_outer: int = 100, newton_max_iter: int = 100,
            certify: bool = True) -> CProxALResult:
    """Run Algorithm 3 from ``w0`` with every multiplier at ``mu0``."""
    t0 = time.perf_counter()
    n = data.num_clients
    X, Y, M = stack_rows([data.client_train(i) for i in range(n)])
    eq = spec.client_constraint.eq_mask if spec.client_constraint is not None else torch.zeros(0, dtype=torch.bool)
    eq0 = spec.server.constraint.eq_mask if spec.server.constraint is not None else torch.zeros(0, dtype=torch.bool)
    f_all = vmap(spec.objective, in_dims=(None, 0, 0, 0))
    c_all = vmap(spec.c_client, in_dims=(None, 0, 0, 0))
    w = w0.detach().double().clone()
    mu = torch.full((n, spec.m_client), mu0, dtype=torch.float64)
    m0 = torch.full((spec.m_server,), mu0, dtype=torch.float64)
    prox = spec.server.prox
    factor = None
    hist: list[dict[str, Any]] = []
    converged = False
    k = 0
    for k in range(max_outer):
        tau = s_bar / (k + 1) ** 2
        wk, mu_k, m0_k = w, mu, m0

        def smooth(v):
            val = f_all(v, X, Y, M).sum() + 0.5 / beta * (v - wk).pow(2).sum()
            if spec.m_client:
                val = val + sum(penalty(mu_k[i], cc, eq, beta) for i, cc in enumerate(c_all(v, X, Y, M)))
            if spec.m_server:
                val = val + penalty(m0_k, spec.server.c(v), eq0, beta)
            return val

        if not prox.is_zero:
            w, _ = sp.prox_gradient(smooth, prox, wk, tau)
        elif spec.quadratic:
            if factor is None:
                factor = sp.quadratic_factor(smooth, wk)
            w, _ = sp.quadratic_step(smooth, wk, factor)
        else:
            w, _, _ = sp.newton(smooth, wk, tau, newton_max_iter, eager=True)
        mu = shifted(mu_k, c_all(w, X, Y, M), eq, beta) if spec.m_client else mu_k
        m0 = shifted(m0_k, spec.server.c(w).double(), eq0, beta) if spec.m_server else m0_k
        dw = float((w - wk).abs().max())
        dmu = max([float((mu - mu_k).abs().max()) if spec.m_client else 0.0,
                   float((m0 - m0_k).abs().max()) if spec.m_server else 0.0])
        rec = {"k": k + 1, "dw": dw, "dmu": dmu, "tau": tau}
        if certify:
            with torch.no_grad():
                rec["f_clients"] = f_all(w, X, Y, M).tolist()
                if spec.m_client:
                    rec["c_clients"] = c_all(w, X, Y, M).tolist()
                if spec.m_server:
                    rec["c_server"] = spec.server.c(w).tolist()
        hist.append(rec)
        if dw + beta * tau <= beta * eps1 and dmu <= beta * eps2:
            converged = True
            break
    res = CProxALResult(w, m0, mu, k + 1, converged, time.perf_counter() - t0, hist)
    if certify:
        res.history.append({"certificate": certificate(spec, data, w, m0, mu)})
    return res
