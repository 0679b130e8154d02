"""cProx-AL (paper 002, App. D, Algorithm 3; Lu & Zhou): the centralized proximal AL baseline.

    l_k(w) = f(w) + h(w) + (1/(2 beta)) ( ||[mu^k + beta c(w)]_+||^2 - ||mu^k||^2 ) + (1/(2 beta)) ||w - w^k||^2
    w^{k+1} ~ argmin l_k  with  dist_inf(0, d l_k(w^{k+1})) <= tau_k = s_bar/(k+1)^2
    mu^{k+1} = [mu^k + beta c(w^{k+1})]_+
    stop if ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and ||mu^{k+1} - mu^k||_inf <= beta eps2

Algorithm 1 with the subproblem solved on the POOLED data (no ADMM, no communication): a reference,
not a federated protocol. The prox weight is 1/beta (the paper; the authors' QP code's n/((n+1) beta) is a
bug, spec 4). :func:`cproxal` runs it in one call; the registered algorithm ``cproxal`` runs one outer
iteration per engine round (``communicates = False``; its server reads every party's data, so it is a
simulation-only baseline) so it sits in the same suites and reports as Prox-AL FL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedsolve.core.newton import newton, over_parties
from fedsolve.core.plans import Work
from fedsolve.core.statements import Solved
from fedsolve.core.states import ClientStates
from fedsolve.data.federated import FederatedData
from fedsolve.engine.algorithm import Algorithm, expand, register
from fedsolve.engine.phases import Phase, PhaseTable
from fedsolve.families.constrained import kkt, subproblem as sp
from fedsolve.families.constrained.al import penalty, shifted
from fedsolve.families.constrained.config import CProxALConfig, initial_point
from fedsolve.families.constrained.problem import ConstrainedSpec, Part, get_spec, stack_rows
from fedsolve.problems import parse_params


class CProxALStep:
    """One outer iteration of Algorithm 3 on the pooled data of ``spec``'s parties."""

    def __init__(
        self,
        spec: ConstrainedSpec,
        data: FederatedData,
        beta: float,
        newton_max_iter: int = 100,
        newton_step: str = "modified",
    ):
        self.spec, self.data, self.beta, self.newton_max_iter = spec, data, beta, newton_max_iter
        self.modified = newton_step == "modified"
        n = data.num_clients
        X, Y, M = stack_rows([data.client_train(i) for i in range(n)])
        self.parts = Part(
            X,
            Y,
            M,
            torch.arange(n, device=X.device),
            {k: (v.double() if v.is_floating_point() else v).to(X.device) for k, v in spec.party_tensors.items()},
        )
        none = torch.zeros(0, dtype=torch.bool)
        self.eq = spec.client_eq
        self.eq0 = spec.server.constraint.eq_mask if spec.server.constraint is not None else none
        self.f_all = over_parties(spec.f)
        self.c_all = over_parties(spec.c)
        self._factor: Tensor | None = None

    def __call__(self, w: Tensor, mu: Tensor, m0: Tensor, tau: float) -> tuple[Tensor, Tensor, Tensor]:
        spec, beta, parts = self.spec, self.beta, self.parts

        def smooth(v):
            val = self.f_all(v, parts).sum() + 0.5 / beta * (v - w).pow(2).sum()
            if spec.m_client:
                val = val + sum(penalty(mu[i], cc, self.eq, beta) for i, cc in enumerate(self.c_all(v, parts)))
            if spec.m_server:
                val = val + penalty(m0, spec.server.c(v), self.eq0, beta)
            return val

        prox = spec.server.prox
        if not prox.is_zero:
            w_new, _ = sp.prox_gradient(smooth, prox, w, tau)
        elif spec.quadratic:
            if self._factor is None:
                self._factor = sp.quadratic_factor(smooth, w)
            w_new, _ = sp.quadratic_step(smooth, w, self._factor)
        else:
            w_new, _, _ = newton(smooth, w, tau, self.newton_max_iter, alone=True, modified=self.modified)
        mu_new = shifted(mu, self.c_all(w_new, parts), self.eq, beta) if spec.m_client else mu
        m0_new = shifted(m0, spec.server.c(w_new).double(), self.eq0, beta) if spec.m_server else m0
        return w_new, mu_new, m0_new

    def changes(self, w, w_new, mu, mu_new, m0, m0_new) -> tuple[float, float]:
        dw = float((w_new - w).abs().max())
        dmu = max(
            float((mu_new - mu).abs().max()) if mu.numel() else 0.0,
            float((m0_new - m0).abs().max()) if m0.numel() else 0.0,
        )
        return dw, dmu


@dataclass
class CProxALResult:
    w: Tensor
    mu0: Tensor
    mu_clients: Tensor
    outer_iterations: int
    converged: bool
    wall_s: float
    history: list[dict[str, Any]] = field(default_factory=list)
    status: str = ""


