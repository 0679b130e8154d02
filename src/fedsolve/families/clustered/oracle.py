"""FPFC theory checks: the oracle estimator of Theorem 3 and the augmented Lagrangian of eq. (8) (Lemma 2).

Used by tests and ``experiments/fpfc/oracle_gap.yaml``; the algorithm itself never needs them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedsolve.core.linear import aug_to_flat, linear_model_problem, weight_first, with_bias_feature
from fedsolve.families.clustered.fpfc.penalties import penalty_value


def oracle_models(problem, labels, *, tol: float = 1e-9, max_iter: int = 50) -> tuple[Tensor, float]:
    """The oracle estimator of Theorem 3: one model per known cluster, fitted to convergence.

    Cluster c's model minimizes ``F_c(w) = sum_{i in c} f_i(w)`` with f_i the device's *mean* loss, the objective
    FPFC reduces to once the cluster is fused (spec: Theorem 3's caveat; the same per-device weighting as FPFC,
    not the pooled sum). One-``nn.Linear`` models with cross-entropy or squared loss; damped Newton in float64
    with the exact Hessian, stopped when the gradient's max-norm is below ``tol``. Returns ``[m, d]`` (every
    device's cluster model, in the problem's flat layout) and the largest final gradient max-norm.
    """
    if not linear_model_problem(problem):
        raise ValueError(
            "oracle_models needs a model made of one nn.Linear with bias and loss cross_entropy "
            f"or squared_error (got loss {problem.loss_name!r})"
        )
    d = problem.data
    ce = problem.loss_name == "cross_entropy"
    X = with_bias_feature(d.train_x.reshape(d.train_x.shape[0], -1).to(torch.float64))
    owner = torch.repeat_interleave(torch.arange(d.num_clients), d.train_sizes)
    wt = 1.0 / d.train_sizes.to(torch.float64)[owner]  # mean loss per device
    lab = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    C = problem.layout.dim // X.shape[1]  # outputs
    out = torch.zeros(lab.numel(), problem.layout.dim)
    worst = 0.0
    for c in torch.unique(lab).tolist():
        rows = torch.isin(owner, torch.nonzero(lab == c).flatten())
        Xc, wc = X[rows], wt[rows]
        yc = d.train_y[rows]
        Yc = F.one_hot(yc.long(), C).to(X.dtype) if ce else yc.reshape(len(yc), -1).to(X.dtype)

        def loss_res(A, Xc=Xc, wc=wc, Yc=Yc):  # F_c and the residuals dF/dz (this class's rows)
            Z = Xc @ A.T
            if ce:
                return (wc * (torch.logsumexp(Z, 1) - (Z * Yc).sum(1))).sum(), torch.softmax(Z, 1) - Yc
            return (0.5 * wc * (Z - Yc).pow(2).sum(1)).sum(), Z - Yc

        def grad(Rz, Xc=Xc, wc=wc):  # [C, F+1]
            return (Rz * wc[:, None]).T @ Xc

        A = X.new_zeros(C, X.shape[1])
        for _ in range(max_iter):
            f, Rz = loss_res(A)
            g = grad(Rz)
            if float(g.abs().max()) < tol:
                break
            if ce:  # sum_s w_s (diag p_s - p_s p_s^T) (x) x_s x_s^T
                P = Rz + Yc
                H = torch.block_diag(*[(Xc * (wc * P[:, a])[:, None]).T @ Xc for a in range(C)])
                J = (P[:, :, None] * Xc[:, None, :]).reshape(len(Xc), -1)
                H -= (J * wc[:, None]).T @ J
            else:
                H = torch.block_diag(*[(Xc * wc[:, None]).T @ Xc] * C)
            ev, U = torch.linalg.eigh(H)  # pseudo-inverse: softmax is invariant to a common shift
            inv = torch.where(ev > ev.max() * 1e-12, 1.0 / ev.clamp_min(1e-300), torch.zeros_like(ev))
            step = (U @ (inv * (U.T @ g.reshape(-1)))).reshape(A.shape)
            t = 1.0
            while t > 1e-8 and float(loss_res(A - t * step)[0]) > float(f) - 0.25 * t * float((g * step).sum()):
                t *= 0.5  # Armijo backtracking
            A = A - t * step
        worst = max(worst, float(grad(loss_res(A)[1]).abs().max()))
        out[lab == c] = aug_to_flat(A.unsqueeze(0), weight_first(problem))[0].to(out.dtype)
    return out, worst


def augmented_lagrangian(algo, server, full_loss: Callable[[int, Tensor], float]) -> float:
    """L~_rho(w, theta, v) (eq. 8) with f_i given by ``full_loss(i, w_i)`` (fused block = whole model)."""
    c = algo.cfg
    m = algo.num_clients
    W = server["W"].double()
    th, v = (t.double() for t in algo.theta_v(server))
    Wf = W[:, algo.fidx]
    diff = Wf.unsqueeze(1) - Wf.unsqueeze(0) - th
    pen = penalty_value(th.norm(dim=-1), c.lam, c.a, c.xi, c.penalty)
    off = ~torch.eye(m, dtype=torch.bool)
    pair = (pen + (v * diff).sum(-1) + c.rho / 2 * diff.pow(2).sum(-1))[off].sum() / (2 * m)
    return float(sum(full_loss(i, W[i]) for i in range(m)) + pair)
