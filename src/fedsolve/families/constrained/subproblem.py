"""Solvers of the strongly convex ADMM subproblems (Eqs. 18-19), written for ONE party so they vmap.

* :func:`newton` -- damped Newton with Armijo backtracking and per-party masks, stopping once
  ``||grad||_inf <= tol`` (the paper's test, spec 3.2): for one party, for the stacked parties of a vectorized
  round (its functions vmapped, its loops in Python until every party is done), or under vmap (fixed caps).
  For the small d of the paper's problems one Hessian per step is cheap, and the squared-positive-part
  penalty is C^1 with a piecewise-constant Hessian, so line search keeps it safe where gradients are only
  locally Lipschitz (spec 7.11). An indefinite Hessian (a nonconvex constraint) is shifted to positive
  definite first (:func:`positive_definite`, the modified Newton step).
* :func:`quadratic_hessian`, :func:`quadratic_factor`, :func:`sym_pair` -- quadratic subproblems (App. E.2):
  the Hessian ``H`` is constant, so it is built and factored once and every solve is exact. A round of
  Eqs. 19 + 22 needs ``H^{-1} r`` and ``H w``: :func:`sym_pair` packs ``H^{-1}`` (upper triangle) and ``H``
  (strict lower triangle) into ONE ``[d, d]`` array, and :func:`sym_pair_mv` gets both products from one
  read of it (two symmetric matrix-vector products, BLAS ``dsymv``, each reading its own triangle). At
  large d a round is memory-bound: this reads ``d^2`` numbers per client instead of the ``2 d^2`` of two
  passes over an eigenbasis (or of ``H^{-1}`` and ``H`` stored apart).
* :func:`scipy_lbfgsb` -- the reference: SciPy's L-BFGS-B on one party at a time (``gtol = tol``, then the
  inf-norm gradient test is verified; not vmappable).
* :func:`prox_gradient` -- the server's subproblem when ``h`` is not zero and ``c_0`` exists: proximal
  gradient with backtracking, stopped by the residual of spec 3.4.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor
from torch.func import grad, jacrev, vmap

Fun = Callable[[Tensor], Tensor]


def _inf(g: Tensor) -> Tensor:
    """``||g||_inf`` of each party's row (the last axis)."""
    return g.abs().amax(-1)


