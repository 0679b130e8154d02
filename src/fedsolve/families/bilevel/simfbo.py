"""SimFBO and ShroFBO (Yang, Xiao, Ji 2023, Algorithm 1): simple federated bilevel optimisation.

One communication round t (spec simfbo.md 2.2-2.7):

    server -> each i in C_t (|C_t| = P, uniform without replacement):  x^t, y^t, v^t
    client i, k = 0..tau_i-1, all three at the SAME point (eq. 3):
        d_y = grad_y g_i(x_k, y_k)
        d_v = grad2_yy g_i(x_k, y_k) v_k - grad_y f_i(x_k, y_k)            (grad_v R_i, HVP)
        d_x = grad_x f_i(x_k, y_k) - grad2_xy g_i(x_k, y_k) v_k            (barGrad f_i, mixed JVP)
        (y, v, x)_{k+1} = (y, v, x)_k - a_k (eta_y d_y, eta_v d_v, eta_x d_x)     (no projection)
        q_{z,i} = sum_k a_k d_z        h_{z,i} = q_{z,i} / ||a_i||_1        (eq. 4, eq. 6)
    client i -> server: h_{x,i}, h_{y,i}, h_{v,i} and the scalar ||a_i||_1   (d_x + 2 d_y + 1 floats)
    p~_i = (n / P) p_i           (uniform sampling; in general p_i / pi_i, pi_i = P(i in C_t): unbiased)
    SimFBO  (eq. 5):  z^{t+1} = z^t - gamma_z sum_{i in C_t} p~_i q_{z,i}
    ShroFBO (eq. 8):  z^{t+1} = z^t - rho^t gamma_z sum_{i in C_t} p~_i h_{z,i},
                      rho^t = sum_{j=1..n} p_j ||a_j||_1                     (eq. 6; known schedule)
    v^{t+1} = P_r(v^{t+1})   (server only; r = None: no projection)

tau_i is a property of client i (its row ``tau`` of the client state), drawn once from the seed when
``tau_max`` is set (system heterogeneity, Fig. 4), or a schedule over rounds (``tau_clients`` as a list of
rounds, ``tau_rounds``): the client reads tau_i^t from its row. The server keeps the same public schedule to
compute rho^t exactly (spec 2.5 option (a)); ``rho: estimate`` uses the unbiased
``sum_{i in C_t} p~_i ||a_i||_1`` from the uploads instead (option (b)).

Client sampling (spec 2.2): p~_i = (n/|C_t|) p_i makes the aggregate unbiased when C_t is uniform without
replacement. Under ``sampling.scheme: weighted`` (clients drawn successively with probabilities proportional to
their data shares) client i takes part with probability pi_i (``engine.sampling.inclusion_probabilities``), and
p~_i = p_i / pi_i (Horvitz-Thompson) keeps E[sum_{i in C_t} p~_i h_i] = sum_i p_i h_i.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.engine.sampling import inclusion_probabilities
from fedsolve.families.bilevel.common import BilevelAlgorithm, sent
from fedsolve.families.bilevel.local_steps import LocalStepsConfig, batch_groups, check_tau_clients, directions, tau_at
from fedsolve.families.bilevel.problem import project_ball


class SimFBOConfig(LocalStepsConfig):
    """Defaults: the paper's MNIST-MLP setting (A.2: eta = gamma = [0.2, 0.1, 0.05] for [y, v, x], tau = 1)."""

    eta_y: float = Field(0.2, ge=0, description="client step size of y")
    eta_v: float = Field(0.1, ge=0, description="client step size of v")
    eta_x: float = Field(0.05, ge=0, description="client step size of x")
    gamma_y: float = Field(0.2, gt=0, description="server step size of y")
    gamma_v: float = Field(0.1, gt=0, description="server step size of v")
    gamma_x: float = Field(0.05, gt=0, description="server step size of x")
    a: float = Field(1.0, gt=0, description="local coefficients a_i^(t,k) (constant; the paper uses 1)")
    r: float | None = Field(None, gt=0, description="radius of the server's projection of v (null: none)")
    v0: float = Field(0.0, description="initial value of every entry of v (spec: v^(0) = 0)")
    weights: Literal["uniform", "data"] = Field(
        "uniform", description="objective weights p_i: 1/n (paper) or the clients' data shares"
    )
    normalized: bool = Field(False, description="ShroFBO: upload-normalised directions h, server step rho^t")
    rho: Literal["known", "estimate"] = Field(
        "known",
        description="ShroFBO's rho^t: from the known tau schedule of all n clients, or estimated from the sampled ones",
    )


