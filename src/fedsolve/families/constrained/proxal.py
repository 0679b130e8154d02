"""Prox-AL FL (paper 002, He, Peng & Sun 2024): Algorithm 1 (proximal AL outer loop) around Algorithm 2
(inexact ADMM inner loop), one engine round per communication round.

Outer iteration k (Alg. 1), with P_{i,k} of Eqs. 13-14 and sigma = 1/((n+1) beta):

    tau_k = s_bar / (k+1)^2
    w^{k+1} = Alg2(tau_k, w^k)                       dist_inf(0, d l_k(w^{k+1})) <= tau_k      (Eq. 10)
    mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+      (server)
    mu_i^{k+1} = [mu_i^k + beta c_i(w^{k+1})]_+      (client i; uploads only ||mu_i^{k+1} - mu_i^k||_inf)
    stop if ||w^{k+1} - w^k||_inf + beta tau_k <= beta eps1 and max_i ||mu_i^{k+1} - mu_i^k||_inf <= beta eps2  (Eq. 11)

Inner iteration t (Alg. 2), started at w~^0 = w^k with u_i^0 = w^k, lambda_i^0 = -grad P_i(w^k),
u~_i^0 = u_i^0 + lambda_i^0 / rho:

    eps_{t+1} = q^t
    server:  w^{t+1} ~ argmin P_0(w) + h(w) + sum_i rho/2 ||u~_i^t - w||^2                  (Eq. 18)
    client:  eps~_i = ||grad P_i(w^{t+1}) - rho (w^{t+1} - u~_i^t)||_inf                      (Eq. 22)
             u_i^{t+1} ~ argmin P_i(u) + <lambda_i^t, u - w^{t+1}> + rho/2 ||u - w^{t+1}||^2    (Eq. 19)
             lambda_i^{t+1} = lambda_i^t + rho (u_i^{t+1} - w^{t+1});  u~_i^{t+1} = u_i^{t+1} + lambda_i^{t+1}/rho
    stop if eps_{t+1} + sum_i eps~_i <= tau                                                    (Eq. 23)

Rounds. An *outer* round broadcasts w^k: each client updates its multipliers (not in the very first
round), starts its ADMM at w^k and uploads (u~_i^0, ||dmu_i||_inf); the server completes Eq. 11 for the
previous outer iteration, then solves Eq. 18. An *ADMM* round broadcasts (w^{t+1}, eps_{t+1}) and
collects (u~_i^{t+1}, eps~_i). When Eq. 23 passes, ``aggregate`` takes the outer step (w^{k+1},
mu_0^{k+1}) and the next round is an outer round. mu_i, lambda_i, u_i live in the clients' state rows;
the server side (:class:`ServerSide`) is built from the server's own party and holds no client data.
Paper-vs-authors'-code differences are options (paper by default; spec section 9).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor
from torch.func import grad, vmap

from fedsolve.engine.algorithm import Algorithm, register
from fedsolve.families.constrained import subproblem as sp
from fedsolve.families.constrained.al import client_P, server_P, shifted
from fedsolve.families.constrained.kkt import certificate, final_record
from fedsolve.families.constrained.problem import ConstrainedSpec, ServerParty, get_spec
from fedsolve.core.executor import Work
from fedsolve.core.states import ClientStates

OUTER_FIRST, OUTER, ADMM, DONE = 0, 1, 2, 3


class ProxALConfig(BaseModel):
    """Hyper-parameters of Algorithms 1-2. Defaults: the paper's Neyman-Pearson values (Sec. 5.1) and the
    authors' code's q, caps (spec 3.3); the suites set the fairness / QP values."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    beta: float = Field(300.0, gt=0, description="fixed AL penalty beta (no increase schedule)")
    s_bar: float = Field(1e-3, gt=0, description="inner tolerances tau_k = s_bar / (k+1)^2")
    rho: float = Field(0.01, gt=0, description="ADMM penalty rho_i (the same for every client)")
    q: float = Field(0.9, gt=0, lt=1, description="subproblem tolerances eps_{t+1} = q^t")
    eps1: float = Field(1e-3, gt=0, lt=1, description="stationarity target of Eq. 11 / Definition 1")
    eps2: float = Field(1e-3, gt=0, lt=1, description="feasibility/complementarity target of Eq. 11")
    max_outer: int = Field(100, ge=1, description="safety cap K_max on outer iterations (then: did not converge)")
    max_inner: int = Field(300, ge=1, description="safety cap T_max on ADMM rounds per outer iteration")
    mu0: float = Field(0.0, ge=0, description="initial multipliers mu_i^0 (every party)")
    w0: Literal["unit_sphere", "positive_sphere", "engine", "zero"] = Field(
        "unit_sphere", description="w^0: random on the unit sphere (paper), normalised Uniform[0,1)^d (code), the "
                                   "engine's model init, or zero")
    solver: Literal["auto", "newton", "quadratic", "scipy"] = Field(
        "auto", description="client/server subproblem solver: auto = quadratic (exact) for quadratic problems, "
                            "else newton; scipy = L-BFGS-B client by client (reference; sequential executor)")
    newton_eager_max_iter: int = Field(200, ge=1, description="cap on Newton steps per subproblem (clients under "
                                       "every executor, and the server): each stops once Eq. 19's tolerance is met")
    newton_step: Literal["modified", "plain"] = Field(
        "modified", description="Newton step where a subproblem's Hessian is not positive definite (a nonconvex "
                                "constraint, e.g. fairness): modified = H + 2|lambda_min| I, towards a local "
                                "minimiser; plain = H as it is (Table 2's reported runs)")
    inner_stop: Literal["paper", "measured", "code"] = Field(
        "paper", description="server term of Eq. 23: eps_{t+1} = q^t (paper), the server's measured residual, or "
                             "none (authors' NP/QP code)")
    eps_tilde: Literal["paper", "code"] = Field(
        "paper", description="Eq. 22 with the old lambda_i^t (paper) or the updated one (authors' NP code)")
    admm_start: Literal["wk", "w0"] = Field("wk", description="ADMM start w~^0 = w^k (paper) or the original w^0 "
                                                            "(authors' NP code)")
    eps_floor: float = Field(0.0, ge=0, description="eps_{t+1} = max(q^t, eps_floor) (authors' code: 1e-10)")
    client_tol_factor: float = Field(1.0, gt=0, le=1, description="clients solve Eq. 19 to ||grad||_inf <= "
                                     "client_tol_factor x eps_{t+1} (paper: 1; authors' NP code: 1e-2)")
    infeasible_patience: int = Field(40, ge=0, description="stop with an error naming the constraint when the "
                                     "largest multiplier step has not halved in this many outer iterations "
                                     "(an infeasible constraint: its multiplier grows without bound); 0 = off")