def cproxal(
    spec: ConstrainedSpec,
    data: FederatedData,
    w0: Tensor,
    *,
    beta: float,
    s_bar: float,
    eps1: float = 1e-3,
    eps2: float = 1e-3,
    mu0: float = 0.0,
    max_outer: int = 100,
    newton_max_iter: int = 100,
    newton_step: str = "modified",
    certify: bool = True,
) -> CProxALResult:
    """Run Algorithm 3 from ``w0`` with every multiplier at ``mu0``. The arguments are checked as the registered
    algorithm's config (:class:`~fedsolve.families.constrained.config.CProxALConfig`): a bad one is a ValueError
    naming it. ``status`` follows the certificate (computed when ``certify``)."""
    try:
        c = parse_params(
            CProxALConfig,
            {
                "beta": beta,
                "s_bar": s_bar,
                "eps1": eps1,
                "eps2": eps2,
                "mu0": mu0,
                "max_outer": max_outer,
                "newton_max_iter": newton_max_iter,
                "newton_step": newton_step,
            },
        )
    except ValueError as e:
        raise ValueError(f"cproxal: {e}") from None
    t0 = time.perf_counter()
    step = CProxALStep(spec, data, c.beta, c.newton_max_iter, c.newton_step)
    w = w0.detach().double().clone()
    mu = torch.full((data.num_clients, spec.m_client), c.mu0, dtype=torch.float64)
    m0 = torch.full((spec.m_server,), c.mu0, dtype=torch.float64)
    hist: list[dict[str, Any]] = []
    converged, k = False, 0
    for k in range(c.max_outer):
        tau = c.s_bar / (k + 1) ** 2
        w_new, mu_new, m0_new = step(w, mu, m0, tau)
        dw, dmu = step.changes(w, w_new, mu, mu_new, m0, m0_new)
        w, mu, m0 = w_new, mu_new, m0_new
        hist.append({"k": k + 1, "dw": dw, "dmu": dmu, "tau": tau})
        if dw + c.beta * tau <= c.beta * c.eps1 and dmu <= c.beta * c.eps2:
            converged = True
            break
    res = CProxALResult(w, m0, mu, k + 1, converged, time.perf_counter() - t0, hist)
    ended = f"outer cap max_outer={c.max_outer} reached"
    if certify:
        cert = kkt.certificate(spec, data, w, m0, mu)
        res.history.append({"certificate": cert})
        res.status = kkt.status(cert, c.eps1, c.eps2, converged, ended)
    else:
        res.status = "Eq. 11 passed (not certified)" if converged else f"did not converge: {ended}"
    return res


PHASES = PhaseTable(
    Phase("step", then=("step", "done"), doc="one outer iteration of Algorithm 3 on the pooled data"),
    Phase("done", doc="the stop test passed or max_outer reached"),
    start="step",
    done="done",
)


@register
class CProxAL(Algorithm):
    """Algorithm 3 as an engine algorithm: one outer iteration per round, on the pooled data."""

    name = "cproxal"
    description = "cProx-AL: centralized proximal AL on the pooled data (paper 002 App. D baseline; no communication)"
    Config = CProxALConfig
    cfg: CProxALConfig
    communicates = False
    reports_train_loss = False
    watch = "w"
    phases = PHASES
    server_reads_client_state = True  # centralized: refused by the Flower adapter

    def setup(self) -> None:
        self.spec = get_spec(self.problem, self.name)
        self.step = CProxALStep(
            self.spec, self.problem.data, self.cfg.beta, self.cfg.newton_max_iter, self.cfg.newton_step
        )

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        return {} if round_ is None else {"train": Work(epochs=None, steps=1, batch_size=None)}

    def init(self, x0, rngs):
        w0 = initial_point(self.cfg.w0, x0, rngs.torch("proxal_w0"))
        z = torch.zeros((), dtype=torch.float64)
        return {
            **PHASES.init(),
            "w": w0,
            "mu": torch.full((self.num_clients, self.spec.m_client), self.cfg.mu0, dtype=torch.float64),
            "mu0": torch.full((self.spec.m_server,), self.cfg.mu0, dtype=torch.float64),
            "k": torch.zeros((), dtype=torch.long),
            "converged": torch.zeros((), dtype=torch.long),
            "dw": z,
            "dmu": z,
        }, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        if round_ is None:
            return {"w": expand(server["w"], ids)}
        return PHASES.message(PHASES.current(server), ids)

    def local_update(self, state, msg, ctx):
        return Solved({}, {})

    def aggregate(self, server, ids, uploads, round_):
        if PHASES.finished(server):
            return server
        c, k = self.cfg, int(server["k"])
        tau = c.s_bar / (k + 1) ** 2
        w, mu, m0 = self.step(server["w"], server["mu"], server["mu0"], tau)
        dw, dmu = self.step.changes(server["w"], w, server["mu"], mu, server["mu0"], m0)
        conv = dw + c.beta * tau <= c.beta * c.eps1 and dmu <= c.beta * c.eps2
        s = {
            **server,
            "w": w,
            "mu": mu,
            "mu0": m0,
            "k": server["k"] + 1,
            "converged": torch.tensor(int(conv)),
            "dw": torch.tensor(dw, dtype=torch.float64),
            "dmu": torch.tensor(dmu, dtype=torch.float64),
        }
        return PHASES.enter(s, "done", round_) if conv or k + 1 >= c.max_outer else s

    def eval_model(self, state, msg):
        return msg["w"].to(next(self.problem.model.parameters()).dtype)

    def report(self, server, clients, final: bool = False) -> dict[str, Any]:
        out = kkt.certificate(self.spec, self.problem.data, server["w"], server["mu0"], server["mu"])
        out.update(
            outer_iterations=int(server["k"]),
            converged=int(server["converged"]),
            certified=int(kkt.certified(out, self.cfg.eps1, self.cfg.eps2)),
        )
        if not final:
            return out
        c = self.cfg
        ended = (
            f"outer cap max_outer={c.max_outer} reached"
            if PHASES.finished(server)
            else "the run ended (simulation.rounds) first"
        )
        out["status"] = kkt.status(out, c.eps1, c.eps2, bool(int(server["converged"])), ended)
        out.update(kkt.final_record(self.spec, self.problem.data, server["w"], server["mu0"], server["mu"]))
        return {"constrained": out}