@register
class SimFBO(BilevelAlgorithm):
    name = "simfbo"
    description = "SimFBO: simultaneous y, v, x local updates, one round per iteration (Yang, Xiao, Ji 2023)"
    Config = SimFBOConfig
    cfg: SimFBOConfig

    def setup(self):
        spec = self.use_oracles(self.cfg.oracles).spec
        c = self.cfg
        T = c.steps()
        groups = batch_groups(spec.lower_group, spec.upper_group, self.independent)
        self._work = {ph: Work(epochs=None, steps=T, batch_size=c.batch_size, group=g) for ph, g in groups.items()}
        w = (
            torch.ones(self.num_clients, dtype=torch.float64)
            if c.weights == "uniform"
            else self.client_weights.to(torch.float64)
        )
        self._p = w / w.sum()
        self._pi = None  # inclusion probabilities of the run's sampling (:meth:`p_tilde`), computed once
        check_tau_clients(c.tau_clients, self.num_clients)

    def work(self, round_=0):
        return {} if round_ is None else self._work

    # ------------------------------------------------------------ Algorithm 1
    def init(self, x0, rngs):
        x, y = self.oracles.split(x0)
        c = self.cfg
        tau = c.draw(rngs, self.num_clients).to(device=x0.device, dtype=x0.dtype)
        server = {"x": x.clone(), "y": y.clone(), "v": torch.full_like(y, self.cfg.v0), "tau": tau.clone()}
        return server, ClientStates(self.num_clients, {"tau": tau.clone()})

    def broadcast(self, server, ids, round_):
        return sent(server, ids, ("x", "y") if round_ is None else ("x", "y", "v"))

    def local_update(self, state, msg, ctx):
        """Eq. (3)-(4) for ONE client: tau_i simultaneous steps of (y, v, x), then h = q / ||a_i||_1."""
        c = self.cfg
        x, y, v = msg["x"], msg["y"], msg["v"]
        tau = tau_at(state["tau"], ctx.round, c.per_round)
        first = next(iter(self._work))
        T = c.steps()
        on = [(tau > k) & ctx.is_active(first, k) for k in range(T)]  # the steps client i actually takes
        a = [c.a * o.to(x.dtype) for o in on]
        a_norm = sum(a[1:], a[0])  # ||a_i||_1
        h: dict[str, torch.Tensor] = {}  # h_z = q_z / ||a_i||_1 = sum_k (a_k / ||a_i||_1) d_z, accumulated as it goes
        for k in range(T):
            dy, dv, dx, fval = self.directions(ctx, k, x, y, v)
            ctx.record_loss(fval, on[k])
            wk = a[k] / a_norm
            for z, dz in (("hy", dy), ("hv", dv), ("hx", dx)):
                term = dz if T == 1 else wk * dz  # one step: h = d
                h[z] = term if k == 0 else h[z] + term
            if k < T - 1:  # the last local iterate is never evaluated (spec 2.3): skip computing it
                y, v, x = y - a[k] * c.eta_y * dy, v - a[k] * c.eta_v * dv, x - a[k] * c.eta_x * dx
        return {}, {**h, "a_norm": a_norm}

    def directions(self, ctx, k, x, y, v):
        """(d_y, d_v, d_x, f_i) at the local point (x_k, y_k, v_k), on step k's minibatches (eq. 3)."""
        return directions(self.oracles.on(ctx.client), ctx, k, x, y, v, self.independent)

    def rho(self, server, ids, uploads, round_: int = 0) -> torch.Tensor:
        """rho^t = sum_j p_j ||a_j||_1 (eq. 6): the known schedule of round ``round_``, or its unbiased estimate over
        C_t."""
        if self.cfg.rho == "known":
            tau = tau_at(server["tau"], round_, self.cfg.per_round)
            return (self._p.to(tau) * self.cfg.a * tau).sum()
        return (self.p_tilde(ids).to(uploads["a_norm"]) * uploads["a_norm"]).sum()

    def p(self) -> torch.Tensor:
        """Objective weights p_i (sum to 1; float64 on the algorithm's device)."""
        return self._p

    def p_tilde(self, ids) -> torch.Tensor:
        """The server weights of the sampled clients: p~_i = (n / |C_t|) p_i under uniform sampling (spec 2.2; not
        renormalised), p_i / pi_i under weighted sampling (pi_i: client i's probability of taking part)."""
        s = self.sampling
        if s is None or s.scheme == "uniform" or s.count(self.num_clients) == self.num_clients:
            return self.num_clients / ids.numel() * self._p[ids.to(self._p.device)]
        if self._pi is None:
            self._pi = inclusion_probabilities(s, self.num_clients, self.problem.data.weights).to(self._p.device)
        i = ids.to(self._p.device)
        return self._p[i] / self._pi[i]

    def coefficients(self, server, ids, uploads, round_: int = 0) -> torch.Tensor:
        """Per-client multipliers of the uploaded h: SimFBO p~_i ||a_i||_1 (q = ||a_i||_1 h), ShroFBO rho p~_i."""
        pt = self.p_tilde(ids).to(uploads["hx"])
        if self.cfg.normalized:
            return self.rho(server, ids, uploads, round_) * pt
        return pt * uploads["a_norm"]

    def aggregate(self, server, ids, uploads, round_):
        c = self.cfg
        w = self.coefficients(server, ids, uploads, round_)
        step = lambda h: w @ h  # sum_i w_i h_i
        return {
            **server,
            "x": server["x"] - c.gamma_x * step(uploads["hx"]),
            "y": server["y"] - c.gamma_y * step(uploads["hy"]),
            "v": project_ball(server["v"] - c.gamma_v * step(uploads["hv"]), c.r),
        }


class ShroFBOConfig(SimFBOConfig):
    """Defaults: the paper's heterogeneous-computation setting (A.2: eta = gamma = [0.03, 0.02, 0.01])."""

    eta_y: float = Field(0.03, ge=0, description="client step size of y")
    eta_v: float = Field(0.02, ge=0, description="client step size of v")
    eta_x: float = Field(0.01, ge=0, description="client step size of x")
    gamma_y: float = Field(0.03, gt=0, description="server step size of y")
    gamma_v: float = Field(0.02, gt=0, description="server step size of v")
    gamma_x: float = Field(0.01, gt=0, description="server step size of x")
    normalized: Literal[True] = Field(True, description="ShroFBO always normalises (eq. 6-8)")


@register
class ShroFBO(SimFBO):
    name = "shrofbo"
    description = "ShroFBO: SimFBO with normalised client directions and server step rho^t (eq. 6-8)"
    Config = ShroFBOConfig
    cfg: ShroFBOConfig