def initial_point(kind: str, x0: Tensor, seed_gen: torch.Generator) -> Tensor:
    """w^0 of the paper's protocol (spec 5: the same w^0 for Alg. 1 and cProx-AL within a trial)."""
    d = x0.numel()
    if kind == "engine":
        return x0.detach().double().clone()
    if kind == "zero":
        return torch.zeros(d, dtype=torch.float64, device=x0.device)
    cpu = {"generator": seed_gen, "dtype": torch.float64, "device": "cpu"}   # the same w^0 on every device
    v = torch.randn(d, **cpu) if kind == "unit_sphere" else torch.rand(d, **cpu)
    return (v / v.norm()).to(x0.device)


def party_rows(ctx, phase: str = "train") -> tuple[Tensor, Tensor, Tensor]:
    """This client's full-batch rows ``(x, y, mask)`` (float64), through the public ``ctx.batch`` (the stacked
    clients' ``[K, B, ...]`` in a :class:`~fedsolve.core.context.StackedContext`)."""
    x, y, w = ctx.batch(phase, 0)
    return x.double(), y.double(), (w > 0).double()


class ServerSide:
    """The server's part: its party (Z_0, c_0, h), n, rho, beta. Solves Eq. 18 and updates mu_0."""

    def __init__(self, party: ServerParty, n: int, cfg: ProxALConfig, quadratic: bool, solver: str):
        self.party, self.n, self.cfg = party, n, cfg
        self.sigma = 1.0 / ((n + 1) * cfg.beta)
        self.quadratic, self.solver = quadratic, solver
        self.eq0 = party.constraint.eq_mask if party.constraint is not None else torch.zeros(0, dtype=torch.bool)
        self._pair: tuple[Tensor, Tensor] | None = None   # caches of the quadratic case (server data only)
        self._g0: tuple | None = None

    def solve(self, ut: Tensor, mu0: Tensor, wk: Tensor, start: Tensor, tol: float) -> tuple[Tensor, float]:
        """Eq. 18: ``argmin P_0(w) + h(w) + sum_i rho/2 ||u~_i - w||^2`` to ``dist_inf(0, d phi_0) <= tol``;
        returns ``(w^{t+1}, measured residual)``."""
        rho, sig, prox = self.cfg.rho, self.sigma, self.party.prox
        S = ut.shape[0] * rho + sig
        if self.party.constraint is None:  # closed form (spec 3.1): rho-weighted average pulled to w^k, then prox
            return prox((rho * ut.sum(0) + sig * wk) / S, 1.0 / S), 0.0

        def smooth(v):
            return server_P(self.party, v, mu0, wk, self.cfg.beta, sig) + 0.5 * rho * (ut - v).pow(2).sum()

        if not prox.is_zero:
            w, res = sp.prox_gradient(smooth, prox, start, tol, L0=S)
            return w, res
        if self.quadratic:  # grad phi_0(v) = H v + grad P_0(0) - rho sum_i u~_i: (H^{-1}, H) once, g per k
            if self._pair is None:
                self._pair = sp.sym_pair(sp.quadratic_hessian(smooth, start))
            if self._g0 is None or not all(torch.equal(a, b) for a, b in zip((mu0, wk), self._g0[0])):
                self._g0 = ((mu0.clone(), wk.clone()), grad(
                    lambda v: server_P(self.party, v, mu0, wk, self.cfg.beta, sig))(torch.zeros_like(wk)))
            rhs = rho * ut.sum(0) - self._g0[1]
            w, _ = sp.sym_pair_apply(*self._pair, rhs, None)
            if self.cfg.inner_stop != "measured":   # exact: the residual is rounding, read only by that Eq. 23
                return w, 0.0
            _, Hw = sp.sym_pair_apply(*self._pair, None, w)
            return w, float((Hw - rhs).abs().max())
        if self.solver == "scipy":
            w, res, _ = sp.scipy_lbfgsb(smooth, start, tol)
        else:
            w, res, _ = sp.newton(smooth, start, tol, self.cfg.newton_eager_max_iter, eager=True,
                                  modified=self.cfg.newton_step == "modified")
        return w, float(res)

    def update_mu(self, mu0: Tensor, w: Tensor) -> Tensor:
        """Alg. 1 line 5: ``mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+``."""
        if mu0.numel() == 0:
            return mu0
        return shifted(mu0, self.party.c(w).double(), self.eq0, self.cfg.beta)