def newton(fun: Callable[..., Tensor], u0: Tensor, tol: Tensor | float, max_iter: int = 20,
           ls_steps: int | None = None, c1: float = 1e-4, eager: bool = False,
           args: tuple = (), stacked: bool = False, modified: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Minimise the strongly convex ``fun(u, *args)`` from ``u0`` until ``||grad||_inf <= tol``; with ``modified``
    a nonconvex one to a local minimiser (:func:`positive_definite`; ``False``: the Hessian as it is, a scaled
    gradient step where its step is no descent direction).

    Returns ``(u, ||grad fun(u)||_inf, newton steps taken)``. One party (``u0`` of shape ``[d]``), or with
    ``stacked=True`` the parties of ``u0 [K, d]`` and ``args`` (leading dimension K) at once: ``fun``, its
    gradient and Hessian are vmapped over the parties, every party stops at its own tolerance (masked) and the
    loops stop as soon as every party is done -- the numbers of solving them one by one. ``eager=True`` (one
    party, no vmap) likewise stops as soon as the party is done; otherwise (one party under vmap) the caps run,
    masked. Line search: at most ``ls_steps`` halvings, by default 12 under vmap and 60 otherwise (far from the
    minimiser of a locally Lipschitz problem a Newton step can need 2^-13, seen with rho = 0.01 and beta = 300).
    """
    loops = eager or stacked   # Python may branch on the masks: stop once every party is done
    if ls_steps is None:
        ls_steps = 60 if loops else 12
    tol = torch.as_tensor(tol, dtype=u0.dtype)
    if stacked:
        f = lambda u: vmap(fun)(u, *args)   # noqa: E731
        g_of = lambda u: vmap(grad(fun))(u, *args)   # noqa: E731
        h_of = lambda u: vmap(jacrev(grad(fun)))(u, *args)   # noqa: E731
    else:
        f = lambda u: fun(u, *args)   # noqa: E731
        g_of = grad(f)
        h_of = jacrev(g_of)  # reverse-over-reverse: ~10x cheaper than jacfwd(jacrev) at small d
    col = lambda m: m[..., None]   # noqa: E731   a per-party value against a [.., d] row
    u = u0
    g = g_of(u)
    done = _inf(g) <= tol
    steps = torch.zeros(done.shape, dtype=u0.dtype)
    for _ in range(max_iter):
        if loops and bool(done.all()):
            break
        H = positive_definite(h_of(u), check=loops) if modified else h_of(u)
        p = -torch.linalg.solve(H, g)
        slope = (g * p).sum(-1)
        descent = slope < 0
        scale = H.diagonal(0, -2, -1).abs().amax(-1).clamp_min(1e-12)
        p = torch.where(col(descent), p, -g / col(scale))
        slope = (g * p).sum(-1)
        f0 = f(u)
        slack = 8 * torch.finfo(u.dtype).eps * (1 + f0.abs())
        alpha = torch.ones(done.shape, dtype=u.dtype)
        accepted = done
        u_new = u
        for _ in range(ls_steps):
            if loops and bool(accepted.all()):
                break
            cand = u + col(alpha) * p
            ok = (f(cand) <= f0 + c1 * alpha * slope + slack) & ~accepted
            u_new = torch.where(col(ok), cand, u_new)
            accepted = accepted | ok
            alpha = torch.where(accepted, alpha, 0.5 * alpha)
        steps = steps + (~done).to(u.dtype)
        tiny = _inf(u_new - u) <= 1e-10 * (1 + _inf(u))
        u = u_new
        g_prev = _inf(g)
        g = g_of(u)
        # a step that could not be accepted, or a negligible one that did not reduce ||grad||_inf, is the
        # rounding floor (a tolerance eps_{t+1} = q^t below it cannot be met): the party stops too
        done = done | (_inf(g) <= tol) | ~accepted | (tiny & (_inf(g) >= g_prev))
    return u, _inf(g), steps


def positive_definite(H: Tensor, check: bool = True) -> Tensor:
    """Modified Newton (Nocedal & Wright, Sec. 3.4): each party's Hessian as it is where it is positive definite
    (its Cholesky factorisation succeeds), else ``H + tau I`` with ``tau = 2 |lambda_min(H)|`` plus a rounding
    margin, whose spectrum is at least ``|lambda_min|``. A convex subproblem is untouched; a nonconvex one (a
    constraint that is a difference of convex losses, Eq. 32) then gets a descent direction at every step and its
    Newton iterates head for a local minimiser, never a saddle. ``check``: skip the eigenvalues when every party's
    factorisation succeeds (Python branching; False under vmap)."""
    fails = torch.linalg.cholesky_ex(H).info > 0
    if check and not bool(fails.any()):
        return H
    lmin = torch.linalg.eigvalsh(H)[..., 0]
    margin = 1e-8 * H.diagonal(0, -2, -1).abs().amax(-1).clamp_min(1e-12)
    tau = torch.where(fails, 2 * (-lmin).clamp_min(0) + margin, torch.zeros_like(lmin))
    return H + tau[..., None, None] * torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)


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


def sym_pair(H: Tensor) -> tuple[Tensor, Tensor]:
    """Pack a symmetric positive definite ``H`` (``[..., d, d]``) for :func:`sym_pair_mv`: ``T`` holds
    ``H^{-1}`` (Cholesky inverse) on and above the diagonal and ``H`` below it; ``fix = diag(H) -
    diag(H^{-1})``. Returns ``(T, fix)``."""
    Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H))
    T = torch.triu(Hinv) + torch.tril(H, -1)
    return T, H.diagonal(dim1=-2, dim2=-1) - Hinv.diagonal(dim1=-2, dim2=-1)


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
        if xn is not None:
            ox[b] = dsymv(1.0, Tb, xn[b], lower=1)
        if yn is not None:
            oy[b] = dsymv(1.0, Tb, yn[b], beta=1.0, y=oy[b], lower=0, overwrite_y=1)
    return (None if ox is None else torch.from_numpy(ox)), (None if oy is None else torch.from_numpy(oy))


def sym_pair_apply(T: Tensor, fix: Tensor, x: Tensor | None, y: Tensor | None) -> tuple[Tensor | None, ...]:
    """``(H^{-1} x, H y)`` from :func:`sym_pair`'s ``(T, fix)`` (``[..., d, d]``, ``[..., d]``); ``x`` or ``y``
    may be None (that product is skipped). Not vmappable: :func:`sym_pair_mv` is."""
    d = T.shape[-1]
    if T.device.type == "cpu" and T.dtype == torch.float64:
        flat = lambda v: None if v is None else v.reshape(-1, d).contiguous()  # noqa: E731
        ox, oy = _sym_pair_blas(T.reshape(-1, d, d).contiguous(), flat(fix), flat(x), flat(y))
        shape = T.shape[:-1]
        return (None if ox is None else ox.reshape(shape)), (None if oy is None else oy.reshape(shape))
    return (None if x is None else _upper_mv(T, x)), (None if y is None else _lower_mv(T, fix, y))


class _SymPairMV(torch.autograd.Function):
    """:func:`sym_pair_apply` as a function ``vmap`` can batch: under ``vmap`` it receives the stacked
    clients' rows and runs once on all of them (no per-client copies)."""

    @staticmethod
    def forward(T, fix, x, y):
        return sym_pair_apply(T, fix, x, y)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, T, fix, x, y):
        front = [a if a is None else a.movedim(dim, 0) if dim is not None else a.expand(info.batch_size, *a.shape)
                 for a, dim in zip((T, fix, x, y), in_dims)]
        out = sym_pair_apply(*front)   # no gradient flows through: the plain products
        return out, tuple(None if o is None else 0 for o in out)


