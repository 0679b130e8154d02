"""Certificates of a candidate answer: Definition 1's (eps1, eps2)-KKT residuals, computed exactly.

    eps1 = dist_inf(0, grad f(w) + dh(w) + grad c(w) mu)          (stationarity)
    eps2 = dist_inf(c(w), N_{R^m_+}(mu)) = max_j ( |c_j| if mu_j > 0 or c_j is an equality, else [c_j]_+ )

plus the objective, every party's constraint values (mean / max over clients, the server apart) and the
worst violation. This is an evaluation of the harness (it reads every party's data, as a test-set
evaluation does), not part of the federated protocol; any algorithm's output can be certified
(FedAvg's with ``mu = 0``). :func:`status` says what a run's end means in words, following the certificate:
a stopping test that passed is not called converged while the certificate misses its targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedsolve.data.federated import FederatedData
from fedsolve.families.constrained.problem import ConstrainedSpec


def client_rows(data: FederatedData, i: int) -> tuple[Tensor, Tensor, Tensor]:
    """Client ``i``'s training rows ``(x, y, mask)`` in float64 (a row-form problem's arguments)."""
    x, y = data.client_train(i)
    return x.double(), y.double(), torch.ones(x.shape[0], dtype=torch.float64, device=x.device)


def violation(c: Tensor, eq: Tensor) -> Tensor:
    """Per-constraint violation: ``|c|`` for equalities, ``[c]_+`` for inequalities."""
    return torch.where(eq.to(c.device), c.abs(), c.clamp_min(0.0))


def complementarity(c: Tensor, mu: Tensor, eq: Tensor) -> Tensor:
    """Per-constraint ``dist(c_j, N_{R_+}(mu_j))`` (equalities: ``|c_j|``)."""
    return torch.where(eq.to(c.device) | (mu > 0), c.abs(), c.clamp_min(0.0))


def evaluate_parties(spec: ConstrainedSpec, data: FederatedData, w: Tensor) -> dict[str, Any]:
    """Objective values ``f_i(w)`` ``[n]``, client constraints ``[n, m]`` and server constraint ``[m0]``."""
    w = w.detach().double()
    n = data.num_clients
    parts = [spec.part(data, i) for i in range(n)]
    with torch.no_grad():
        f = torch.stack([spec.f(w, p) for p in parts])
        cc = torch.stack([spec.c(w, p) for p in parts]) if spec.m_client else torch.zeros(n, 0, dtype=torch.float64)
        c0 = spec.server.c(w).double()
    return {"f": f, "c_clients": cc, "c_server": c0}


def client_objectives(spec: ConstrainedSpec, data: FederatedData, w: Tensor) -> list[float]:
    """Each client's objective ``f_i(w)`` (for paper 002's per-client relative difference)."""
    return evaluate_parties(spec, data, w)["f"].tolist()


def final_record(
    spec: ConstrainedSpec, data: FederatedData, w: Tensor, mu0: Tensor | None = None, mu_clients: Tensor | None = None
) -> dict[str, Any]:
    """What a summary records of a run's output beyond its certificate: every client's ``f_i(w)``
    (``objective_clients``, for paper 002's per-client relative difference), the answer ``w`` (all d entries) and,
    where the solver has them, the multipliers: ``mu_server`` ``[m_0]`` and ``mu_clients`` ``[n][m]``."""
    out: dict[str, Any] = {
        "objective_clients": client_objectives(spec, data, w),
        "w": w.detach().double().cpu().tolist(),
    }
    if mu0 is not None:
        out["mu_server"] = mu0.detach().double().cpu().tolist()
    if mu_clients is not None:
        out["mu_clients"] = mu_clients.detach().double().cpu().tolist()
    return out


def certificate(
    spec: ConstrainedSpec, data: FederatedData, w: Tensor, mu0: Tensor | None = None, mu_clients: Tensor | None = None
) -> dict[str, Any]:
    """Definition-1 residuals and feasibility summary of ``(w, mu)``; ``mu = 0`` where not given."""
    w = w.detach().double()
    n = data.num_clients
    mu0 = torch.zeros(spec.m_server, dtype=torch.float64) if mu0 is None else mu0.double()
    mu_c = torch.zeros(n, spec.m_client, dtype=torch.float64) if mu_clients is None else mu_clients.double()
    mu0, mu_c = mu0.to(w.device), mu_c.to(data.train_x.device)
    wr = w.clone().requires_grad_(True)
    g = torch.zeros_like(w)
    with torch.enable_grad():
        for i in range(n):
            part = spec.part(data, i)
            lag = spec.f(wr, part)
            if spec.m_client:
                lag = lag + (mu_c[i] * spec.c(wr, part)).sum()
            g = g + torch.autograd.grad(lag, wr)[0]
        if spec.m_server:
            g = g + torch.autograd.grad((mu0 * spec.server.c(wr)).sum(), wr)[0]
    parts = evaluate_parties(spec, data, w)
    cc, c0 = parts["c_clients"], parts["c_server"]
    eps2 = 0.0
    viol_parties = []
    if spec.m_client:
        assert spec.client_constraint is not None, "m_client > 0 only with a client constraint"
        eq = spec.client_constraint.eq_mask
        eps2 = max(eps2, float(complementarity(cc, mu_c, eq).max()))
        viol_parties += violation(cc, eq).amax(-1).tolist()
    if spec.m_server:
        assert spec.server.constraint is not None, "m_server > 0 only with a server constraint"
        eq0 = spec.server.constraint.eq_mask
        eps2 = max(eps2, float(complementarity(c0, mu0, eq0).max()))
        viol_parties.append(float(violation(c0, eq0).max()))
    f = parts["f"]
    out: dict[str, Any] = {
        "kkt_eps1": spec.server.prox.stationarity(w, g),
        "kkt_eps2": eps2,
        "objective": float(f.sum()) + spec.server.prox.value(w),
        "objective_client_mean": float(f.mean()),
        "objective_client_std": float(f.std(unbiased=False)),
        "objective_client_min": float(f.min()),
        "objective_client_max": float(f.max()),
        "violation_max": max(viol_parties) if viol_parties else 0.0,
        "violation_mean": sum(viol_parties) / len(viol_parties) if viol_parties else 0.0,
    }
    for j in range(spec.m_client):
        assert spec.client_constraint is not None, "m_client > 0 only with a client constraint"
        nm = spec.client_constraint.names[j]
        out[f"c_client_mean[{nm}]"] = float(cc[:, j].mean())
        out[f"c_client_max[{nm}]"] = float(cc[:, j].max())
        out[f"c_client_min[{nm}]"] = float(cc[:, j].min())
    for j in range(spec.m_server):
        assert spec.server.constraint is not None, "m_server > 0 only with a server constraint"
        out[f"c_server[{spec.server.constraint.names[j]}]"] = float(c0[j])
    return out


#: relative slack of the certificate test against (eps1, eps2): the residuals are sums over the clients, rounded
CERT_SLACK = 1e-6


def certified(cert: dict[str, Any], eps1: float, eps2: float) -> bool:
    """The certificate meets Definition 1's targets: ``kkt_eps1 <= eps1`` and ``kkt_eps2 <= eps2`` (up to
    :data:`CERT_SLACK`)."""
    return cert["kkt_eps1"] <= eps1 * (1 + CERT_SLACK) and cert["kkt_eps2"] <= eps2 * (1 + CERT_SLACK)


def status(
    cert: dict[str, Any],
    eps1: float,
    eps2: float,
    passed: bool,
    ended: str,
    premise: str | None = None,
    caveats: Sequence[str] = (),
) -> str:
    """A run's end in words, following its certificate ``cert``: ``passed`` (the stopping test, Eq. 11), ``ended``
    (why the run stopped otherwise: a cap, the round budget), ``premise`` (why Theorem 3 does not apply although
    Eq. 11 passed, e.g. capped inner loops) and ``caveats`` (appended). "converged" only where the stopping test
    passed, its premise held AND the measured certificate meets (eps1, eps2)."""
    ok = certified(cert, eps1, eps2)
    measured = (
        f"kkt_eps1 = {cert['kkt_eps1']:.3g} (eps1 = {eps1:g}), kkt_eps2 = {cert['kkt_eps2']:.3g} (eps2 = {eps2:g})"
    )
    if not passed:
        out = f"did not converge: {ended}"
    elif premise is not None:
        out = (
            f"Eq. 11 passed, but {premise}, so Theorem 3 does not certify it; the measured certificate "
            f"{'meets' if ok else 'misses'} its targets: {measured}"
        )
    elif ok:
        out = "converged (Eq. 11 passed)"
    else:
        out = f"Eq. 11 passed, but the certificate misses its targets: {measured}; not converged"
    return "; ".join([out, *caveats])