@register
class ProxAL(Algorithm):
    name = "proxal"
    description = "Prox-AL FL: proximal AL outer loop + inexact ADMM inner loop for constrained FL (He et al. 2024)"
    Config = ProxALConfig
    reports_train_loss = False   # a round solves Eq. 19 or updates multipliers: the certificate is the record

    def setup(self) -> None:
        spec: ConstrainedSpec = get_spec(self.problem, self.name)
        self.spec = spec
        self.d = self.layout.dim
        solver = self.cfg.solver
        if solver == "auto":
            solver = "quadratic" if spec.quadratic else "newton"
        if solver == "quadratic" and not spec.quadratic:
            raise ValueError(f"{self.name}: solver 'quadratic' needs a quadratic problem (ConstrainedSpec.quadratic)")
        self.solver_kind = solver
        self.sigma = 1.0 / ((self.num_clients + 1) * self.cfg.beta)
        self.eq = (spec.client_constraint.eq_mask if spec.client_constraint is not None
                   else torch.zeros(0, dtype=torch.bool))
        # the server's half: built from the server party only (no reference to client data)
        self.server_side = ServerSide(spec.server, self.num_clients, self.cfg, spec.quadratic, solver)

    def work(self, round_: int = 0) -> dict[str, Work]:
        return {"train": Work(epochs=None, steps=1, batch_size=None)}  # full batch: the client's rows Z_i

    # ----------------------------------------------------------------- state
    def divergence(self, server, factor):
        """Prox-AL reports no train loss: the server iterate w growing past ``factor`` x max(1, |w^0|_inf)."""
        size, start = float(server["w"].abs().max()), max(1.0, float(server["w0"].abs().max()))
        if size > factor * start:
            return (f"the iterate w diverged (|w|_inf = {size:.3g} > divergence_factor {factor:g} x "
                    f"max(1, |w^0|_inf) = {factor * start:.3g}); try a larger rho or a smaller beta")
        return None

    def init(self, x0, rngs):
        c, n, d = self.cfg, self.num_clients, x0.numel()
        w0 = initial_point(c.w0, x0, rngs.torch("proxal_w0"))
        z = torch.zeros((), dtype=torch.float64)
        server = {"w": w0.clone(), "w_prev": w0.clone(), "w0": w0.clone(), "z": w0.clone(),
                  "mu0": torch.full((self.spec.m_server,), c.mu0, dtype=torch.float64), "dmu0": z.clone(),
                  "k": torch.zeros((), dtype=torch.long), "t": torch.zeros((), dtype=torch.long),
                  "phase": torch.tensor(OUTER_FIRST), "tau": torch.tensor(c.s_bar, dtype=torch.float64),
                  "srv_res": z.clone(), "gap": z.clone(),
                  "dw": z.clone(), "dmu": z.clone(), "admm_rounds": torch.zeros((), dtype=torch.long),
                  "outer_rounds": torch.zeros((), dtype=torch.long), "inner_caps": torch.zeros((), dtype=torch.long),
                  "converged": torch.zeros((), dtype=torch.long), "floats_up": z.clone(), "floats_down": z.clone(),
                  "client_res": z.clone(), "dmu_ref": torch.tensor(1e300, dtype=torch.float64),
                  "stall": torch.zeros((), dtype=torch.long), "solve_misses": torch.zeros((), dtype=torch.long)}
        if self.solver_kind == "quadratic":   # (beta, rho) of the clients' factors (none yet)
            server["hkey"] = torch.full((2,), float("nan"), dtype=torch.float64)
        rows = {"mu": torch.full((n, self.spec.m_client), c.mu0, dtype=torch.float64)}
        for key in ("wk", "u", "lam", "ut"):
            rows[key] = torch.zeros(n, d, dtype=torch.float64)
        constant = {}
        if self.solver_kind == "quadratic":   # the client's quadratic model (_quadratic_model), built in round 0
            rows["g0"] = torch.zeros(n, d, dtype=torch.float64)
            m, f64 = self.spec.m_client, torch.float64
            constant = {"pair": torch.zeros(d, d, dtype=f64), "pair_fix": torch.zeros(d, dtype=f64),
                        "gf0": torch.zeros(d, dtype=f64), "J": torch.zeros(m, d, dtype=f64),
                        "c0": torch.zeros(m, dtype=f64)}
        # written once per run and read every round: gathered without a copy (read-only)
        return server, ClientStates(n, rows, defaults=constant, readonly=constant)

    def _hkey(self) -> Tensor:
        return torch.tensor([self.cfg.beta, self.cfg.rho], dtype=torch.float64)

    def _eps(self, t: int) -> float:
        return max(self.cfg.q ** t, self.cfg.eps_floor)

    # ----------------------------------------------------------------- the five functions
    def broadcast(self, server, ids, round_):
        if ids.numel() != self.num_clients:
            raise ValueError(f"{self.name}: Algorithms 1-2 use every client in every round; got {ids.numel()} of "
                             f"{self.num_clients} (set simulation.sampling.fraction: 1.0)")
        phase = int(server["phase"])
        if phase == DONE:
            return {"idle": self.expand(torch.zeros((), dtype=torch.float64), ids)}
        # quadratic: the clients (re)decompose Eq. 19's Hessian in the first round and after a change of beta or rho
        factor = "hkey" in server and not torch.equal(server["hkey"], self._hkey())
        if phase == ADMM:
            eps = torch.tensor(self._eps(int(server["t"])), dtype=torch.float64)
            msg = {"w": self.expand(server["z"], ids), "eps": self.expand(eps, ids)}
        else:
            msg = {"w_outer": self.expand(server["w"], ids)}
        if factor:
            msg["factor"] = self.expand(torch.ones((), dtype=torch.float64), ids)
        if phase == ADMM:
            return msg
        if self.cfg.admm_start == "w0":
            msg["w_start"] = self.expand(server["w0"], ids)
        if phase == OUTER_FIRST:
            msg["first"] = self.expand(torch.ones((), dtype=torch.float64), ids)
        return msg

    def finished(self, server) -> bool:
        """Eq. 11 has passed or the outer cap ``max_outer`` is reached: every later round is idle."""
        return int(server["phase"]) == DONE

    def stacked_update(self, msgs) -> bool:
        """An exact (quadratic) ADMM round reads only the client's packed Hessian pair and state rows, with
        batch-agnostic operations: the vectorized executor runs it once on the stacked clients (no ``vmap``)."""
        return self.solver_kind == "quadratic" and "w" in msgs and "factor" not in msgs

    def stacked_batches(self, msgs) -> bool:
        """An inexact ADMM round (Newton on Eq. 19) runs once on the stacked clients under the vectorized
        executor, its loops in Python, so every client is solved to its own tolerance as one by one (under
        ``vmap`` a fixed, masked number of steps would have to do for all)."""
        return self.solver_kind == "newton" and "w" in msgs

    def _P(self, rows, mu, wk):
        return lambda u: client_P(self.spec, u, rows, mu, wk, self.cfg.beta, self.sigma)

    def _phi(self, v, rows, mu, wk, lam, w):
        """Eq. 19's objective of one client: P_{i,k}(v) + <lambda_i, v - w> + rho/2 ||v - w||^2."""
        return self._P(rows, mu, wk)(v) + (lam * (v - w)).sum() + 0.5 * self.cfg.rho * (v - w).pow(2).sum()

    def _quadratic_model(self, rows, at: Tensor) -> dict[str, Tensor]:
        """A quadratic client (App. E.2) in closed form, from one pass over its data Z_i: quadratic f_i with
        ``grad f_i(u) = gf0 + grad^2 f_i u`` and affine equality constraints ``c_i(u) = c0 + J u``, so

            grad P_{i,k}(u) = H_P u + g0_k,   g0_k = gf0 + J^T (mu_i^k + beta c0) - sigma w^k      (Eq. 14)
            H = H_P + rho I = grad^2 f_i + beta J^T J + (sigma + rho) I                              (Eq. 19)

        whatever mu_i and w^k. Returns ``gf0``, ``J``, ``c0`` and ``H`` packed with its inverse (``pair``,
        ``pair_fix``: :func:`~fedsolve.families.constrained.subproblem.sym_pair`)."""
        d = at.shape[-1]
        f = lambda u: self.spec.objective(u, *rows)  # noqa: E731
        zero = torch.zeros_like(at)
        if self.spec.hessian is not None:   # the problem's closed form (one product instead of autodiff's four)
            H = self.spec.hessian(*rows).to(at) + (self.sigma + self.cfg.rho) * torch.eye(d, dtype=at.dtype)
        else:
            H = sp.quadratic_hessian(lambda u: f(u) + 0.5 * (self.sigma + self.cfg.rho) * u.pow(2).sum(), at)
        J = at.new_zeros(0, d)
        if self.spec.client_constraint is not None:
            J = sp.jacobian(lambda u: self.spec.c_client(u, *rows), at)
            H = H + self.cfg.beta * (J.mT @ J)
        out = {"gf0": grad(f)(zero), "J": J, "c0": self.spec.c_client(zero, *rows)}
        out["pair"], out["pair_fix"] = sp.sym_pair(H)
        return out

    def _g0(self, model: dict[str, Tensor], mu: Tensor, wk: Tensor) -> Tensor:
        """``grad P_{i,k}(0) = gf0 + J^T (mu_i^k + beta c0) - sigma w^k`` of a quadratic client."""
        return model["gf0"] + model["J"].mT @ (mu + self.cfg.beta * model["c0"]) - self.sigma * wk

    def local_update(self, state, msg, ctx):
        if "idle" in msg:  # Eq. 11 has passed: nothing left to do
            return {}, {"ack": msg["idle"] * 0}
        c, rho = self.cfg, self.cfg.rho
        new = {}  # only the rows that change (a quadratic client's model is written once per run)
        quadratic = self.solver_kind == "quadratic"
        if "factor" in msg:  # quadratic: Eq. 19's Hessian does not depend on mu_i, w^k or t: build it once
            new.update(self._quadratic_model(party_rows(ctx), state["wk"]))
            if "w" in msg:  # beta changed inside an inner loop: grad P(0) changes with it
                new["g0"] = self._g0(new, state["mu"], state["wk"])
        model = {k: new.get(k, state[k]) for k in ("pair", "pair_fix", "gf0", "J", "c0")} if quadratic else None
        if "w_outer" in msg:
            # Alg. 1 lines 6-8 (multipliers at w^k), then Alg. 2 line 1 for outer iteration k
            w = msg["w_outer"]
            mu = state["mu"]
            rows = None if quadratic else party_rows(ctx)
            if "first" in msg or mu.numel() == 0:
                mu_new, dmu = mu, torch.zeros((), dtype=torch.float64)
            else:
                cw = model["c0"] + model["J"] @ w if quadratic else self.spec.c_client(w, *rows)
                mu_new = shifted(mu, cw, self.eq, c.beta)
                dmu = (mu_new - mu).abs().amax()
            start = msg.get("w_start", w)
            if quadratic:  # grad P_{i,k}(start) = H start - rho start + g0_k (one half-read of the pair)
                new["g0"] = self._g0(model, mu_new, w)
                _, Hs = sp.sym_pair_mv(model["pair"], model["pair_fix"], None, start)
                lam = -(Hs - rho * start + new["g0"])
            else:
                lam = -grad(self._P(rows, mu_new, w))(start)
            ut = start + lam / rho
            new.update(mu=mu_new, wk=w, u=start, lam=lam, ut=ut)
            return new, {"ut": ut, "dmu": dmu}
        # Alg. 2 lines 7-8 (Eqs. 19-22)
        w, eps = msg["w"], msg["eps"]
        lam, u_old, ut_old = state["lam"], state["u"], state["ut"]
        if quadratic:  # exact: (H_P + rho I) u = rho w - grad P(0) - lambda
            g0 = new.get("g0", state["g0"])
            # (H_P + rho I)^{-1} rhs and (H_P + rho I) w from one read of the packed pair (memory-bound at large d)
            u, Hw = sp.sym_pair_mv(model["pair"], model["pair_fix"], rho * w - g0 - lam, w)
            gP = Hw - rho * w + g0
            res = w.new_zeros(w.shape[:-1])   # an exact solve: nothing to verify beyond rounding
        else:
            args = (party_rows(ctx), state["mu"], state["wk"], lam, w)   # stacked [K, ...] in a StackedContext
            each = vmap if ctx.stacked else (lambda fn: fn)
            gP = each(lambda v, rows, mu, wk: grad(self._P(rows, mu, wk))(v))(w, *args[:3])
            tol = eps * c.client_tol_factor
            if self.solver_kind == "scipy":
                u, res, _ = sp.scipy_lbfgsb(lambda v: self._phi(v, *args), u_old, float(tol))
            else:   # every client until its own tolerance is met (or the cap)
                u, res, _ = sp.newton(self._phi, u_old, tol, c.newton_eager_max_iter, eager=ctx.eager, args=args,
                                      stacked=ctx.stacked, modified=c.newton_step == "modified")
        lam_new = lam + rho * (u - w)
        ut = u + lam_new / rho
        if c.eps_tilde == "paper":
            et = (gP - rho * (w - ut_old)).abs().amax(-1)           # Eq. 22, old u_i^t and lambda_i^t
        else:
            et = (gP + lam_new - rho * (w - u_old)).abs().amax(-1)  # authors' NP code: updated lambda
        new.update(u=u, lam=lam_new, ut=ut)
        return new, {"ut": ut, "et": et, "res": res}

    def aggregate(self, server, ids, uploads, round_):
        c, srv = self.cfg, self.server_side
        s = dict(server)
        phase = int(server["phase"])
        if phase == DONE:
            return s
        if "hkey" in server:   # every client decomposed with the current (beta, rho) in this round
            s["hkey"] = self._hkey()
        k_clients, d = ids.numel(), server["w"].numel()
        up = sum(int(v[0].numel()) for v in uploads.values())
        down = d + (d if c.admm_start == "w0" and phase != ADMM else 0) + (1 if phase != OUTER else 0)
        s["floats_up"] = server["floats_up"] + k_clients * up
        s["floats_down"] = server["floats_down"] + k_clients * down
        ut = uploads["ut"].double()
        if phase in (OUTER_FIRST, OUTER):
            s["outer_rounds"] = server["outer_rounds"] + 1
            if phase == OUTER:  # Eq. 11 for the outer iteration just finished (w = w^{k+1}, tau = tau_k)
                dw = float((server["w"] - server["w_prev"]).abs().max())
                dmu = max(float(server["dmu0"]), float(uploads["dmu"].max()))
                s["dw"], s["dmu"] = torch.tensor(dw, dtype=torch.float64), torch.tensor(dmu, dtype=torch.float64)
                if dw + c.beta * float(server["tau"]) <= c.beta * c.eps1 and dmu <= c.beta * c.eps2:
                    s["phase"], s["converged"] = torch.tensor(DONE), torch.ones((), dtype=torch.long)
                    return s
                if int(server["k"]) >= c.max_outer:
                    s["phase"] = torch.tensor(DONE)
                    return s
                self._watch_feasibility(s, server, dmu, uploads["dmu"])
            k = int(server["k"])
            s["tau"] = torch.tensor(c.s_bar / (k + 1) ** 2, dtype=torch.float64)
            s["t"] = torch.zeros((), dtype=torch.long)
            start = server["w0"] if c.admm_start == "w0" else server["w"]
            z, res = srv.solve(ut, server["mu0"], server["w"], start, self._eps(0))
            s["z"], s["srv_res"] = z, torch.tensor(res, dtype=torch.float64)
            s["phase"] = torch.tensor(ADMM)
            return s
        # ADMM round: Eq. 23, then the outer step or the next server solve (Eq. 18)
        t = int(server["t"])
        e = {"paper": self._eps(t), "measured": float(server["srv_res"]), "code": 0.0}[c.inner_stop]
        gap = e + float(uploads["et"].sum())
        s["gap"] = torch.tensor(gap, dtype=torch.float64)
        s["client_res"] = torch.maximum(uploads["res"].max().double(), torch.zeros((), dtype=torch.float64))
        # spec 7.8: the clients' solves are verified against their tolerance; misses are counted, never hidden
        tol = c.client_tol_factor * self._eps(t)
        s["solve_misses"] = server["solve_misses"] + int((uploads["res"].double() > tol).sum())
        s["admm_rounds"] = server["admm_rounds"] + 1
        if gap <= float(server["tau"]) or t + 1 >= c.max_inner:
            if gap > float(server["tau"]):
                s["inner_caps"] = server["inner_caps"] + 1
            w_new = server["z"]
            mu0_new = srv.update_mu(server["mu0"], w_new)
            s["dmu0"] = ((mu0_new - server["mu0"]).abs().max() if mu0_new.numel()
                         else torch.zeros((), dtype=torch.float64))
            s["mu0"], s["w_prev"], s["w"] = mu0_new, server["w"], w_new
            s["k"] = server["k"] + 1
            s["phase"] = torch.tensor(OUTER)
            return s
        s["t"] = server["t"] + 1
        z, res = srv.solve(ut, server["mu0"], server["w"], server["z"], self._eps(t + 1))
        s["z"], s["srv_res"] = z, torch.tensor(res, dtype=torch.float64)
        return s

    def _watch_feasibility(self, s, server, dmu: float, dmu_clients: Tensor) -> None:
        """No progress on feasibility: the largest ||mu^{k+1} - mu^k||_inf (= beta x that party's violation once
        w settles) has not halved in ``infeasible_patience`` outer iterations -> a clear error naming it."""
        c = self.cfg
        if dmu < 0.5 * float(server["dmu_ref"]) or dmu <= c.beta * c.eps2:
            s["dmu_ref"], s["stall"] = torch.tensor(dmu, dtype=torch.float64), torch.zeros((), dtype=torch.long)
            return
        s["stall"] = server["stall"] + 1
        if c.infeasible_patience and int(s["stall"]) >= c.infeasible_patience:
            if float(server["dmu0"]) >= float(dmu_clients.max()):
                who = f"the server constraint {list(self.spec.server.constraint.names)}"
            else:
                i = int(dmu_clients.argmax())
                who = f"client {i}'s constraint {list(self.spec.client_constraint.names)}"
            raise ValueError(f"{self.name}: {who} looks infeasible: after {int(server['k'])} outer iterations its "
                             f"multiplier still grows by {dmu / c.beta:.3g} x beta per iteration (no halving in "
                             f"{c.infeasible_patience}); loosen the constraint or check its data "
                             f"(infeasible_patience=0 turns this check off)")

    def eval_broadcast(self, server, ids):
        return {"w": self.expand(server["w"], ids)}

    def eval_model(self, state, msg):
        return msg["w"].to(self.layout_dtype())

    def layout_dtype(self) -> torch.dtype:
        return next(self.problem.model.parameters()).dtype

    # ----------------------------------------------------------------- certificates
    def status(self, server) -> str:
        misses = int(server["solve_misses"])
        if not misses:
            return self._status(server)
        return (f"{self._status(server)}; {misses} client solve(s) stopped above Eq. 19's tolerance eps_t+1: at the "
                f"Newton cap (newton_eager_max_iter={self.cfg.newton_eager_max_iter}) or at float64's rounding floor "
                f"once q^t is below it (eps_floor bounds it)")

    def _status(self, server) -> str:
        caps = int(server["inner_caps"])
        if int(server["converged"]) and caps:
            return (f"Eq. 11 passed, but {caps} inner loop(s) stopped at max_inner={self.cfg.max_inner} before Eq. 23: "
                    f"Eq. 10 did not hold, so Theorem 3's certificate does not follow (see kkt_eps1/kkt_eps2)")
        if int(server["converged"]):
            return "converged (Eq. 11 passed)"
        if int(server["phase"]) == DONE:
            return f"did not converge: outer cap max_outer={self.cfg.max_outer} reached"
        return (f"did not converge: the run ended (simulation.rounds) at outer iteration {int(server['k'])} "
                f"before Eq. 11 passed")

    def diagnostics(self, server, clients) -> dict[str, float]:
        cert = certificate(self.spec, self.problem.data, server["w"], server["mu0"], clients["mu"])
        out = {k: v for k, v in cert.items()}
        out.update(outer_iterations=int(server["k"]), admm_rounds=int(server["admm_rounds"]),
                   outer_rounds=int(server["outer_rounds"]), inner_cap_hits=int(server["inner_caps"]),
                   converged=int(server["converged"]), tau=float(server["tau"]), inner_gap=float(server["gap"]),
                   floats_up=float(server["floats_up"]), floats_down=float(server["floats_down"]),
                   client_subproblem_residual=float(server["client_res"]),
                   client_solves_above_tolerance=int(server["solve_misses"]))
        return out

    def finalize(self, server, clients) -> dict[str, Any]:
        out = self.diagnostics(server, clients)
        out["status"] = self.status(server)
        out.update(final_record(self.spec, self.problem.data, server["w"]))
        return {"constrained": out}
