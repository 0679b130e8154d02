"""Newton's method to a tolerance, for ONE party or for the stacked parties of a vectorized round.

:func:`newton` minimises a smooth function of a flat vector (strongly convex, or nonconvex with the modified step
of :func:`positive_definite`) until ``||grad||_inf <= tol``: the stopping rule of an inexact subproblem solve
(e.g. Prox-AL FL's Eq. 19). It runs

* for one party on its own, stopping as soon as that party is done (``alone=True``);
* for the stacked parties of ``u0 [K, d]`` (``stacked=True``): the function, its gradient and Hessian vmapped over
  the parties, the loops in Python until every party has met its own tolerance (masked), which gives the numbers
  of solving them one by one;
* under ``vmap`` (neither): fixed caps, masked.

Line search is Armijo backtracking, so a gradient that is only locally Lipschitz (a squared-positive-part penalty
far from the minimiser) stays safe. :class:`~fedsolve.core.statements.Minimize` states such a solve as a client
update; ``LocalContext.run`` and the executors compile it with this function.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor
from torch.func import grad, jacrev, vmap


def inf_norm(g: Tensor) -> Tensor:
    """``||g||_inf`` of each party's row (the last axis)."""
    return g.abs().amax(-1)


def newton(
    fun: Callable[..., Tensor],
    u0: Tensor,
    tol: Tensor | float,
    max_iter: int = 20,
    ls_steps: int | None = None,
    c1: float = 1e-4,
    alone: bool = False,
    args: tuple = (),
    stacked: bool = False,
    modified: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Minimise the strongly convex ``fun(u, *args)`` from ``u0`` until ``||grad||_inf <= tol``; with ``modified``
    a nonconvex one to a local minimiser (:func:`positive_definite`; ``False``: the Hessian as it is, a scaled
    gradient step where its step is no descent direction).

    Returns ``(u, ||grad fun(u)||_inf, newton steps taken)``. One party (``u0`` of shape ``[d]``), or with
    ``stacked=True`` the parties of ``u0 [K, d]`` and ``args`` (leading dimension K) at once: ``fun``, its
    gradient and Hessian are vmapped over the parties, every party stops at its own tolerance (masked) and the
    loops stop as soon as every party is done -- the numbers of solving them one by one. ``alone=True`` (one
    party, no vmap) likewise stops as soon as the party is done; otherwise (one party under vmap) the caps run,
    masked. Line search: at most ``ls_steps`` halvings, by default 12 under vmap and 60 otherwise (far from the
    minimiser of a locally Lipschitz problem a Newton step can need 2^-13, seen with rho = 0.01 and beta = 300).
    """
    loops = alone or stacked  # Python may branch on the masks: stop once every party is done
    if ls_steps is None:
        ls_steps = 60 if loops else 12
    tol = torch.as_tensor(tol, dtype=u0.dtype)
    if stacked:
        f = lambda u: vmap(fun)(u, *args)
        g_of = lambda u: vmap(grad(fun))(u, *args)
        h_of = lambda u: vmap(jacrev(grad(fun)))(u, *args)
    else:
        f = lambda u: fun(u, *args)
        g_of = grad(f)
        h_of = jacrev(g_of)  # reverse-over-reverse: ~10x cheaper than jacfwd(jacrev) at small d
    col = lambda m: m[..., None]  # a per-party value against a [.., d] row
    u = u0
    g = g_of(u)
    done = inf_norm(g) <= tol
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
        tiny = inf_norm(u_new - u) <= 1e-10 * (1 + inf_norm(u))
        u = u_new
        g_prev = inf_norm(g)
        g = g_of(u)
        # a step that could not be accepted, or a negligible one that did not reduce ||grad||_inf, is the
        # rounding floor (a tolerance eps_{t+1} = q^t below it cannot be met): the party stops too
        done = done | (inf_norm(g) <= tol) | ~accepted | (tiny & (inf_norm(g) >= g_prev))
    return u, inf_norm(g), steps


def over_parties(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``fn(u, part)`` of one party as a function of a shared ``u`` and the stacked parties ``part`` (every tensor
    of it with a leading party dimension): their values stacked ``[n, ...]``, in one call."""
    return vmap(fn, in_dims=(None, 0))


def positive_definite(H: Tensor, check: bool = True) -> Tensor:
    """Modified Newton (Nocedal & Wright, Sec. 3.4): each party's Hessian as it is where it is positive definite
    (its Cholesky factorisation succeeds), else ``H + tau I`` with ``tau = 2 |lambda_min(H)|`` plus a rounding
    margin, whose spectrum is at least ``|lambda_min|``. A convex subproblem is untouched; a nonconvex one (a
    constraint that is a difference of convex losses) then gets a descent direction at every step and its Newton
    iterates head for a local minimiser, never a saddle. ``check``: skip the eigenvalues when every party's
    factorisation succeeds (Python branching; False under vmap)."""
    fails = torch.linalg.cholesky_ex(H).info > 0
    if check and not bool(fails.any()):
        return H
    lmin = torch.linalg.eigvalsh(H)[..., 0]
    margin = 1e-8 * H.diagonal(0, -2, -1).abs().amax(-1).clamp_min(1e-12)
    tau = torch.where(fails, 2 * (-lmin).clamp_min(0) + margin, torch.zeros_like(lmin))
    return H + tau[..., None, None] * torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)


def scipy_lbfgsb(
    fun: Callable[[Tensor], Tensor], u0: Tensor, tol: float, max_iter: int = 15000
) -> tuple[Tensor, Tensor, Tensor]:
    """A reference solver: ``scipy.optimize.minimize(method="L-BFGS-B", options={"gtol": tol})`` on one party,
    then the test ``||grad||_inf <= tol`` is verified (returned as the second value). Runs on one party's plain
    tensors only (SciPy takes NumPy arrays), so never inside a vectorized call."""
    from scipy.optimize import minimize

    if torch._C._functorch.is_batchedtensor(u0) or torch._C._functorch.is_gradtrackingtensor(u0):
        raise ValueError("SciPy's L-BFGS-B solves one client at a time: use simulation.executor: sequential")
    vg = torch.func.grad_and_value(fun)

    def f(v):
        t = torch.as_tensor(v, dtype=u0.dtype)
        gv, val = vg(t)
        return float(val), gv.numpy().astype(np.float64)

    res = minimize(
        f,
        u0.detach().numpy().astype(np.float64),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": float(tol), "ftol": 0.0, "maxiter": max_iter, "maxcor": 20},
    )
    u = torch.as_tensor(res.x, dtype=u0.dtype)
    return u, inf_norm(grad(fun)(u)), torch.as_tensor(float(res.nit), dtype=u0.dtype)
