"""The server's part of Prox-AL FL: Eq. 18 (its ADMM subproblem) and Alg. 1 line 5 (its multiplier step).

:class:`ServerSide` is built from the server's own party (Z_0, c_0, h) and the hyper-parameters alone, so it holds
no client data (spec 7.10; a test walks its references).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad

from fedsolve.core.newton import newton, scipy_lbfgsb
from fedsolve.families.constrained import subproblem as sp
from fedsolve.families.constrained.al import server_P, shifted
from fedsolve.families.constrained.config import ProxALConfig
from fedsolve.families.constrained.problem import ServerParty


class ServerSide:
    """The server's party (Z_0, c_0, h), n, rho, beta: solves Eq. 18 and updates mu_0."""

    def __init__(self, party: ServerParty, n: int, cfg: ProxALConfig, quadratic: bool, solver: str):
        self.party, self.n, self.cfg, self.quadratic, self.solver = party, n, cfg, quadratic, solver
        self.sigma = 1.0 / ((n + 1) * cfg.beta)
        self.eq0 = party.constraint.eq_mask if party.constraint is not None else torch.zeros(0, dtype=torch.bool)
        self._pair: tuple[Tensor, Tensor] | None = None  # caches of the quadratic case (server data only)
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
            return sp.prox_gradient(smooth, prox, start, tol, L0=S)
        if self.quadratic:  # grad phi_0(v) = H v + grad P_0(0) - rho sum_i u~_i: (H^{-1}, H) once
            if self._pair is None:
                self._pair = sp.sym_pair(sp.quadratic_hessian(smooth, start))
            if self._g0 is None or not all(torch.equal(a, b) for a, b in zip((mu0, wk), self._g0[0])):
                self._g0 = (
                    (mu0.clone(), wk.clone()),
                    grad(lambda v: server_P(self.party, v, mu0, wk, self.cfg.beta, sig))(torch.zeros_like(wk)),
                )
            rhs = rho * ut.sum(0) - self._g0[1]
            w, _ = sp.sym_pair_apply(*self._pair, rhs, None)
            if self.cfg.inner_stop != "measured":  # exact: the residual is rounding, read only by that Eq. 23
                return w, 0.0
            _, Hw = sp.sym_pair_apply(*self._pair, None, w)
            return w, float((Hw - rhs).abs().max())
        if self.solver == "scipy":
            w, res, _ = scipy_lbfgsb(smooth, start, tol)
        else:
            w, res, _ = newton(
                smooth, start, tol, self.cfg.newton_max_iter, alone=True, modified=self.cfg.newton_step == "modified"
            )
        return w, float(res)

    def update_mu(self, mu0: Tensor, w: Tensor) -> Tensor:
        """Alg. 1 line 5: ``mu_0^{k+1} = [mu_0^k + beta c_0(w^{k+1})]_+``."""
        if mu0.numel() == 0:
            return mu0
        return shifted(mu0, self.party.c(w).double(), self.eq0, self.cfg.beta)
