"""FedAPM: federated ADMM with partial model personalization (Algorithm 1).

Zhu, Nie, Zeng, Wang, Sun, Yao, Chen, Xu, Yang. "FedAPM: Federated Learning via ADMM with Partial
Model Personalization", KDD 2025. Spec: shared/specs/fedapm.md.

Consensus form (3): ``min sum_i alpha_i f_i(v_i, u_i)  s.t.  u_i = u``; augmented Lagrangian (4):
``L_i = alpha_i f_i(v_i, u_i) + <pi_i, u_i - u> + (rho/2)||u_i - u||^2``. One round t:

    server  (8)  u^t = (1/m) sum_{i=1..m} z_i^t           (ALL m clients, latest z_i, uniform weights;
                 kept as the running sum S = sum_i z_i, S += z_i^{t+1} - z_i^t per participant)
    client i in S^t, in this order:
            (9)  v_i^{t+1} ~ argmin_v alpha_i f_i(v, u_i^t) + (sigma_i/2)||v - v_i^t||^2   (eq. 15 form)
            (10) xi_i^{t+1} = mu_i xi_i^t
            (11) u_i^{t+1} ~ argmin_u L_i(v_i^{t+1}, u, pi_i^t, u^t):
                 local SGD, gradient  alpha_i grad_u f_i + pi_i^t + rho (u - u^t)  at every step;
                 'xi_controlled': full-batch GD until ||that gradient||^2 <= xi_i^{t+1}
            (12) pi_i^{t+1} = pi_i^t + rho (u_i^{t+1} - u^t)
            (13) z_i^{t+1} = u_i^{t+1} + pi_i^{t+1} / rho       (z_i^{t+1} - z_i^t uploaded; v_i, pi_i never leave)
    client i not in S^t: (xi, v, u, pi, z)_i unchanged (eq. 14; the engine only touches selected rows).

``f_i`` includes the code's L2 term ``(weight_decay/2)||theta||^2`` (weight_decay = 0.01, which
makes cross-entropy coercive). Options where paper and code differ (spec sec. 2.3, 8): the v-step's
shared input (``v_shared``: paper ``local`` = u_i^t, code ``server`` = u^t), the u-solve's warm
start (``warm_start``), the stopping rule (``solver``), and alpha_i (``1/m`` as in the code, or n_i/n).
Without a ``personal`` block FedAPM is inexact consensus ADMM (FedADMM without personalization).
With ``dual: false`` (pi fixed at 0) and ``rho = 0`` it reduces to FedAlt with stale all-client
averaging (sec. 3); then ``z_i = u_i`` (never divides by rho = 0).

Reported at each evaluation (``report``): ``model_deviation = sum_i ||u_i - u||``; ``local_drift`` =
mean ||u_i^{t+1} - u^t|| at each client's latest participation (Fig. 5); and the stationarity measure
dist(0, dL) of Lemma 6, whose zero set is Definition 1 / eq. (6):
``||alpha_i grad_v f_i||, ||alpha_i grad_u f_i + pi_i + rho(u_i - u)||, ||u_i - u||, ||sum_i (pi_i + rho(u_i - u))||``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch.func import functional_call, grad

from fedsolve.core.plans import Work
from fedsolve.engine.algorithm import register
from fedsolve.families.personalized.partial import PartialAlgorithm, PartialConfig


class FedAPMConfig(PartialConfig):
    # defaults of the authors' code (spec sec. 2.5); lr per dataset: CIFAR10 0.1, CrisisMMD/KU-HAR 0.5, Crema-D 1.0
    lr: float = Field(0.1, gt=0, description="local learning rate (multiplies the alpha-scaled gradient)")
    local_epochs: float | None = Field(
        3.0, gt=0, description="epochs of the u-phase (and of the v-phase unless personal_epochs is set)"
    )
    batch_size: int | None = Field(50, ge=1, description="minibatch size (null = full batch)")
    weight_decay: float = Field(0.01, ge=0, description="L2 term in f_i (the code's mu = 0.01)")
    alpha: Literal["one", "uniform", "samples"] = Field("uniform", description="alpha_i: 1/m (code) or n_i/n")
    eval_shared: Literal["local", "server"] = Field(
        "local", description="evaluate with the client's local (v_i, u_i) (code) or with (v_i, u^t)"
    )
    log_other_eval: bool = Field(True, description="also log the (v_i, u^t) model's test metrics (other_eval_*)")
    rho: float = Field(0.01, ge=0, description="ADMM penalty rho (0 only with dual: false)")
    sigma: float = Field(0.01, ge=0, description="proximal coefficient sigma_i of the v-step")
    dual: bool = Field(True, description="false: pi fixed at 0 and z_i = u_i (penalty method / FedAlt reduction)")
    solver: Literal["fixed_epochs", "xi_controlled"] = Field(
        "fixed_epochs",
        description="'fixed_epochs': E epochs of minibatch SGD per phase (experiments); "
        "'xi_controlled': full-batch GD until ||grad_u L_i||^2 <= xi_i (theory)",
    )
    xi0: float = Field(1.0, gt=0, description="xi_i^0 (xi_controlled)")
    xi_decay: float = Field(0.9, gt=0, lt=1, description="mu_i: xi_i^{t+1} = mu_i xi_i^t")
    max_steps: int = Field(1000, ge=1, description="step guard of each xi_controlled phase")
    v_tol: float = Field(1e-12, ge=0, description="xi_controlled v-step: GD until ||grad_v||^2 <= v_tol")
    v_shared: Literal["local", "server"] = Field(
        "local", description="shared block the v-step sees: u_i^t (paper eq. 9) or u^t (the code)"
    )
    warm_start: Literal["server", "local"] = Field("server", description="u-solve starts at u^t or u_i^t")
    log_stationarity: bool = Field(True, description="log the eq. (6) residual (one full gradient per client)")

    @model_validator(mode="after")
    def _rho(self):
        if self.dual and self.rho <= 0:
            raise ValueError("rho: must be > 0 when dual is true (z_i = u_i + pi_i / rho); rho = 0 needs dual: false")
        return self


@register
class FedAPM(PartialAlgorithm):
    name = "fedapm"
    description = "FedAPM: ADMM with partial personalization, prox v-step, inexact u-step, z=u+pi/rho (Zhu 2025)"
    Config = FedAPMConfig
    cfg: FedAPMConfig

    def work(self, round_: int | None = 0):
        if round_ is None:
            return {}
        if self.cfg.solver == "xi_controlled":
            return {
                "v": Work(steps=self.cfg.max_steps, batch_size=None),
                "u": Work(steps=self.cfg.max_steps, batch_size=None),
            }
        return super().work()

    def init(self, x0, rngs):
        server, clients = super().init(x0, rngs)  # u^0 = mean_i z_i^0 with z_i^0 = u_i^0 = u^0, pi_i^0 = 0
        clients.set_default("pi", x0.new_zeros(self.d_u))  # one default row each: nothing [m, d] until used
        clients.set_default("xi", x0.new_full((), self.cfg.xi0))
        return server, clients

    def local_update(self, state, msg, ctx):
        c = self.cfg
        u_t, v, u_i, pi, rho = msg["u"], state["v"], state["u"], state["pi"], c.rho
        xi_ctl = c.solver == "xi_controlled"
        # (9) proximal v-step anchored at v_i^t: the pull sigma (p - v_i^t) as sigma p + (-sigma v_i^t)
        v_new = v
        if self.d_v:
            v_new = ctx.descend(
                self.block_descent(
                    ctx,
                    "v",
                    v,
                    u_i if c.v_shared == "local" else u_t,
                    prox=c.sigma,
                    linear=-c.sigma * v if c.sigma > 0 else None,
                    until=(lambda p, g: (g * g).sum() <= c.v_tol) if xi_ctl else None,
                )
            )
        # (10) tolerance decay
        xi = c.xi_decay * state["xi"]
        # (11) inexact u-step: pi_i^t + rho (u - u^t) enters every step, as rho u + (pi_i^t - rho u^t)
        admm = c.dual or rho > 0

        def then(u_new, steps):
            # (12) dual ascent with u^t; (13) upload z_i^{t+1} - z_i^t (the server keeps sum_i z_i)
            du = u_new - u_t
            pi_new = torch.add(pi, du, alpha=rho) if c.dual else pi
            rows = {
                "v": v_new,
                "u": u_new,
                "pi": pi_new,
                "xi": xi,
                "drift": torch.linalg.vector_norm(du, dim=-1),
            }  # ||u_i^{t+1} - u^t||
            return rows, self.upload(state, rows)

        return self.block_descent(
            ctx,
            "u",
            u_t if c.warm_start == "server" else u_i,
            v_new,
            prox=rho if admm else 0.0,
            linear=torch.add(pi, u_t, alpha=-rho) if admm else None,
            until=(lambda p, g: (g * g).sum() <= xi) if xi_ctl else None,
            then=then,
        )

    def z_of(self, state):
        """(13) ``z_i = u_i + pi_i / rho`` (``u_i`` with ``dual: false``)."""
        return state["u"] + state["pi"] / self.cfg.rho if self.cfg.dual else state["u"]

    # ------------------------------------------------------------------ report
    def report(self, server, clients, final: bool = False):
        out = super().report(server, clients, final)
        if final:
            return out
        out["dual_sum_norm"] = float(clients["pi"].sum(0).norm())
        if self.cfg.log_stationarity:
            out.update(self.stationarity(server, clients))
        return out

    def stationarity(self, server, clients) -> dict[str, float]:
        """Components of dL at the current point (Lemma 6) and their norm, ``stationarity``.

        ``kkt_v = sum_i ||alpha_i grad_v f_i||^2``, ``kkt_u = sum_i ||alpha_i grad_u f_i + pi_i +
        rho (u_i - u)||^2``, ``kkt_consensus = sum_i ||u_i - u||^2``, ``kkt_server =
        ||sum_i (pi_i + rho (u_i - u))||^2``; ``stationarity = sqrt(sum)``. Full training data.
        """
        c, prob, data = self.cfg, self.problem, self.problem.data
        m, u = self.num_clients, server["u"]
        wd = c.weight_decay

        kv = ku = 0.0
        srv = torch.zeros_like(u)
        # BatchNorm layers normalize by the client's batch statistics, as in its local steps, and keep their buffers
        with torch.enable_grad(), prob.running_stats.batch_statistics():
            for i in range(m):
                x, y = data.client_train(i)
                full = self.join(clients["v"][i], clients["u"][i])

                def f(p, x=x, y=y):
                    out = functional_call(prob.model, self.layout.unflatten(p), (x,))
                    return prob.loss_fn(out, y).mean() + 0.5 * wd * p.pow(2).sum()

                a = {"one": 1.0, "uniform": 1.0 / m}.get(c.alpha) or float(data.weights[i])
                gv, gu = self.split(a * grad(f)(full).detach())
                r = clients["u"][i] - u
                kv += float(gv.pow(2).sum())
                ku += float((gu + clients["pi"][i] + c.rho * r).pow(2).sum())
                srv = srv + clients["pi"][i] + c.rho * r
        kc = float((clients["u"] - u).pow(2).sum())
        ks = float(srv.pow(2).sum())
        return {
            "kkt_v": kv,
            "kkt_u": ku,
            "kkt_consensus": kc,
            "kkt_server": ks,
            "stationarity": math.sqrt(kv + ku + kc + ks),
        }
