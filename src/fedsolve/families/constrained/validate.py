"""Checks of a constrained problem before any solver runs, on EVERY client (and the server's party).

For each client: its rows and per-party tensors are finite; ``f_i`` is a scalar and each ``c_i`` has its
declared number of values, finite, with finite gradients, and both depend on ``w``; a closed-form ``hessian`` is a
finite symmetric ``[d, d]`` tensor equal to automatic differentiation's; ``quadratic=True`` really means quadratic
objectives and affine constraints (Hessian-vector products, resp. Jacobian-vector products, equal at two points).
So a run that later meets NaN or inf met it through its step sizes, not through the problem. Errors are
:class:`~fedsolve.families.constrained.problem.ConstraintError` lines naming the function and the client.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import grad, jvp

from fedsolve.data.federated import FederatedData
from fedsolve.families.constrained.prox import ConstraintError
from fedsolve.families.constrained.spec import ConstrainedSpec


def validate(spec: ConstrainedSpec, data: FederatedData, d: int) -> None:
    """Check ``spec`` on every client of ``data`` over ``w in R^d`` (module docstring)."""
    n = data.num_clients
    for name, t in spec.party_tensors.items():
        if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != n:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ConstraintError(
                f"party_tensors.{name}: expected a tensor with one entry per client ({n}, ...), got {got}"
            )
        bad = (~torch.isfinite(t.double())).reshape(n, -1).any(1).nonzero()
        if bad.numel():
            raise ConstraintError(f"party_tensors.{name}: client {int(bad[0])}'s entry holds NaN or inf")
    g = torch.Generator().manual_seed(0)
    points = torch.randn(2, d, generator=g, dtype=torch.float64) / d**0.5
    for i in range(n):
        part = spec.part(data, i)
        if not (torch.isfinite(part.x).all() and torch.isfinite(part.y).all()):
            raise ConstraintError(f"data: client {i}'s rows hold NaN or inf")
        where = f"client {i}"
        w = points[0].to(part.x.device)
        f = lambda v, part=part: spec.f(v, part)
        cf = lambda v, part=part: spec.c(v, part)
        check_fn("objective", where, f, w, None)
        c = spec.client_constraint
        if c is not None:
            check_fn(c.label, where, cf, w, c.num, c.names)
        if spec.hessian is not None:
            check_hessian(spec, part, w, where)
        if spec.quadratic:
            check_quadratic(f, cf, points.to(w.device), where)
    c = spec.server.constraint
    if c is not None:
        check_fn(c.label, "server", spec.server.c, points[0], c.num, c.names)
        if spec.quadratic:
            check_quadratic(None, spec.server.c, points, "server")


def check_fn(label: str, where: str, fn, w: Tensor, num: int | None, names=()) -> None:
    """``fn(w)``: a tensor of shape ``()`` (``num`` None) or ``(num,)``, finite, with finite gradients from ``w``."""
    wr = w.clone().requires_grad_(True)
    try:
        out = fn(wr)
    except Exception as e:
        raise ConstraintError(f"{label}: evaluating it on {where} failed: {type(e).__name__}: {e}") from e
    if not isinstance(out, Tensor):
        raise ConstraintError(f"{label}: must return a torch tensor, got {type(out).__name__} on {where}")
    want = () if num is None else (num,)
    if tuple(out.shape) != want:
        raise ConstraintError(
            f"{label}: expected shape {want} ({'scalar' if num is None else f'{num} values'}), "
            f"got {tuple(out.shape)} on {where}"
        )
    if not torch.isfinite(out).all():
        bad = [names[j] for j in range(len(names)) if not torch.isfinite(out[j])] if names else []
        raise ConstraintError(f"{label}: non-finite value at a test point on {where} {bad or ''}".rstrip())
    if not out.requires_grad:
        raise ConstraintError(f"{label}: is not a function of w (no autograd path from w to its value) on {where}")
    for j in range(out.numel()):
        (gj,) = torch.autograd.grad(out.reshape(-1)[j], wr, retain_graph=True, allow_unused=True)
        nm = names[j] if names else label
        if gj is None:
            raise ConstraintError(f"{nm}: is not a function of w (its gradient is missing) on {where}")
        if not torch.isfinite(gj).all():
            raise ConstraintError(f"{nm}: non-finite gradient at a test point on {where}")


def check_hessian(spec: ConstrainedSpec, part, w: Tensor, where: str) -> None:
    """``spec.hess(part)``: a finite, symmetric ``[d, d]`` tensor whose product with a test vector is the
    Hessian-vector product of ``f_i`` by automatic differentiation (relative 1e-8)."""
    d = w.numel()
    try:
        H = spec.hess(part)
    except Exception as e:
        raise ConstraintError(f"hessian: evaluating it on {where} failed: {type(e).__name__}: {e}") from e
    if not isinstance(H, Tensor) or tuple(H.shape) != (d, d):
        got = tuple(H.shape) if isinstance(H, Tensor) else type(H).__name__
        raise ConstraintError(f"hessian: expected a [{d}, {d}] tensor (d x d), got {got} on {where}")
    H = H.double()
    if not torch.isfinite(H).all():
        raise ConstraintError(f"hessian: non-finite entries on {where}")
    v = torch.sin(torch.arange(d, dtype=torch.float64, device=w.device) + 1.0)

    def f_i(u: Tensor) -> Tensor:
        return spec.f(u, part)

    hv = jvp(grad(f_i), (w,), (v,))[1]
    scale = max(float(hv.abs().max()), float((H @ v).abs().max()), 1e-12)
    if float((H @ v - hv).abs().max()) > 1e-8 * scale or float((H - H.mT).abs().max()) > 1e-10 * max(
        float(H.abs().max()), 1e-12
    ):
        raise ConstraintError(
            f"hessian: does not match the objective's Hessian by automatic differentiation (or is "
            f"not symmetric) on {where}: it must be grad^2 f_i of that client"
        )


def check_quadratic(f, c, points: Tensor, where: str) -> None:
    """``quadratic=True``: ``f``'s Hessian-vector product and ``c``'s Jacobian-vector product are the same at the
    two test ``points`` (relative 1e-8): a quadratic objective, affine constraints."""
    v = torch.cos(torch.arange(points.shape[1], dtype=points.dtype, device=points.device) + 1.0)
    if f is not None:
        hv = [jvp(grad(f), (p,), (v,))[1] for p in points]
        if _differ(*hv):
            raise ConstraintError(
                f"quadratic: the objective is declared quadratic (quadratic=True) but its Hessian "
                f"changes with w on {where}; declare quadratic=False (Newton solves) or fix it"
            )
    jv = [jvp(c, (p,), (v,))[1] for p in points]
    if jv[0].numel() and _differ(*jv):
        raise ConstraintError(
            f"quadratic: the constraints must be affine under quadratic=True, but their Jacobian "
            f"changes with w on {where}; declare quadratic=False or fix them"
        )


def _differ(a: Tensor, b: Tensor) -> bool:
    return float((a - b).abs().max()) > 1e-8 * max(float(a.abs().max()), float(b.abs().max()), 1e-12)
