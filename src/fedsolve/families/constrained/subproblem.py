"""The quadratic and proximal pieces of the ADMM subproblems (Eqs. 18-19), written for ONE party (any leading
dimensions broadcast). Newton's method to a tolerance, for the other subproblems, is ``fedsolve.core.newton``.

* :func:`quadratic_hessian`, :func:`quadratic_factor`, :func:`sym_pair` -- quadratic subproblems (App. E.2):
  the Hessian ``H`` is constant, so it is built and factored once and every solve is exact. A round of
  Eqs. 19 + 22 needs ``H^{-1} r`` and ``H w``: :func:`sym_pair` stores ``H^{-1}`` and ``H`` as ONE array ``T`` and
  :func:`sym_pair_apply` gets both products from it. Two layouts, chosen by d alone (so a Flower node's one row
  and the simulation's rows of all clients agree bit for bit):

  - packed (``d > DENSE_MAX_D``): ``T [d, d]`` holds ``H^{-1}`` on and above the diagonal and ``H`` below it
    (``fix = diag(H) - diag(H^{-1})``); both products from one read of it (two BLAS ``dsymv``, each on its own
    triangle). At large d a round is memory-bound: this reads ``d^2`` numbers per client instead of ``2 d^2``.
  - dense (``d <= DENSE_MAX_D``): ``T [d, 2d] = [H^{-1} | H]`` (both full, symmetric; ``fix`` zero); the products
    are two matrix-vector products a row (NumPy's ``matmul``, one BLAS ``dgemv`` per row). At small d a
    round is bound by per-call overhead, not memory: 4x faster at d = 100, 5 clients; slower from d = 200.

  :func:`sym_unpack` reads ``H`` back.
* :func:`prox_gradient` -- the server's subproblem when ``h`` is not zero and ``c_0`` exists: proximal
  gradient with backtracking, stopped by the residual of spec 3.4.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import numpy as np
import torch
from torch import Tensor
from torch.func import grad, jacrev

from fedsolve.core.newton import inf_norm

Fun = Callable[[Tensor], Tensor]


def mv(A: Tensor, x: Tensor) -> Tensor:
    """``A x`` for a matrix ``A [..., k, d]`` and a vector ``x [..., d]`` with the same leading dimensions. On CPU
    float64 (no autograd) through NumPy's ``matmul``, one BLAS ``dgemv`` per row, so that a row's bits do not depend
    on the rows beside it (torch's product over many rows and over one may round the last bit differently: a Flower
    node multiplies its own row, the simulation all clients' rows at once)."""
    arrays = _cpu64_arrays(A, x)
    if arrays is not None:
        return torch.from_numpy(np.matmul(arrays[0], arrays[1][..., None])[..., 0])
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def _cpu64_arrays(*ts: Tensor) -> list[np.ndarray] | None:
    """The tensors ``ts`` as NumPy arrays (no copy) when all are plain CPU float64 tensors outside autograd; None
    otherwise, also for the wrappers of ``torch.func``'s transforms, which have no storage to share."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float64 and not t.requires_grad for t in ts):
        return None
    try:
        return [t.numpy() for t in ts]
    except RuntimeError:  # a transform's wrapper: "Cannot access data pointer of Tensor that doesn't have storage"
        return None


def jacobian(fun: Fun, u: Tensor) -> Tensor:
    """The Jacobian ``[k, d]`` of ``fun: R^d -> R^k`` at ``u``, one gradient per output (for the few outputs of a
    constraint function; built from ``grad`` so it lives where the data does, GPU included)."""
    k = fun(u).numel()
    if k == 0:
        return u.new_zeros(0, u.shape[-1])
    return torch.stack([grad(lambda v, j=j: fun(v)[j])(u) for j in range(k)])


def quadratic_hessian(fun: Fun, u: Tensor) -> Tensor:
    """The (constant) Hessian of a quadratic ``fun``, reverse-over-reverse (0.6x the CPU time of
    forward-over-reverse at d = 500; building it column by column from first-order gradients measured the
    same), on ``u``'s device (the test suite's CPU stand-in for a GPU loses track of it through ``jacrev``)."""
    return jacrev(grad(fun))(u).to(u.device)


def quadratic_factor(fun: Fun, u: Tensor) -> Tensor:
    """Cholesky factor ``L`` of the (constant) Hessian of a strongly convex quadratic ``fun``."""
    return torch.linalg.cholesky(quadratic_hessian(fun, u))


DENSE_MAX_D = 128
"""The largest d stored in the dense layout (see the module's docstring; measured on 2 CPU cores, 5-20 clients)."""


def pair_zeros(d: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """A zero ``(T, fix)`` of :func:`sym_pair`'s layout for dimension ``d`` (a client's state before its model)."""
    return torch.zeros(d, 2 * d if d <= DENSE_MAX_D else d, dtype=dtype), torch.zeros(d, dtype=dtype)


def _is_dense(T: Tensor) -> bool:
    return T.shape[-1] != T.shape[-2]


def sym_pair(H: Tensor) -> tuple[Tensor, Tensor]:
    """Store a symmetric positive definite ``H`` (``[..., d, d]``) with its inverse (Cholesky) for
    :func:`sym_pair_apply`, in the layout d picks: ``(T, fix)``. Either layout reads ``H`` from its lower
    triangle and ``H^{-1}`` from its upper one."""
    Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H))
    if H.shape[-1] <= DENSE_MAX_D:
        lower, upper = torch.tril(H, -1), torch.triu(Hinv, 1)
        Hs = lower + lower.mT + torch.diag_embed(H.diagonal(dim1=-2, dim2=-1))
        Hinv_s = upper + upper.mT + torch.diag_embed(Hinv.diagonal(dim1=-2, dim2=-1))
        return torch.cat([Hinv_s, Hs], -1), torch.zeros_like(H[..., 0])
    T = torch.triu(Hinv) + torch.tril(H, -1)
    return T, H.diagonal(dim1=-2, dim2=-1) - Hinv.diagonal(dim1=-2, dim2=-1)