def sym_pair_mv(T: Tensor, fix: Tensor, x: Tensor | None, y: Tensor | None) -> tuple[Tensor | None, ...]:
    """``(H^{-1} x, H y)`` for :func:`sym_pair`'s ``(T, fix)`` in one read of ``T`` (vmappable); ``x`` or ``y``
    may be None (that product is skipped, its triangle not read)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    if not any(isinstance(a, Tensor) and wrapped(a) for a in (T, fix, x, y)):
        return sym_pair_apply(T, fix, x, y)   # plain tensors (one party, or stacked rows): no Function dispatch
    return _SymPairMV.apply(T, fix, x, y)


def quadratic_step(fun: Fun, u: Tensor, L: Tensor, extra_grad: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The exact minimiser of ``fun(v) + <extra_grad, v>`` (quadratic ``fun``, Hessian ``L L^T``) and its
    gradient inf-norm (rounding only)."""
    g = grad(fun)(u)
    if extra_grad is not None:
        g = g + extra_grad
    v = u - torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1)
    gv = grad(fun)(v) + (extra_grad if extra_grad is not None else 0.0)
    return v, _inf(gv)


def scipy_lbfgsb(fun: Fun, u0: Tensor, tol: float, max_iter: int = 15000) -> tuple[Tensor, Tensor, Tensor]:
    """Reference solver: ``scipy.optimize.minimize(method="L-BFGS-B", options={"gtol": tol})`` on one party,
    then the paper's test ``||grad||_inf <= tol`` is verified (returned as the second value)."""
    from scipy.optimize import minimize

    if torch._C._functorch.is_batchedtensor(u0) or torch._C._functorch.is_gradtrackingtensor(u0):
        raise ValueError("solver 'scipy' runs one client at a time: use executor: sequential")
    vg = torch.func.grad_and_value(fun)

    def f(v):
        t = torch.as_tensor(v, dtype=u0.dtype)
        gv, val = vg(t)
        return float(val), gv.numpy().astype(np.float64)

    res = minimize(f, u0.detach().numpy().astype(np.float64), jac=True, method="L-BFGS-B",
                   options={"gtol": float(tol), "ftol": 0.0, "maxiter": max_iter, "maxcor": 20})
    u = torch.as_tensor(res.x, dtype=u0.dtype)
    return u, _inf(grad(fun)(u)), torch.as_tensor(float(res.nit), dtype=u0.dtype)


def prox_gradient(smooth: Fun, prox: Callable[[Tensor, float], Tensor], w0: Tensor, tol: float,
                  max_iter: int = 5000, L0: float = 1.0) -> tuple[Tensor, float]:
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
