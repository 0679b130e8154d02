"""Client i's part of Prox-AL FL, stated for ONE client's state rows (the same code states the rows of K clients):

* :meth:`ClientSide.restart` -- Alg. 1 line 7, ``mu_i^{k+1} = [mu_i^k + beta c_i(w^{k+1})]_+`` (only its change
  ``||mu_i^{k+1} - mu_i^k||_inf`` is uploaded), then Alg. 2 line 1 at w^k: ``u_i^0 = w^k``,
  ``lambda_i^0 = -grad P_{i,k}(w^k)``, ``u~_i^0 = u_i^0 + lambda_i^0 / rho`` (uploaded);
* :meth:`ClientSide.step` -- Alg. 2 lines 7-8: ``u_i^{t+1} ~ argmin phi_{i,t}`` (Eq. 19) to
  ``||grad phi_{i,t}||_inf <= eps_{t+1}``, ``lambda_i^{t+1}`` (Eq. 20), ``u~_i^{t+1}`` (Eq. 21) and ``eps~_i``
  (Eq. 22, at the new w^{t+1} with the old u~_i^t), uploaded as ``(u~_i^{t+1}, eps~_i, residual)``.

Eq. 19 is solved by Newton's method (a ``Minimize`` statement: each client to its own tolerance), by SciPy's
L-BFGS-B (``solver: scipy``, a reference) or, for a quadratic problem (App. E.2), exactly from the client's
quadratic model built once from its data (:meth:`ClientSide.model`): ``grad P_{i,k}(u) = H_P u + g0_k`` with
``H = H_P + rho I = grad^2 f_i + beta J^T J + (sigma + rho) I`` packed with its inverse, so a round is two
products with one packed array (a ``Solved`` statement: no data read). A change of beta or rho (``set_hparams``)
re-packs ``H`` from the stored one.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad

from fedsolve.core.newton import inf_norm, scipy_lbfgsb
from fedsolve.core.statements import Minimize, Solved
from fedsolve.core.states import ClientStates
from fedsolve.families.constrained import subproblem as sp
from fedsolve.families.constrained.al import client_P, shifted
from fedsolve.families.constrained.config import ProxALConfig
from fedsolve.families.constrained.problem import ConstrainedSpec, Part

#: the quadratic model's entries in a client's rows, written in the first round (and on a change of beta or rho)
MODEL = ("pair", "pair_fix", "gf0", "J", "c0")
#: prefix of the rows that hold a client's slice of the problem's per-party tensors
DATA = "data."


class ClientSide:
    """Client i's computations (module docstring); ``solver`` is ``quadratic``, ``newton`` or ``scipy``."""

    def __init__(self, spec: ConstrainedSpec, cfg: ProxALConfig, n: int, solver: str):
        self.spec, self.cfg, self.n, self.solver = spec, cfg, n, solver
        self.sigma = 1.0 / ((n + 1) * cfg.beta)
        self.eq = spec.client_eq
        self._key_cache: tuple | None = None  # ((beta, rho, dtype, device), the [2] key tensor) of the last call

    def init_rows(self, d: int) -> ClientStates:
        """Every client's rows: multipliers mu_i, the ADMM rows (w^k, u_i, lambda_i, u~_i), its index and per-party
        tensors (read-only), and for a quadratic problem its model (written in the first round)."""
        n, m, f64 = self.n, self.spec.m_client, torch.float64
        rows = {"mu": torch.full((n, m), self.cfg.mu0, dtype=f64), "party": torch.arange(n)}
        for key in ("wk", "u", "lam", "ut") + (("w0",) if self.cfg.admm_start == "w0" else ()):
            rows[key] = torch.zeros(n, d, dtype=f64)
        data = {DATA + k: v.double() if v.is_floating_point() else v for k, v in self.spec.party_tensors.items()}
        constant = {}
        if self.solver == "quadratic":
            rows.update(g0=torch.zeros(n, d, dtype=f64), hkey=torch.full((n, 2), float("nan"), dtype=f64))
            pair, pair_fix = sp.pair_zeros(d, f64)
            constant = {
                "pair": pair,
                "pair_fix": pair_fix,
                "gf0": torch.zeros(d, dtype=f64),
                "J": torch.zeros(m, d, dtype=f64),
                "c0": torch.zeros(m, dtype=f64),
            }
        # written once per run and read every round: gathered without a copy (read-only)
        return ClientStates(n, {**rows, **data}, defaults=constant, readonly=[*constant, *data])

    # ----------------------------------------------------------------- Alg. 1 line 7 + Alg. 2 line 1
    def restart(self, state, w: Tensor, first: bool, ctx):
        """Round of an outer iteration at ``w = w^k`` (``first``: k = 0, no multiplier step yet)."""
        rho, new = self.cfg.rho, {}
        start = state["w0"] if "w0" in state and not first else w
        if first and "w0" in state:
            new["w0"] = w
        mu = state["mu"]
        if self.solver != "quadratic":
            part = self.part(state, *ctx.batch("train", 0))
            mu_new, dmu = (mu, mu.new_zeros(mu.shape[:-1])) if first else self.mu_step(mu, self.spec.c(w, part))
            lam = -grad(lambda u: client_P(self.spec, u, part, mu_new, w, self.cfg.beta, self.sigma))(start)
            return self.started(new, start, w, mu_new, lam, dmu)
        if first:  # the client's quadratic model, from one pass over its data
            model, H = self.model(self.part(state, *ctx.batch("train", 0)), w)
            new.update(model, hkey=self.key(state["hkey"]))
            mu_new, dmu = mu, mu.new_zeros(mu.shape[:-1])
            Hs = sp.mv(H, start)
        else:
            model, fresh = self.current(state)
            new.update(fresh)
            mu_new, dmu = self.mu_step(mu, model["c0"] + sp.mv(model["J"], w))
            Hs = sp.sym_pair_apply(model["pair"], model["pair_fix"], None, start)[1]
        new["g0"] = self.g0(model, mu_new, w)
        rows, upload = self.started(new, start, w, mu_new, -(Hs - rho * start + new["g0"]), dmu)
        return (rows, upload) if first else Solved(rows, upload)

    def mu_step(self, mu: Tensor, cw: Tensor) -> tuple[Tensor, Tensor]:
        """``mu^+ = [mu + beta c(w)]_+`` (equalities: no projection) and ``||mu^+ - mu||_inf``."""
        if mu.shape[-1] == 0:
            return mu, mu.new_zeros(mu.shape[:-1])
        mu_new = shifted(mu, cw, self.eq, self.cfg.beta)
        return mu_new, (mu_new - mu).abs().amax(-1)

    def started(self, new, start, w, mu, lam, dmu):
        ut = start + lam / self.cfg.rho
        return {**new, "mu": mu, "wk": w, "u": start, "lam": lam, "ut": ut}, {"ut": ut, "dmu": dmu}

    # ----------------------------------------------------------------- Alg. 2 lines 7-8
    def step(self, state, w: Tensor, eps: Tensor, ctx):
        """An ADMM round at the server's ``w = w^{t+1}`` with tolerance ``eps = eps_{t+1}``: Eqs. 19-22."""
        tol = eps * self.cfg.client_tol_factor
        lam, rho = state["lam"], self.cfg.rho
        if self.solver == "quadratic":  # exact: (H_P + rho I) u = rho w - grad P(0) - lambda
            model, fresh = self.current(state)
            g0 = fresh.get("g0", state["g0"])
            u, Hw = sp.sym_pair_apply(model["pair"], model["pair_fix"], rho * w - g0 - lam, w)
            res = w.new_zeros(w.shape[:-1])  # an exact solve: nothing to verify beyond rounding
            return Solved(*self.finish(state, w, u, res, Hw - rho * w + g0, fresh))
        args = (state["party"], self.tensors(state), state["mu"], state["wk"], lam, w)
        if self.solver == "scipy":
            x, y, wt = ctx.batch("train", 0)
            gP = grad(self.P)(w, x, y, wt, *args[:4])
            u, res, _ = scipy_lbfgsb(lambda v: self.phi(v, x, y, wt, *args), state["u"], float(tol))
            return self.finish(state, w, u, res, gP)
        return Minimize(
            self.phi,
            state["u"],
            tol,
            args=args,
            max_iter=self.cfg.newton_max_iter,
            modified=self.cfg.newton_step == "modified",
            then=lambda u, res, gradient: self.finish(state, w, u, res, gradient(self.P, w, *args[:4])),
        )

    def finish(self, state, w, u, res, gP, new=None):
        """Eqs. 20-22 after Eq. 19's solution ``u`` (``gP = grad P_{i,k}(w^{t+1})``)."""
        rho, lam = self.cfg.rho, state["lam"]
        lam_new = lam + rho * (u - w)  # Eq. 20
        ut = u + lam_new / rho  # Eq. 21
        if self.cfg.eps_tilde == "paper":
            et = inf_norm(gP - rho * (w - state["ut"]))  # Eq. 22, old u_i^t, lambda_i^t
        else:
            et = inf_norm(gP + lam_new - rho * (w - state["u"]))  # authors' NP code: new lambda
        return {**(new or {}), "u": u, "lam": lam_new, "ut": ut}, {"ut": ut, "et": et, "res": res}

    # ----------------------------------------------------------------- the client's functions
    def part(self, state, x: Tensor, y: Tensor, wt: Tensor) -> Part:
        return Part(x.double(), y.double(), (wt > 0).double(), state["party"], self.tensors(state))

    @staticmethod
    def tensors(state) -> dict[str, Tensor]:
        return {k[len(DATA) :]: v for k, v in state.items() if k.startswith(DATA)}

    def P(self, u, x, y, wt, i, tensors, mu, wk):
        """``P_{i,k}(u)`` (Eq. 14) on the client's batch ``(x, y, wt)``."""
        part = Part(x.double(), y.double(), (wt > 0).double(), i, tensors)
        return client_P(self.spec, u, part, mu, wk, self.cfg.beta, self.sigma)

    def phi(self, u, x, y, wt, i, tensors, mu, wk, lam, w):
        """Eq. 19's objective: ``P_{i,k}(u) + <lambda_i, u - w> + rho/2 ||u - w||^2``."""
        return (
            self.P(u, x, y, wt, i, tensors, mu, wk) + (lam * (u - w)).sum() + 0.5 * self.cfg.rho * (u - w).pow(2).sum()
        )

    # ----------------------------------------------------------------- the quadratic model (App. E.2)
    def model(self, part: Part, at: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """A quadratic client in closed form from one pass over its data: ``grad f_i(u) = gf0 + grad^2 f_i u`` and
        affine equality constraints ``c_i(u) = c0 + J u``, so ``grad P_{i,k}(u) = H_P u + g0_k`` whatever mu_i and
        w^k (:meth:`g0`). Returns the model (``gf0``, ``J``, ``c0``, ``H`` packed with its inverse) and ``H``."""
        spec, shift = self.spec, self.sigma + self.cfg.rho
        d = at.shape[-1]
        f = lambda u: spec.f(u, part)
        zero = torch.zeros_like(at)
        if spec.hessian is not None:  # the problem's closed form (one product instead of autodiff's four)
            H = spec.hess(part).to(at) + shift * torch.eye(d, dtype=at.dtype, device=at.device)
        else:
            H = sp.quadratic_hessian(lambda u: f(u) + 0.5 * shift * u.pow(2).sum(), at)
        J = sp.jacobian(lambda u: spec.c(u, part), at)
        if J.shape[0]:
            H = H + self.cfg.beta * (J.mT @ J)
        out = {"gf0": grad(f)(zero), "J": J, "c0": spec.c(zero, part)}
        out["pair"], out["pair_fix"] = sp.sym_pair(H)
        return out, H

    def g0(self, model: dict[str, Tensor], mu: Tensor, wk: Tensor) -> Tensor:
        """``grad P_{i,k}(0) = gf0 + J^T (mu_i^k + beta c0) - sigma w^k`` of a quadratic client."""
        return model["gf0"] + sp.mv(model["J"].mT, mu + self.cfg.beta * model["c0"]) - self.sigma * wk

    def key(self, like: Tensor) -> Tensor:
        """(beta, rho) of the current config, shaped like the rows' ``hkey``."""
        key = (self.cfg.beta, self.cfg.rho, like.dtype, like.device)
        if self._key_cache is None or self._key_cache[0] != key:
            self._key_cache = (key, torch.tensor([self.cfg.beta, self.cfg.rho], dtype=like.dtype, device=like.device))
        return self._key_cache[1].expand_as(like)

    def current(self, state) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The model in ``state``, re-packed where beta or rho changed since it was built (``set_hparams``), and the
        rows that change (none, or the new pair, its key and ``g0``)."""
        model = {k: state[k] for k in MODEL}
        key = self.key(state["hkey"])
        if torch.equal(state["hkey"], key):
            return model, {}
        beta0, rho0 = state["hkey"][..., 0], state["hkey"][..., 1]
        JJ = model["J"].mT @ model["J"]
        shift = (self.sigma + self.cfg.rho) - (1.0 / ((self.n + 1) * beta0) + rho0)
        eye = torch.eye(JJ.shape[-1], dtype=JJ.dtype, device=JJ.device)
        H = (
            sp.sym_unpack(model["pair"], model["pair_fix"])
            + (self.cfg.beta - beta0)[..., None, None] * JJ
            + shift[..., None, None] * eye
        )
        model["pair"], model["pair_fix"] = sp.sym_pair(H)
        fresh = {"pair": model["pair"], "pair_fix": model["pair_fix"], "hkey": key.clone()}
        fresh["g0"] = self.g0(model, state["mu"], state["wk"])
        return model, fresh