def sym_unpack(T: Tensor, fix: Tensor) -> Tensor:
    """The ``H`` that :func:`sym_pair` stored in ``(T, fix)``."""
    if _is_dense(T):
        return T[..., T.shape[-2] :].clone()
    L = torch.tril(T, -1)
    return L + L.mT + torch.diag_embed(T.diagonal(dim1=-2, dim2=-1) + fix)


def _upper_mv(T: Tensor, x: Tensor) -> Tensor:
    """``S x`` for the symmetric ``S`` whose upper triangle (with the diagonal) is ``T``'s (any device)."""
    U = torch.triu(T)
    return (U @ x.unsqueeze(-1) + torch.triu(T, 1).mT @ x.unsqueeze(-1)).squeeze(-1)


def _lower_mv(T: Tensor, fix: Tensor, y: Tensor) -> Tensor:
    """``S y`` for the symmetric ``S`` whose strict lower triangle is ``T``'s and diagonal ``diag(T) + fix``."""
    L = torch.tril(T, -1)
    diag = T.diagonal(dim1=-2, dim2=-1) + fix
    return (L @ y.unsqueeze(-1) + L.mT @ y.unsqueeze(-1)).squeeze(-1) + diag * y


def _sym_pair_blas(T: Tensor, fix: Tensor, x: Tensor | None, y: Tensor | None) -> tuple[Tensor | None, ...]:
    """:func:`sym_pair_apply` on CPU float64 rows ``[B, d, d]``: SciPy's ``dsymv`` on each triangle (row-major
    ``T`` is passed as the column-major ``T^T``, so its upper triangle is the BLAS lower one)."""
    from scipy.linalg.blas import dsymv

    Tn, n = T.numpy(), T.shape[0]
    xn = None if x is None else x.numpy()
    yn = None if y is None else y.numpy()
    ox = None if x is None else np.empty(x.shape)
    oy = None if y is None else (fix * y).numpy()
    for b in range(n):
        Tb = Tn[b].T
        if xn is not None and ox is not None:
            ox[b] = dsymv(1.0, Tb, xn[b], lower=1)
        if yn is not None and oy is not None:
            oy[b] = dsymv(1.0, Tb, yn[b], beta=1.0, y=oy[b], lower=0, overwrite_y=1)
    return (None if ox is None else torch.from_numpy(ox)), (None if oy is None else torch.from_numpy(oy))


