"""The authors' method on Table 4's QP (paper 002, App. E.2, Eq. 86), as their public LCQP code runs it: a
benchmark reference to time Prox-AL FL against, not a feature of fedsolve.

Algorithms 1-2 in NumPy, one party after another in one process, with the subproblems Eqs. 18-19 solved the way
the authors' code solves them: at every outer iteration each party's AL Hessian
``Q_i = A_i + beta C_i^T C_i + sigma I`` is rebuilt (the parties' matrices stacked along the last axis, as their
arrays are), and at every ADMM round each party forms its system ``Q_i + rho I`` (the server
``Q_0 + n rho I``) anew and calls a dense LU solve (``numpy.linalg.solve``); nothing is factored ahead. Their
code's stopping tests: Eq. 23 as ``sum_i eps~_i <= tau_k`` (their server solve is exact, so the paper's server
term is rounding), or with the paper's ``q^t`` (``inner_stop="paper"``); Eq. 11 as printed; caps K = T = 10,000.

``layout``:

* ``"paper"`` (default): the parties of the paper (n clients in the ADMM; the server owns its constraint and
  solves Eq. 18; prox share sigma = 1/((n+1) beta)). Its iterates are Prox-AL FL's, so a timing against ours
  compares the same iterations (same round counts).
* ``"code"``: the authors' code as written. The server is also a column of the party arrays (A_0 = 0, b_0 = 0)
  and takes part in the ADMM as a client, so its AL term enters Eq. 18 AND its own Eq. 19 (n + 2 prox shares of
  1/((n+2) beta), one more solve per round); Eq. 22 is read after u_i has been overwritten, i.e.
  ``||grad P_i(w^{t+1}) + lambda_i^t - rho (w^{t+1} - u_i^{t+1})||_inf``. The same w* (its doubled server term
  is the AL method for the constraint sqrt(2) c_0 = 0), with the server's multiplier at half the KKT one.

``solve="cached"`` factors each party's system once per run (Cholesky; the AL Hessians do not depend on the
multipliers) and back-substitutes every round: not the authors' code, the floor of a NumPy implementation of the
same iterations.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve

LAYOUTS = ("paper", "code")
SOLVES = ("lu", "cached")


def authors_proxal(inst: dict, w0: np.ndarray, beta: float, rho: float, s_bar: float, eps1: float, eps2: float,
                   q: float = 0.9, inner_stop: str = "code", layout: str = "paper", solve: str = "lu",
                   max_outer: int = 10000, max_inner: int = 10000) -> dict:
    """Algorithms 1-2 on ``inst`` (``qp_instance``'s arrays: A, b of the n clients; C, d of the server (row 0) and
    the clients) from ``w0`` and zero multipliers. Returns ``w``, ``mu`` ((n+1) x m, the server's first), the
    outer iterations ``outer``, the ADMM rounds ``admm_rounds`` and ``converged`` (Eq. 11 passed)."""
    if layout not in LAYOUTS or solve not in SOLVES or inner_stop not in ("code", "paper"):
        raise ValueError(f"authors_proxal: layout {layout!r}, solve {solve!r}, inner_stop {inner_stop!r}; allowed: "
                         f"layout {LAYOUTS}, solve {SOLVES}, inner_stop ('code', 'paper')")
    n, d = inst["A"].shape[0], inst["A"].shape[1]
    # party columns: the n clients, then the server (their code's order); A_0 = 0, b_0 = 0
    A = np.zeros((d, d, n + 1))
    A[:, :, :n] = np.moveaxis(inst["A"], 0, -1)
    b = np.concatenate([inst["b"].T, np.zeros((d, 1))], axis=1)
    C = np.concatenate([inst["C"][1:], inst["C"][:1]])              # (n+1, m, d)
    dd = np.concatenate([inst["d"][1:], inst["d"][:1]])             # (n+1, m)
    admm_parties = n + 1 if layout == "code" else n                 # the parties with a u-copy in the ADMM
    sigma = 1.0 / ((admm_parties + 1) * beta)
    eye, w, mu = np.eye(d), np.asarray(w0, dtype=np.float64).copy(), np.zeros(dd.shape)
    Q, p = np.zeros((d, d, n + 1)), np.zeros((d, n + 1))
    cached = None
    rounds = 0
    for k in range(max_outer):
        tau = s_bar / (k + 1) ** 2
        for i in range(n + 1):                                      # P_{i,k}: Hessian Q_i, gradient at 0 p_i
            if cached is None:
                Q[:, :, i] = A[:, :, i] + beta * C[i].T @ C[i] + sigma * eye
            p[:, i] = b[:, i] + C[i].T @ (mu[i] + beta * dd[i]) - sigma * w
        if solve == "cached" and cached is None:                    # Q does not depend on mu or w^k
            H = [np.ascontiguousarray(Q[:, :, i]) for i in range(n + 1)]
            cached = (H, [cho_factor(H[i] + rho * eye) for i in range(admm_parties)]
                      + [cho_factor(H[n] + admm_parties * rho * eye)])
        w_new, t = _admm(Q, p, w, rho, tau, q, inner_stop, layout, admm_parties, cached, max_inner)
        rounds += t
        mu_new = mu + beta * (np.einsum("imd,d->im", C, w_new) + dd)   # equalities: no projection
        dw, dmu = np.abs(w_new - w).max(), np.abs(mu_new - mu).max()
        w, mu = w_new, mu_new
        if dw + beta * tau <= beta * eps1 and dmu <= beta * eps2:
            return _result(w, mu, k + 1, rounds, True)
    return _result(w, mu, max_outer, rounds, False)


def _admm(Q, p, wk, rho, tau, q, inner_stop, layout, parties, cached, max_inner) -> tuple[np.ndarray, int]:
    """Algorithm 2 from w~^0 = w^k; returns ``(w^{T+1}, rounds)``. ``Q``, ``p``: the party columns (the server
    last); the first ``parties`` columns take part as clients. ``cached``: (contiguous Q_i, Cholesky factors)."""
    d, n = Q.shape[0], Q.shape[2] - 1
    eye = np.eye(d)
    u = np.repeat(wk[:, None], parties, axis=1)
    lam = -(np.einsum("abi,bi->ai", Q[:, :, :parties], u) + p[:, :parties])   # -grad P_i(w^k)
    ut = u + lam / rho
    et = np.zeros(parties)
    for t in range(max_inner):
        rhs = rho * ut.sum(1) - p[:, n]                             # Eq. 18, exactly
        w = np.linalg.solve(Q[:, :, n] + parties * rho * eye, rhs) if cached is None else cho_solve(cached[1][-1], rhs)
        for i in range(parties):                                    # Eqs. 19-22, one party after another
            rhs = rho * w - p[:, i] - lam[:, i]
            if cached is None:                                      # their code: form Q_i + rho I, LU-solve it
                Qi = Q[:, :, i] + rho * eye
                g = Qi @ w - rho * w + p[:, i] + lam[:, i]          # grad P_i(w^{t+1}) + lambda_i^t
                u_new = np.linalg.solve(Qi, rhs)
            else:
                g = cached[0][i] @ w + p[:, i] + lam[:, i]
                u_new = cho_solve(cached[1][i], rhs)
            # Eq. 22: with the old u_i^t (paper), or read after u_i is overwritten (their code)
            et[i] = np.abs(g - rho * (w - (u[:, i] if layout == "paper" else u_new))).max()
            u[:, i] = u_new
            lam[:, i] += rho * (u_new - w)
        ut = u + lam / rho
        if (q ** t if inner_stop == "paper" else 0.0) + et.sum() <= tau:   # Eq. 23
            return w, t + 1
    return w, max_inner


def _result(w, mu, outer, rounds, converged) -> dict:
    """The party order of ``qp_instance`` (server first) for the multipliers."""
    return {"w": w, "mu": np.concatenate([mu[-1:], mu[:-1]]), "outer": outer, "admm_rounds": rounds,
            "converged": converged}
