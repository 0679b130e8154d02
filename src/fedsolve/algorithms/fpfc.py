"""FPFC: clustered federated learning by nonconvex pairwise fusion (Yu, Liu, Wang, Sun; arXiv:2211.04218v3).

Objective (eq. 1/4), f_i a per-device *mean* loss, g~ the smoothed SCAD penalty (eq. 2-3):

    min_w  sum_i f_i(w_i) + (1/(2m)) sum_i sum_j g~(||w_i - w_j||, lam)

solved by inexact ADMM on the split w_i - w_j = theta_ij (eq. 7-8), Algorithm 2 of the paper:

* device i in A_k (local GD, eq. 5):   w <- w - alpha [grad f_i(w) + rho (w - zeta_i)]   (T_i steps)
* server, every unordered pair with i in A_k OR j in A_k (eq. 6):
      delta_ij = w_i - w_j + v_ij/rho;  theta_ij = prox(delta_ij);  v_ij += rho (w_i - w_j - theta_ij)
* server:  zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij/rho)    (row sums kept incrementally)

The prox of the smoothed SCAD penalty (4 branches, spec 2.4) and of the group-lasso penalty (FPFC-l1)
are *radial*: theta = s(||delta||) * delta with a scalar s. Hence v_new/rho = delta - theta =
(1 - s) delta, and the server stores, per pair, only ``delta_ij`` (d floats) and ``s_ij`` (1 float):

    theta_ij = s_ij * delta_ij,   v_ij = rho (1 - s_ij) delta_ij,   theta_ij - v_ij/rho = (2 s_ij - 1) delta_ij

(theta = v = 0 at start <=> delta = 0). Antisymmetry: delta_ji = -delta_ij, s_ji = s_ij.

Server state (a dict of tensors, checkpointable):
    ``W``  [m, d]   latest uploaded model of every device (all blocks)
    ``R``  [m, d_f] row sums  sum_j (theta_ij - v_ij/rho)   (zeta_i = mean_j W_j + R_i / m)
  dense layout (``pair_layout='dense'``):
    ``delta`` [m, m, d_f] (antisymmetric), ``scale`` [m, m]
  sparse layout (``pair_layout='sparse'``): only pairs touched so far, a growing pool
    ``pair_key`` [P] (p*m + q, p < q, in pool order), ``delta`` [P, d_f], ``scale`` [P]

Memory estimate (float32, d_f = fused dimension): dense 4 * m^2 * (d_f + 1) bytes, e.g. m = 100,
d_f = 610: 24.4 MB (the paper's theta + v upper triangle would be 2 * m(m-1)/2 * d_f = 6.0e6 floats,
24.2 MB); m = 1000: 2.4 GB. Sparse: (4 (d_f + 1) + 8) bytes per touched pair: with P touched pairs
that is 4 * P * d_f; P <= m(m-1)/2 (half the dense size once every pair is touched), and
P = k(m - k) + k(k-1)/2 after one round of k participants (useful for large m / few rounds /
newcomers). Both: + 4 * m * (d + d_f) for ``W`` and ``R``.
Server compute per round: O(|A_k| * m * d_f), vectorized (no Python loop over pairs).

Options: FPFC-l1 (``penalty='l1'`` or the registered ``fpfc_l1``), last-layer-only fusion (problem
block ``fused``: the rest is averaged FedAvg-style over the participants, spec 2.13), per-device
work (``SimulationConfig.work``), a growing number of local steps (``local_schedule``, Sec. 6.4.4),
all-pairs server updates (``update_pairs='all'``, the proof's convention), the warmup lambda path
(``warmup_lambda_path``, Sec. 4.3) and newcomers (``fpfc_newcomers``, Sec. 6.4.2).

Evaluation (spec 1.7 / 3.1, the reference code's choice): ||theta_ij|| <= nu -> graph -> connected
components; each device is scored with its cluster's n_i-weighted average model
(``eval_with='cluster'``; ``'local'`` uses w_i itself).

Communication: down zeta_i (+ the shared block), up w_i: 2 d per participant and round; the paper's
Cost adds the initial broadcast m * d (``paper_cost``).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor

from fedsolve.algorithms.base import Algorithm, AlgorithmConfig, register
from fedsolve.core import native
from fedsolve.core.executor import Work
from fedsolve.core.linear import GDStep, aug_to_flat, linear_model_problem, weight_first, with_bias_feature
from fedsolve.core.states import ClientStates, repeat_rows


# ====================================================================== penalties and prox
def scad(t: Tensor, lam: float, a: float = 3.7) -> Tensor:
    """SCAD penalty P_a(t, lam) (eq. 2), elementwise in |t|."""
    t = t.abs()
    mid = (a * lam * t - 0.5 * (t * t + lam * lam)) / (a - 1)
    return torch.where(t <= lam, lam * t, torch.where(t <= a * lam, mid, torch.full_like(t, lam * lam * (a + 1) / 2)))


def smoothed_scad(t: Tensor, lam: float, a: float = 3.7, xi: float = 1e-4) -> Tensor:
    """Smoothed SCAD P~_a(t, lam) (eq. 3): quadratic on |t| <= xi, SCAD beyond."""
    t = t.abs()
    if lam == 0:
        return torch.zeros_like(t)
    return torch.where(t <= xi, lam / (2 * xi) * t * t + xi * lam / 2, scad(t, lam, a))


def penalty_value(t: Tensor, lam: float, a: float, xi: float, penalty: str) -> Tensor:
    if penalty == "scad":
        return smoothed_scad(t, lam, a, xi)
    return lam * t * t if penalty == "l2sq" else lam * t.abs()


def prox_scale(r: Tensor, lam: float, rho: float, a: float = 3.7, xi: float = 1e-4,
               penalty: Literal["scad", "l1", "l2sq"] = "scad") -> Tensor:
    """Scalar s(r) with prox(delta) = s(||delta||) * delta (eq. 6; spec 2.4), vectorized over ``r``.

    ``scad``: argmin_theta P~_a(||theta||, lam) + rho/2 ||delta - theta||^2, 4 branches:
        r <= xi + lam/rho            s = xi rho / (lam + xi rho)
        r <= lam + lam/rho           s = 1 - lam / (rho r)
        r <= a lam                   s = max(0, 1 - a lam / ((a-1) rho r)) / (1 - 1/((a-1) rho))
        r >  a lam                   s = 1
    ``l1``: group soft-threshold at lam/rho, s = max(0, 1 - lam / (rho r)).
    ``l2sq`` (g(t) = lam t^2, Fig. 1's ridge fusion): s = rho / (rho + 2 lam), never 0.
    """
    rs = r.clamp_min(1e-30)
    if penalty == "l1":
        return (1 - lam / (rho * rs)).clamp_min(0.0)
    if penalty == "l2sq":
        return torch.full_like(r, rho / (rho + 2 * lam))
    if lam == 0:
        return torch.ones_like(r)
    s1 = xi * rho / (lam + xi * rho)
    s2 = 1 - lam / (rho * rs)
    s3 = (1 - a * lam / ((a - 1) * rho * rs)).clamp_min(0.0) / (1 - 1 / ((a - 1) * rho))
    one = torch.ones_like(r)
    return torch.where(r <= xi + lam / rho, torch.full_like(r, s1),
                       torch.where(r <= lam + lam / rho, s2, torch.where(r <= a * lam, s3, one)))


def prox(delta: Tensor, lam: float, rho: float, a: float = 3.7, xi: float = 1e-4, penalty: str = "scad") -> Tensor:
    """theta = prox(delta) over the last dimension (the joint l2 norm of the fused block)."""
    return prox_scale(delta.norm(dim=-1), lam, rho, a, xi, penalty).unsqueeze(-1) * delta


def pair_step(w_p: Tensor, w_q: Tensor, delta: Tensor, scale: Tensor, prox_fn: Callable[[Tensor], Tensor]
              ) -> tuple[Tensor, Tensor]:
    """One ADMM pair update in the (delta, s) representation, any leading shape.

    v_old/rho = (1 - s_old) delta_old;  delta_new = w_p - w_q + v_old/rho;  s_new = prox_scale(||delta_new||)
    (so theta_new = s_new delta_new and v_new/rho = delta_new - theta_new).
    """
    d_new = torch.addcmul(w_p - w_q, (1 - scale).unsqueeze(-1), delta)
    return d_new, prox_fn(d_new.norm(dim=-1))


# ====================================================================== server-side pair stores
def _touched_pairs(ids: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Unordered pairs (p < q) with p or q in ``ids``, each once (row-major over ids)."""
    k = ids.numel()
    is_act = torch.zeros(m, dtype=torch.bool)
    is_act[ids] = True
    I = ids.unsqueeze(1).expand(k, m)
    J = torch.arange(m).unsqueeze(0).expand(k, m)
    keep = (I != J) & (~is_act[J] | (I < J))
    I, J = I[keep], J[keep]
    return torch.minimum(I, J), torch.maximum(I, J)


class DensePairs:
    """theta/v for all pairs as an antisymmetric ``[m, m, d_f]`` delta and ``[m, m]`` scale.

    The update runs the compiled ``core/kernels/pair_update.c`` (two passes over the touched pairs) for
    float32 stores where a C compiler is found and the run's ``kernel`` is not ``torch``, else
    :meth:`update_torch`; the two agree to float rounding (tests/test_fpfc.py)."""

    @staticmethod
    def init(m: int, df: int, dtype) -> dict[str, Tensor]:
        return {"delta": torch.zeros(m, m, df, dtype=dtype), "scale": torch.zeros(m, m, dtype=dtype)}

    @staticmethod
    def compiled(dtype: torch.dtype, kernel: str = "auto"):
        """The compiled pair kernel for a store of ``dtype`` under the run's ``kernel``, or None (torch)."""
        return native.load("pair_update") if dtype == torch.float32 and kernel != "torch" else None

    @staticmethod
    def update(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn, kernel: str = "auto") -> None:
        """In place: rows ``ids`` (and their antisymmetric columns) and the row sums ``R``."""
        contiguous = st["delta"].is_contiguous() and st["scale"].is_contiguous()
        lib = DensePairs.compiled(st["delta"].dtype, kernel) if contiguous else None
        if lib is None:
            DensePairs.update_torch(st, Wf, ids, prox_fn)
        else:
            DensePairs.update_native(lib, st, Wf, ids, prox_fn)

    @staticmethod
    def update_native(lib, st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn) -> None:
        """:meth:`update` by the compiled kernel: pass 1 forms every touched delta and its norm, the prox
        scales come from ``prox_fn``, pass 2 writes the pairs and the row sums (see pair_update.c)."""
        delta, scale, R = st["delta"], st["scale"], st["R"]
        m, d = Wf.shape
        k = ids.numel()
        ids = ids.to(torch.int64).contiguous()
        Wf = Wf.to(torch.float32).contiguous()
        nth = max(1, min(torch.get_num_threads(), k))
        parts = [(k * t // nth, k * (t + 1) // nth) for t in range(nth)]
        Dn, r2 = torch.empty(k, m, d), torch.empty(k, m)
        col_old = [torch.zeros(m, d) for _ in parts]
        P = native.pointer
        native.parallel(lambda t: lib.pair_delta(P(delta), P(scale), P(Wf), m, d, P(ids), *parts[t], P(Dn), P(r2),
                                                 P(col_old[t])), range(len(parts)))
        S_new = prox_fn(r2.sqrt()).to(torch.float32).contiguous()
        active = torch.zeros(m, dtype=torch.uint8)
        active[ids] = 1
        row = torch.empty(k, d)
        col_new = [torch.zeros(m, d) for _ in parts]
        native.parallel(lambda t: lib.pair_write(P(delta), P(scale), P(Dn), P(S_new), m, d, P(ids), P(active),
                                                 *parts[t], P(row), P(col_new[t])), range(len(parts)))
        R.sub_(torch.stack(col_new).sum(0) - torch.stack(col_old).sum(0))   # rows j: entries (j, i) = -(i, j)
        R.index_copy_(0, ids, row)                                          # rows i in ids: recomputed whole

    @staticmethod
    def update_torch(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn) -> None:
        """:meth:`update` in tensor operations (the reference)."""
        D_old = st["delta"].index_select(0, ids)                     # [k, m, d]
        S_old = st["scale"].index_select(0, ids)                     # [k, m]
        D_new, S_new = pair_step(Wf.index_select(0, ids).unsqueeze(1), Wf.unsqueeze(0), D_old, S_old, prox_fn)
        # change of theta_ij - v_ij/rho = (2 s - 1) delta for the pairs (i in ids, j)
        E = (2 * S_new - 1).unsqueeze(-1) * D_new
        E.addcmul_((2 * S_old - 1).unsqueeze(-1), D_old, value=-1.0)
        R = st["R"]
        R_act = R.index_select(0, ids) + E.sum(1)                    # rows i in ids: all their pairs
        R.sub_(E.sum(0))                                             # rows j: entries (j, i) = -(i, j)
        R.index_copy_(0, ids, R_act)
        st["delta"].index_copy_(1, ids, D_new.neg().transpose(0, 1))
        st["delta"].index_copy_(0, ids, D_new)
        st["scale"].index_copy_(1, ids, S_new.transpose(0, 1))
        st["scale"].index_copy_(0, ids, S_new)

    @staticmethod
    def norms(st: dict[str, Tensor], m: int) -> Tensor:
        """``[m, m]`` matrix of ||theta_ij||."""
        return st["scale"].abs() * st["delta"].norm(dim=-1)

    @staticmethod
    def theta_v(st, m: int, rho: float) -> tuple[Tensor, Tensor]:
        D, S = st["delta"], st["scale"].unsqueeze(-1)
        return S * D, rho * (1 - S) * D


class SparsePairs:
    """Only the pairs touched so far: a growing pool keyed by ``p * m + q`` (p < q)."""

    @staticmethod
    def init(m: int, df: int, dtype) -> dict[str, Tensor]:
        return {"pair_key": torch.zeros(0, dtype=torch.long), "delta": torch.zeros(0, df, dtype=dtype),
                "scale": torch.zeros(0, dtype=dtype)}

    @staticmethod
    def slots(st: dict[str, Tensor], keys: Tensor) -> Tensor:
        """Pool slots of ``keys``, appending zero entries for keys never touched before."""
        pool = st["pair_key"]
        P = pool.numel()
        slot = torch.full_like(keys, -1)
        if P:
            sk, order = torch.sort(pool)
            pos = torch.searchsorted(sk, keys).clamp_max(P - 1)
            found = sk[pos] == keys
            slot = torch.where(found, order[pos], slot)
        new = slot < 0
        n_new = int(new.sum())
        if n_new:
            slot[new] = torch.arange(P, P + n_new)
            st["pair_key"] = torch.cat([pool, keys[new]])
            st["delta"] = torch.cat([st["delta"], st["delta"].new_zeros(n_new, st["delta"].shape[1])])
            st["scale"] = torch.cat([st["scale"], st["scale"].new_zeros(n_new)])
        return slot

    @staticmethod
    def update(st: dict[str, Tensor], Wf: Tensor, ids: Tensor, prox_fn, kernel: str = "auto") -> None:
        """In place, tensor operations only (``kernel`` is accepted for the common interface)."""
        m = Wf.shape[0]
        p, q = _touched_pairs(ids, m)
        slot = SparsePairs.slots(st, p * m + q)
        D_old, S_old = st["delta"][slot], st["scale"][slot]
        D_new, S_new = pair_step(Wf[p], Wf[q], D_old, S_old, prox_fn)
        E = (2 * S_new - 1).unsqueeze(-1) * D_new - (2 * S_old - 1).unsqueeze(-1) * D_old
        st["R"].index_add_(0, p, E)
        st["R"].index_add_(0, q, E.neg())
        st["delta"][slot] = D_new
        st["scale"][slot] = S_new

    @staticmethod
    def norms(st: dict[str, Tensor], m: int) -> Tensor:
        N = torch.zeros(m, m, dtype=st["delta"].dtype)
        key = st["pair_key"]
        if key.numel():
            nrm = st["scale"].abs() * st["delta"].norm(dim=-1)
            p, q = key // m, key % m
            N[p, q] = nrm
            N[q, p] = nrm
        return N

    @staticmethod
    def theta_v(st, m: int, rho: float) -> tuple[Tensor, Tensor]:
        df = st["delta"].shape[1]
        D = torch.zeros(m, m, df, dtype=st["delta"].dtype)
        S = torch.zeros(m, m, dtype=st["delta"].dtype)
        key = st["pair_key"]
        if key.numel():
            p, q = key // m, key % m
            D[p, q], D[q, p] = st["delta"], -st["delta"]
            S[p, q], S[q, p] = st["scale"], st["scale"]
        S = S.unsqueeze(-1)
        return S * D, rho * (1 - S) * D


PAIR_STORES = {"dense": DensePairs, "sparse": SparsePairs}


# ====================================================================== clustering read-out
def connected_components(adj: np.ndarray) -> np.ndarray:
    """Component labels (0..L-1, numbered by first member) of a symmetric boolean adjacency matrix."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components as cc

    _, lab = cc(csr_matrix(adj), directed=False)
    # renumber by order of first appearance (stable, readable)
    _, first = np.unique(lab, return_index=True)
    remap = np.empty(lab.max() + 1, dtype=np.int64)
    remap[np.argsort(first)] = np.arange(first.size)
    return remap[lab]


def clusters_from_norms(norms: Tensor, nu: float) -> np.ndarray:
    adj = (norms <= nu).cpu().numpy()
    np.fill_diagonal(adj, True)
    return connected_components(adj)


def cluster_average(W: Tensor, labels: np.ndarray, n: Tensor) -> Tensor:
    """Replace every row by its cluster's n_i-weighted mean (spec 1.7)."""
    lab = torch.as_tensor(labels, dtype=torch.long)
    L = int(lab.max()) + 1
    n = n.to(W.dtype)
    num = torch.zeros(L, W.shape[1], dtype=W.dtype).index_add_(0, lab, n.unsqueeze(1) * W)
    den = torch.zeros(L, dtype=W.dtype).index_add_(0, lab, n)
    return (num / den.unsqueeze(1))[lab]


def oracle_models(problem, labels, *, tol: float = 1e-9, max_iter: int = 50) -> tuple[Tensor, float]:
    """The oracle estimator of Theorem 3: one model per known cluster, fitted to convergence.

    Cluster c's model minimizes ``F_c(w) = sum_{i in c} f_i(w)`` with f_i the device's *mean* loss, the objective
    FPFC reduces to once the cluster is fused (spec: Theorem 3's caveat; the same per-device weighting as FPFC,
    not the pooled sum). One-``nn.Linear`` models with cross-entropy or squared loss; damped Newton in float64
    with the exact Hessian, stopped when the gradient's max-norm is below ``tol``. Returns ``[m, d]`` (every
    device's cluster model, in the problem's flat layout) and the largest final gradient max-norm.
    """
    if not linear_model_problem(problem):
        raise ValueError("oracle_models needs a model made of one nn.Linear with bias and loss cross_entropy "
                         f"or squared_error (got loss {problem.loss_name!r})")
    d = problem.data
    ce = problem.loss_name == "cross_entropy"
    X = with_bias_feature(d.train_x.reshape(d.train_x.shape[0], -1).to(torch.float64))
    owner = torch.repeat_interleave(torch.arange(d.num_clients), d.train_sizes)
    wt = 1.0 / d.train_sizes.to(torch.float64)[owner]                      # mean loss per device
    lab = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    C = problem.layout.dim // X.shape[1]                                    # outputs
    out = torch.zeros(lab.numel(), problem.layout.dim)
    worst = 0.0
    for c in torch.unique(lab).tolist():
        rows = torch.isin(owner, torch.nonzero(lab == c).flatten())
        Xc, wc = X[rows], wt[rows]
        yc = d.train_y[rows]
        Yc = F.one_hot(yc.long(), C).to(X.dtype) if ce else yc.reshape(len(yc), -1).to(X.dtype)

        def loss_res(A):                                   # F_c and the residuals dF/dz
            Z = Xc @ A.T
            if ce:
                return (wc * (torch.logsumexp(Z, 1) - (Z * Yc).sum(1))).sum(), torch.softmax(Z, 1) - Yc
            return (0.5 * wc * (Z - Yc).pow(2).sum(1)).sum(), Z - Yc

        def grad(Rz):                                      # [C, F+1]
            return (Rz * wc[:, None]).T @ Xc

        A = X.new_zeros(C, X.shape[1])
        for _ in range(max_iter):
            f, Rz = loss_res(A)
            g = grad(Rz)
            if float(g.abs().max()) < tol:
                break
            if ce:                                         # sum_s w_s (diag p_s - p_s p_s^T) (x) x_s x_s^T
                P = Rz + Yc
                H = torch.block_diag(*[(Xc * (wc * P[:, a])[:, None]).T @ Xc for a in range(C)])
                J = (P[:, :, None] * Xc[:, None, :]).reshape(len(Xc), -1)
                H -= (J * wc[:, None]).T @ J
            else:
                H = torch.block_diag(*[(Xc * wc[:, None]).T @ Xc] * C)
            ev, U = torch.linalg.eigh(H)                   # pseudo-inverse: softmax is invariant to a common shift
            inv = torch.where(ev > ev.max() * 1e-12, 1.0 / ev.clamp_min(1e-300), torch.zeros_like(ev))
            step = (U @ (inv * (U.T @ g.reshape(-1)))).reshape(A.shape)
            t = 1.0
            while t > 1e-8 and float(loss_res(A - t * step)[0]) > float(f) - 0.25 * t * float((g * step).sum()):
                t *= 0.5                                   # Armijo backtracking
            A = A - t * step
        worst = max(worst, float(grad(loss_res(A)[1]).abs().max()))
        out[lab == c] = aug_to_flat(A.unsqueeze(0), weight_first(problem))[0].to(out.dtype)
    return out, worst


def adjusted_rand(labels, truth) -> float:
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(truth), np.asarray(labels)))


# ====================================================================== the algorithm
class FPFCConfig(AlgorithmConfig):
    lr: float = Field(0.1, gt=0, description="local step size alpha")
    local_epochs: float | None = Field(10.0, gt=0, description="local epochs (full-batch GD: = steps T)")
    batch_size: int | None = Field(None, ge=1, description="null = full-batch gradient descent (paper)")
    lam: float = Field(0.6, ge=0, description="fusion penalty lambda")
    rho: float = Field(1.0, gt=0, description="ADMM penalty rho")
    a: float = Field(3.7, gt=1, description="SCAD concavity parameter a")
    xi: float = Field(1e-4, gt=0, description="SCAD smoothing xi (0 < xi < lambda)")
    penalty: Literal["scad", "l1", "l2sq"] = Field(
        "scad", description="smoothed SCAD (FPFC), group lasso (FPFC-l1) or squared l2 (Fig. 1's ridge fusion)")
    nu: float = Field(0.1, gt=0, description="cluster threshold: i~j iff ||theta_ij|| <= nu (paper: [xi, 0.5])")
    pair_layout: Literal["dense", "sparse", "auto"] = Field(
        "auto", description="server pair store; auto = dense when m^2 d_f <= 5e7 floats")
    update_pairs: Literal["touched", "all"] = Field(
        "touched", description="'touched': pairs with an active end (Algorithm 2); 'all': every pair (proofs)")
    eval_with: Literal["cluster", "local"] = Field("cluster", description="score devices with their cluster's "
                                                   "n_i-weighted average (reference code) or with w_i")
    fused_block: str = Field("fused", description="problem block fused by FPFC; the rest is averaged over the "
                                                  "participants (FedAvg). Absent block = the whole model")
    shared_weighting: Literal["uniform", "samples"] = Field("uniform", description="average of the shared block "
                                                            "(reference code: uniform over participants)")
    local_schedule: Literal["constant", "growing"] = Field(
        "constant", description="'growing': T_k = max(1, ceil(k / growth_rounds)) local steps (Sec. 6.4.4)")
    growth_rounds: float = Field(20.0, gt=0, description="T_k = ceil(k / growth_rounds) (20 synthetic, 2 MNIST, "
                                                         "1 -> k+1 for H&BF)")
    growth_offset: int = Field(0, ge=0, description="added to k before the ceil (H&BF: T_k = k + 1 -> 1)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr multiplied by lr_decay every lr_decay_every rounds")
    lr_decay_every: int = Field(5, ge=1, description="rounds between lr decays")
    init_std: float | None = Field(None, gt=0, description="w^0 entries ~ N(0, init_std^2) (synthetic code: 1); "
                                                           "null = the model's own init")
    dtype: Literal["float32", "float64"] = Field("float32", description="server pair-store dtype")

    @model_validator(mode="after")
    def _check(self):
        if self.penalty == "scad" and self.lam > 0:
            if self.rho <= 1 / (self.a - 1):
                raise ValueError(f"rho={self.rho} must exceed 1/(a-1)={1 / (self.a - 1):.4g} for the SCAD prox")
            if self.a < 1 + 1 / self.rho:
                raise ValueError(f"a={self.a} must be >= 1 + 1/rho={1 + 1 / self.rho:.4g} (prox branch order)")
            if self.xi >= self.lam:
                raise ValueError(f"xi={self.xi} must be smaller than lam={self.lam}")
        return self


@register
class FPFC(Algorithm):
    name = "fpfc"
    description = "FPFC: clustered FL by smoothed-SCAD pairwise fusion, inexact ADMM (Yu et al. 2023)"
    Config = FPFCConfig
    finite_check_keys = ("W", "R")

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        c, lay = self.cfg, self.layout
        d = lay.dim
        if lay.has_block(c.fused_block):
            fmask = lay.mask(c.fused_block)
        else:
            fmask = torch.ones(d, dtype=torch.bool)
        self.fidx = torch.nonzero(fmask).flatten()
        self.sidx = torch.nonzero(~fmask).flatten()
        self.all_fused = self.sidx.numel() == 0
        self.df = self.fidx.numel()
        m = self.num_clients
        layout = c.pair_layout
        if layout == "auto":
            layout = "dense" if m * m * self.df <= 5e7 else "sparse"
        self.store = PAIR_STORES[layout]
        self.pair_layout = layout
        self.sizes = self.problem.data.train_sizes.to(torch.float64)
        self._round = 0
        self._version = 0
        self._cache: tuple[int, np.ndarray] | None = None
        self.sdtype = torch.float64 if c.dtype == "float64" else torch.float32

    def use_kernels(self, kernel: str) -> None:
        """As the base class; ``native`` on a dense float32 store needs the compiled pair kernel."""
        super().use_kernels(kernel)
        if kernel == "native" and self.pair_layout == "dense" and self.sdtype == torch.float32 \
                and DensePairs.compiled(self.sdtype) is None:
            why = "it is turned off (FEDSOLVE_NATIVE=0)" if not native.enabled() else "no C compiler could build it"
            raise ValueError(f"linear_kernel: 'native' is not available for FPFC's pair update ({why}); "
                             "use 'auto' or 'torch'")

    @property
    def pair_kernel(self) -> str:
        """``native`` when the server's pair update runs the compiled kernel, else ``torch``."""
        return "native" if self.pair_layout == "dense" and DensePairs.compiled(self.sdtype, self.kernel) else "torch"

    def prox_fn(self, r: Tensor) -> Tensor:
        c = self.cfg
        return prox_scale(r, c.lam, c.rho, c.a, c.xi, c.penalty)

    # ------------------------------------------------------------------ work / schedules
    def local_steps_at(self, k: int) -> int | None:
        c = self.cfg
        if c.local_schedule == "growing":
            return max(1, math.ceil((k + c.growth_offset) / c.growth_rounds))
        return c.local_steps

    def work(self, round_: int = 0) -> dict[str, Work]:
        c = self.cfg
        return {"train": Work(epochs=c.local_epochs, steps=self.local_steps_at(round_), batch_size=c.batch_size)}

    def supports_linear_gd(self) -> bool:
        return self.all_fused and self.cfg.batch_size is None

    def linear_gd(self, rows, msgs, ids, round_, full):
        """Eq. 5 for the ``linear`` executor: GD on f_i + (rho/2)||w - zeta_i||^2 from w_i."""
        return GDStep(start=rows["w"], lr=self.lr_at(round_), anchor=msgs["zeta"], rho=self.cfg.rho,
                      finish=lambda w: ({"w": w}, {"w": w}))

    def lr_at(self, k: int) -> float:
        c = self.cfg
        return c.lr * c.lr_decay ** (k // c.lr_decay_every)

    # ------------------------------------------------------------------ five functions
    def init(self, x0, rngs):
        m = self.num_clients
        if self.cfg.init_std is not None:
            g = rngs.torch("fpfc_init")
            x0 = torch.randn(x0.shape, generator=g, dtype=x0.dtype) * self.cfg.init_std
        W = repeat_rows(x0, m)
        server = {"W": W.clone(), "R": torch.zeros(m, self.df, dtype=self.sdtype)}
        server.update(self.store.init(m, self.df, self.sdtype))
        return server, ClientStates(m, {"w": W})

    def fused(self, W: Tensor, dtype=None) -> Tensor:
        """The fused block of the rows of ``W`` (``W`` itself when the whole model is fused)."""
        Wf = W if self.all_fused else W[:, self.fidx]
        return Wf if dtype is None else Wf.to(dtype)

    def zeta(self, server, ids: Tensor) -> Tensor:
        """zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij/rho) for the devices ``ids`` (fused block)."""
        Wf = self.fused(server["W"], server["R"].dtype)
        m = Wf.shape[0]
        return (Wf.mean(0).unsqueeze(0) + server["R"][ids] / m).to(server["W"].dtype)

    def broadcast(self, server, ids, round_):
        self._round = round_
        msg = {"zeta": self.zeta(server, ids)}
        if not self.all_fused:
            msg["shared"] = server["W"][ids][:, self.sidx]
        return msg

    def local_update(self, state, msg, ctx):
        rho, zeta = self.cfg.rho, msg["zeta"]
        w0 = state["w"]
        if self.all_fused:
            extra = lambda p: rho * (p - zeta)  # noqa: E731
        else:
            w0 = w0.index_copy(0, self.sidx, msg["shared"])
            fidx = self.fidx
            extra = lambda p: torch.zeros_like(p).index_copy(0, fidx, rho * (p.index_select(0, fidx) - zeta))  # noqa
        w = self.local_sgd(ctx, w0, extra=extra, lr=self.lr_at(ctx.round))
        return {"w": w}, {"w": w}

    def server_update(self, server, ids: Tensor, W_new: Tensor) -> dict[str, Tensor]:
        """Write the uploads ``W_new`` of ``ids`` and update every pair touching them (in place)."""
        W = server["W"]
        W.index_copy_(0, ids, W_new.to(W.dtype))
        act = torch.arange(self.num_clients) if self.cfg.update_pairs == "all" else ids
        self.store.update(server, self.fused(W, server["R"].dtype), act, self.prox_fn, kernel=self.kernel)
        self._version += 1
        return server

    def aggregate(self, server, ids, uploads, round_):
        W_new = uploads["w"]
        if not self.all_fused:
            W_new = W_new.clone()
            sh = W_new[:, self.sidx]
            if self.cfg.shared_weighting == "samples":
                avg = self.weighted_mean(sh, ids)
            else:
                avg = sh.mean(0)
            W_new[:, self.sidx] = avg.unsqueeze(0)
        return self.server_update(server, ids, W_new)

    # ------------------------------------------------------------------ clusters / evaluation
    def theta_norms(self, server) -> Tensor:
        return self.store.norms(server, self.num_clients)

    def theta_v(self, server) -> tuple[Tensor, Tensor]:
        """Dense ``[m, m, d_f]`` theta and v (materialized; for tests and diagnostics)."""
        return self.store.theta_v(server, self.num_clients, self.cfg.rho)

    def cluster_labels(self, server, nu: float | None = None) -> np.ndarray:
        if nu is None and self._cache is not None and self._cache[0] == self._version:
            return self._cache[1]
        lab = clusters_from_norms(self.theta_norms(server), self.cfg.nu if nu is None else nu)
        if nu is None:
            self._cache = (self._version, lab)
        return lab

    def cluster_models(self, server, labels: np.ndarray | None = None) -> Tensor:
        """[m, d]: every device's model with its fused block replaced by its cluster's average."""
        labels = self.cluster_labels(server) if labels is None else labels
        W = server["W"].clone()
        W[:, self.fidx] = cluster_average(W[:, self.fidx], labels, self.sizes)
        return W

    def eval_broadcast(self, server, ids):
        if self.cfg.eval_with == "local":
            return {"w": server["W"][ids]}
        return {"w": self.cluster_models(server)[ids]}

    def eval_model(self, state, msg):
        return msg["w"]

    def diagnostics(self, server, clients):
        lab = self.cluster_labels(server)
        out = {"num_clusters": float(lab.max() + 1)}
        truth = self.problem.data.clusters
        if truth is not None:
            out["ari"] = adjusted_rand(lab, truth.numpy())
        return out

    def finalize(self, server, clients):
        lab = self.cluster_labels(server)
        out: dict[str, Any] = {"clusters": lab.tolist(), "num_clusters": int(lab.max() + 1),
                               "cluster_sizes": np.bincount(lab).tolist(), "pair_layout": self.pair_layout}
        truth = self.problem.data.clusters
        if truth is not None:
            out["ari"] = adjusted_rand(lab, truth.numpy())
        return out

    def newcomer_models(self, server, new_problem, *, rounds=100, seed=0):
        """Sec. 6.4.2: asyncFPFC with only the newcomer active against the frozen devices
        (:func:`fpfc_newcomers`); scored with its own w_i."""
        return fpfc_newcomers(self, server, new_problem, rounds=rounds, seed=seed)["params"]

    # ------------------------------------------------------------------ theory helpers
    def augmented_lagrangian(self, server, full_loss: Callable[[int, Tensor], float]) -> float:
        """L~_rho(w, theta, v) (eq. 8) with f_i given by ``full_loss(i, w_i)`` (fused block = whole model)."""
        c = self.cfg
        m = self.num_clients
        W = server["W"].double()
        th, v = (t.double() for t in self.theta_v(server))
        Wf = W[:, self.fidx]
        diff = Wf.unsqueeze(1) - Wf.unsqueeze(0) - th
        pen = penalty_value(th.norm(dim=-1), c.lam, c.a, c.xi, c.penalty)
        off = ~torch.eye(m, dtype=torch.bool)
        pair = (pen + (v * diff).sum(-1) + c.rho / 2 * diff.pow(2).sum(-1))[off].sum() / (2 * m)
        return float(sum(full_loss(i, W[i]) for i in range(m)) + pair)


def paper_cost(algo: FPFC, ledger) -> float:
    """The paper's Cost (spec 2.7): m d (initial broadcast) + scalars sent in the rounds."""
    return algo.num_clients * algo.layout.dim + ledger.uplink_floats + ledger.downlink_floats


class FPFCL1Config(FPFCConfig):
    penalty: Literal["scad", "l1", "l2sq"] = Field("l1", description="group lasso fusion (FPFC-l1)")
    lam: float = Field(0.2, ge=0, description="README: lamdaL1 = 0.2")
    nu: float = Field(0.1, gt=0, description="cluster threshold (README thresholdL1 = 4 for synthetic)")


@register
class FPFCL1(FPFC):
    name = "fpfc_l1"
    description = "FPFC-l1: FPFC with the group-lasso fusion penalty (group soft-thresholding prox)"
    Config = FPFCL1Config


# ====================================================================== drivers
def _val_accuracy(sim, val_problem) -> float:
    from fedsolve.simulation.metrics import evaluate

    s, _ = evaluate(val_problem, sim.eval_params(), sim.vectorized_eval, ())
    return s.get("test_accuracy", -s.get("test_rmse", float("nan")))


def warmup_lambda_path(problem, lams: Sequence[float], algo_cfg: dict | FPFCConfig, sim_cfg, seed: int = 0,
                       val_problem=None, tol: float = 1e-4, check_every: int = 1, min_rounds: int = 1,
                       max_rounds_per_lambda: int | None = None, total_rounds: int | None = None,
                       algorithm: str = "fpfc", stop_at_selection: bool = False) -> dict[str, Any]:
    """Warmup lambda path (Sec. 4.3, spec 2.11).

    Train with lams[0] from the initial state; every ``check_every`` rounds compute the validation
    accuracy (``val_problem``: same clients, the validation split as its *test* split; negative RMSE
    for regression). Switch to the next lambda, warm-starting from the current (w, theta, v), when the
    change since the last check is below ``tol`` (after ``min_rounds``) or after
    ``max_rounds_per_lambda``. The validation accuracy at the switch is that lambda's score. As soon
    as a lambda scores below the previous one, go back to the best lambda's saved state and train it
    until ``total_rounds`` (default ``sim_cfg.rounds``) is used up. ``stop_at_selection`` returns as
    soon as the lambda is chosen (state = the best lambda's saved state; ``rounds_used`` says how many
    rounds were spent), e.g. to continue training on train + validation data. Returns the best lambda,
    the switch rounds, per-lambda scores, the final Simulation and its validation history.
    """
    from fedsolve.algorithms.base import get_algorithm
    from fedsolve.simulation.loop import Simulation

    val_problem = problem if val_problem is None else val_problem
    cfg = dict(algo_cfg) if not isinstance(algo_cfg, FPFCConfig) else algo_cfg.model_dump()
    cfg["lam"] = lams[0]
    algo = get_algorithm(algorithm)(cfg, problem)
    sim = Simulation(problem, algo, sim_cfg, seed=seed)
    total = sim_cfg.rounds if total_rounds is None else total_rounds
    torch.set_grad_enabled(True)
    import time

    sim._t0 = time.perf_counter()
    t = 0
    s = 0
    scores: list[tuple[float, float]] = []
    switches: list[tuple[int, float]] = [(0, lams[0])]
    history: list[dict[str, float]] = []
    best = None  # (score, lam, server, clients, version)
    prev_acc = _val_accuracy(sim, val_problem)
    start = 0
    stopped = False
    while t < total:
        sim.run_round(t)
        t += 1
        if (t - start) % check_every and t < total:
            continue
        acc = _val_accuracy(sim, val_problem)
        history.append({"round": t, "lam": algo.cfg.lam, "val_accuracy": acc})
        converged = (t - start) >= min_rounds and abs(acc - prev_acc) < tol
        budget = max_rounds_per_lambda is not None and (t - start) >= max_rounds_per_lambda
        prev_acc = acc
        if stopped or not (converged or budget):
            continue
        lam = algo.cfg.lam
        scores.append((lam, acc))
        if best is not None and acc < best[0]:
            # worse than the previous lambda: return to the best model and train it to the end
            _, lam_b, srv, cl, ver = best
            sim.server, sim.clients = copy.deepcopy(srv), cl.clone()
            algo.cfg.lam = lam_b
            algo._version += 1
            switches.append((t, lam_b))
            stopped = True
            if stop_at_selection:
                break
            continue
        best = (acc, lam, copy.deepcopy(sim.server), sim.clients.clone(), algo._version)
        if s + 1 < len(lams):
            s += 1
            algo.cfg.lam = lams[s]
            algo._version += 1
            switches.append((t, lams[s]))
            start = t
        else:
            stopped = True
            if stop_at_selection:
                break
    return {"best_lambda": algo.cfg.lam, "switches": switches, "scores": scores, "history": history,
            "rounds_used": t,
            "simulation": sim, "algorithm": algo, "wall_time_s": time.perf_counter() - sim._t0}


def fpfc_newcomers(algo: FPFC, server: dict[str, Tensor], new_problem, rounds: int = 50, seed: int = 0,
                   init_epochs: float = 10.0, executor: str = "sequential",
                   denominator: Literal["m_old+1", "m_old"] = "m_old+1", eval_with: Literal["local", "cluster"]
                   = "local") -> dict[str, Any]:
    """Newcomers after training (Sec. 6.4.2, spec 3.2): asyncFPFC with only the newcomer active.

    Each newcomer i (a client of ``new_problem``) first trains locally (``init_epochs`` of plain local
    steps starting from the mean of the old models; choice documented, the paper is silent), uploads
    w_i; the server computes
    delta/theta/v between i and every frozen old device j (v initialized to 0) and sends
    zeta_i = (1/(m_old+1)) sum_{j in old + {i}} (w_j + theta_ij - v_ij/rho); the newcomer runs eq. (5);
    repeated ``rounds`` times. Newcomers do not interact with each other (they run in parallel,
    vectorized over newcomers). ``eval_with='cluster'`` scores a newcomer with the n_i-weighted
    average of the old cluster it is fused with (||theta_ij|| <= nu for some old j), else its own w_i.
    Returns the newcomers' models, per-newcomer test accuracy and the mean/std.
    """
    from fedsolve.core.executor import build_plans, make_executor
    from fedsolve.core.rng import RngStreams
    from fedsolve.simulation.metrics import evaluate

    c = algo.cfg
    new_algo = type(algo)(c.model_dump(), new_problem)
    rngs = RngStreams(seed)
    ex = make_executor(executor, new_problem)
    data = new_problem.data
    mn = data.num_clients
    ids = torch.arange(mn)
    W_old = server["W"]
    m_old = W_old.shape[0]
    fidx = algo.fidx
    start = W_old.mean(0)
    W = repeat_rows(start, mn)
    # 1) local training (plain local steps on f_i)
    W = new_algo.train_on(new_problem, W, seed=seed, work=Work(epochs=init_epochs, batch_size=c.batch_size),
                          executor=executor)
    Wold_f = W_old[:, fidx].to(algo.sdtype)
    delta = torch.zeros(mn, m_old, fidx.numel(), dtype=algo.sdtype)
    scale = torch.zeros(mn, m_old, dtype=algo.sdtype)
    denom = m_old + 1 if denominator == "m_old+1" else m_old
    for r in range(rounds):
        Wf = W[:, fidx].to(algo.sdtype)
        delta, scale = pair_step(Wf.unsqueeze(1), Wold_f.unsqueeze(0), delta, scale, algo.prox_fn)
        rowsum = ((2 * scale - 1).unsqueeze(-1) * delta).sum(1)
        zeta = ((Wold_f.sum(0).unsqueeze(0) + Wf + rowsum) / denom).to(W.dtype)
        new_algo._round = r
        plans = build_plans(new_algo.work(r + 1), data.train_offsets, ids, rngs, r + 1)
        msg = {"zeta": zeta}
        if not algo.all_fused:
            msg["shared"] = W[:, algo.sidx]
        rows, _, _ = ex.run(new_algo, {"w": W}, msg, ids, plans, data, r + 1)
        W = rows["w"]
    # final pair update so theta reflects the last w
    Wf = W[:, fidx].to(algo.sdtype)
    delta, scale = pair_step(Wf.unsqueeze(1), Wold_f.unsqueeze(0), delta, scale, algo.prox_fn)
    tnorm = scale.abs() * delta.norm(dim=-1)
    params = W.clone()
    joined = []
    if eval_with == "cluster":
        lab_old = algo.cluster_labels(server)
        models = algo.cluster_models(server, lab_old)
        for i in range(mn):
            near = torch.nonzero(tnorm[i] <= c.nu).flatten()
            if near.numel():
                j = int(near[torch.argmin(tnorm[i, near])])
                params[i, fidx] = models[j, fidx]
                joined.append(int(lab_old[j]))
            else:
                joined.append(-1)
    summary, per = evaluate(new_problem, params, new_problem.vmappable, ())
    return {"params": params, "summary": summary, "per_client": per, "theta_norms": tnorm, "joined": joined}