@overload
def sym_pair_apply(T: Tensor, fix: Tensor, x: Tensor, y: None) -> tuple[Tensor, None]: ...
@overload
def sym_pair_apply(T: Tensor, fix: Tensor, x: None, y: Tensor) -> tuple[None, Tensor]: ...
@overload
def sym_pair_apply(T: Tensor, fix: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]: ...
def sym_pair_apply(T: Tensor, fix: Tensor, x: Tensor | None, y: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """``(H^{-1} x, H y)`` from :func:`sym_pair`'s ``(T, fix)`` (``[..., d, d or 2d]``, ``[..., d]``); ``x`` or
    ``y`` may be None (that product is skipped). Plain tensors only (one party, or the rows of several); each
    row's products are computed alone, so a row gives the same bits whatever rows stand beside it."""
    if _is_dense(T) or T.device.type != "cpu" or T.dtype != torch.float64:
        return _torch_apply(T, fix, x, y)  # dense: two row-by-row products (:func:`mv`)
    d = T.shape[-2]
    flat = lambda v: None if v is None else v.reshape(-1, d).contiguous()
    ox, oy = _sym_pair_blas(T.reshape(-1, d, d).contiguous(), fix.reshape(-1, d).contiguous(), flat(x), flat(y))
    shape = T.shape[:-1]
    return (None if ox is None else ox.reshape(shape)), (None if oy is None else oy.reshape(shape))


def _torch_apply(T: Tensor, fix: Tensor, x: Tensor | None, y: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """:func:`sym_pair_apply` without the packed layout's BLAS route (any device and dtype): the dense layout's
    two products by :func:`mv` (row by row through NumPy on CPU float64), the packed one's in torch ops."""
    if _is_dense(T):
        d = T.shape[-2]
        return (None if x is None else mv(T[..., :d], x)), (None if y is None else mv(T[..., d:], y))
    return (None if x is None else _upper_mv(T, x)), (None if y is None else _lower_mv(T, fix, y))


def quadratic_step(fun: Fun, u: Tensor, L: Tensor, extra_grad: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The exact minimiser of ``fun(v) + <extra_grad, v>`` (quadratic ``fun``, Hessian ``L L^T``) and its
    gradient inf-norm (rounding only)."""
    g = grad(fun)(u)
    if extra_grad is not None:
        g = g + extra_grad
    v = u - torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1)
    gv = grad(fun)(v) + (extra_grad if extra_grad is not None else 0.0)
    return v, inf_norm(gv)


def prox_gradient(
    smooth: Fun, prox: Callable[[Tensor, float], Tensor], w0: Tensor, tol: float, max_iter: int = 5000, L0: float = 1.0
) -> tuple[Tensor, float]:
    """Proximal gradient with backtracking on ``smooth + h`` (server side, Python loops allowed).

    Stops when the spec-3.4 residual ``||(y - w+)/gamma + grad g(w+) - grad g(y)||_inf`` (an upper bound
    of ``dist_inf(0, d phi(w+))``) is ``<= tol``; returns ``(w, residual)``."""
    g_of = torch.func.grad_and_value(smooth)
    y, L = w0, L0
    gy, fy = g_of(y)
    res = float("inf")
    for _ in range(max_iter):
        while True:
            w = prox(y - gy / L, 1.0 / L)
            gw, fw = g_of(w)
            dw = w - y
            if float(fw) <= float(fy + (gy * dw).sum() + 0.5 * L * dw.pow(2).sum()) + 1e-15 * (1 + abs(float(fy))):
                break
            L *= 2.0
        res = float(((y - w) * L + gw - gy).abs().max())
        y, gy, fy = w, gw, fw
        if res <= tol:
            break
        L = max(L / 2.0, 1e-12)
    return y, res
