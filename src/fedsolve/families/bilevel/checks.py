"""What a bilevel problem must satisfy before any round, checked on every client when the problem is built (so that
a run that still produces NaN or inf has a step size too large, as the engine's message says):

* the samples are finite (:func:`check_finite_data`);
* each client has rows in both the lower and the upper split;
* each client's lower level g_i is strongly convex in y at the start (SimFBO Assumption 1; FedNest's Neumann series
  and AggITD's unrolled product need it too): the smallest eigenvalue of its y-Hessian on the client's whole lower
  split is positive (:func:`check_strongly_convex`): the Hessian's eigenvalues for ``d_y <= HESSIAN_MAX_DIM``, else
  a Lanczos estimate from ``LANCZOS_STEPS`` Hessian-vector products (its smallest Ritz value is never below the
  smallest eigenvalue, so a refusal is always right; a slightly indefinite g_i may pass), up to
  ``LANCZOS_MAX_DIM``; a model's linear head needs neither (:func:`outputs_affine_in_y`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsolve.data.federated import FederatedData

#: the largest d_y whose lower-level Hessian is formed to check strong convexity (d_y double-backward passes)
HESSIAN_MAX_DIM = 512
#: Hessian-vector products of the Lanczos estimate for larger d_y, and the largest d_y it is run for
LANCZOS_STEPS, LANCZOS_MAX_DIM = 16, 20_000
#: strongly convex means lambda_min > this x max(1, lambda_max) (float64)
CONVEX_RTOL = 1e-9


def _first_bad_client(bad_rows: Tensor, offsets: Tensor) -> int | None:
    """The client owning the first row flagged in ``bad_rows`` (None: no row flagged)."""
    rows = torch.nonzero(bad_rows).flatten()
    if rows.numel() == 0:
        return None
    return int(torch.searchsorted(offsets, rows[:1], right=True)[0]) - 1


def check_finite_data(data: FederatedData) -> None:
    """Every client's training and test samples (features, and regression targets) are finite."""
    parts = [("training features", data.train_x, data.train_offsets), ("test features", data.test_x, data.test_offsets)]
    if data.train_y.is_floating_point():
        parts += [
            ("training targets", data.train_y, data.train_offsets),
            ("test targets", data.test_y, data.test_offsets),
        ]
    for what, t, off in parts:
        if not t.is_floating_point():
            continue
        bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(1)
        i = _first_bad_client(bad, off)
        if i is not None:
            raise ValueError(
                f"data: client {i} has non-finite {what} (NaN or inf, {int(bad.sum())} rows in all); "
                f"allowed: finite values"
            )


def full_split(data: FederatedData, i: int, group: str) -> tuple[Tensor, Tensor, Tensor]:
    """Client ``i``'s whole ``group`` split as one minibatch ``(inputs, targets, weights)``, weights 1/rows; an error
    naming the client when the split is empty."""
    x, y = data.client_train(i)
    code = data.group_names.index(group)
    g = data.client_train_groups(i)
    assert g is not None, "bilevel data carry row groups (the group was found in group_names)"
    rows = g == code
    n = int(rows.sum())
    if n == 0:
        raise ValueError(
            f"data: client {i} has no rows in the {group!r} split; allowed: at least one row in each of "
            f"{list(data.group_names)} on every client"
        )
    return x[rows], y[rows], torch.full((n,), 1.0 / n, dtype=x.dtype if x.is_floating_point() else torch.float64)


def check_splits(data: FederatedData, groups: tuple[str, ...]) -> None:
    """Every client has rows in each of ``groups``."""
    for i in range(data.num_clients):
        for g in groups:
            full_split(data, i, g)


def lower_hessian_eigenvalues(oracles, client: int, x: Tensor, y: Tensor) -> Tensor:
    """The eigenvalues of client ``client``'s lower-level y-Hessian at (x, y) on its whole lower split (float64)."""
    spec = oracles.spec
    inp, tgt, w = full_split(oracles.problem.data, client, spec.lower_group)
    O = oracles.on(torch.tensor(client))
    f64 = lambda t: t.double() if t.is_floating_point() else t
    try:  # in float64 where the model allows it (a float32 model's own buffers may not)
        H = torch.func.hessian(lambda yy: O.g(x.double(), yy, (f64(inp), f64(tgt), w.double())))(y.double())
    except RuntimeError:
        H = torch.func.hessian(lambda yy: O.g(x, yy, (inp, tgt, w.to(x.dtype))))(y).double()
    return torch.linalg.eigvalsh(0.5 * (H + H.T))


def lanczos_extremes(hvp, dim: int, steps: int) -> tuple[float, float]:
    """The smallest and largest Ritz values of the symmetric operator ``hvp`` (float64 vectors in and out) after
    ``steps`` Lanczos steps (full reorthogonalisation, a fixed start): upper and lower bounds of its extreme
    eigenvalues."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(dim, generator=g, dtype=torch.float64)
    Q = [q / q.norm()]
    alpha, beta = [], []
    for _ in range(min(steps, dim)):
        w = hvp(Q[-1]).detach().double().cpu()
        alpha.append(float(w @ Q[-1]))
        B = torch.stack(Q)
        w = w - B.T @ (B @ w)
        w = w - B.T @ (B @ w)  # twice: orthogonal to float64 rounding
        b = float(w.norm())
        if b < 1e-12 * max(1.0, abs(alpha[-1])):
            break
        beta.append(b)
        Q.append(w / b)
    T = torch.diag(torch.tensor(alpha, dtype=torch.float64))
    off = torch.tensor(beta[: len(alpha) - 1], dtype=torch.float64)
    T = T + torch.diag(off, 1) + torch.diag(off, -1)
    ev = torch.linalg.eigvalsh(T)
    return float(ev[0]), float(ev[-1])


def check_strongly_convex(oracles, x: Tensor, y: Tensor, where: str = "problem") -> None:
    """Every client's g_i is strongly convex in y at (x, y): otherwise an error naming the client, the smallest
    eigenvalue (or Ritz value, for d_y > :data:`HESSIAN_MAX_DIM`) and ``where`` (the field or function that states
    g_i)."""
    data, lower = oracles.problem.data, oracles.spec.lower_group
    if y.numel() > LANCZOS_MAX_DIM:
        return
    for i in range(oracles.problem.num_clients):
        if y.numel() <= HESSIAN_MAX_DIM:
            ev = lower_hessian_eigenvalues(oracles, i, x, y)
            lo, hi = float(ev.min()), float(ev.abs().max())
        else:
            O, b = oracles.on(torch.tensor(i)), full_split(data, i, lower)
            b = (b[0], b[1], b[2].to(y.dtype))
            lo, hi = lanczos_extremes(lambda v, O=O, b=b: O.hvp_yy_g(x, y, v.to(y), b), y.numel(), LANCZOS_STEPS)
            hi = max(abs(lo), abs(hi))
        if not lo > CONVEX_RTOL * max(1.0, hi):
            raise ValueError(
                f"{where}: client {i}'s lower level g_{i} is not strongly convex in y at the start (the "
                f"smallest eigenvalue of its y-Hessian is {lo:.3g}); the bilevel solvers need every g_i "
                f"strongly convex in y (SimFBO Assumption 1): add a ridge (lam/2)||y||^2 to g_i or "
                f"state a g_i with a positive definite y-Hessian"
            )


def outputs_affine_in_y(oracles, x: Tensor, y: Tensor) -> bool:
    """The model's outputs on every client's lower split are affine in y at (x, y): the second difference
    ``out(y + v) + out(y - v) - 2 out(y)`` vanishes (to rounding) along a fixed random direction ``v``. With a loss
    convex in the outputs (cross entropy, squared error) and a ridge (lam/2)||y||^2, g_i is then lam-strongly convex
    in y, which needs no Hessian (three forward passes per client)."""
    g = torch.Generator().manual_seed(1)
    vs = [torch.randn(y.numel(), generator=g, dtype=torch.float64).to(y)]
    data, lower = oracles.problem.data, oracles.spec.lower_group
    with torch.no_grad():
        for i in range(oracles.problem.num_clients):
            inp = full_split(data, i, lower)[0]
            base = oracles.outputs(x, y, inp)
            scale = float(base.abs().max()) + 1.0
            for v in vs:
                v = v * (1.0 + float(y.abs().max())) / float(v.abs().max())
                d2 = oracles.outputs(x, y + v, inp) + oracles.outputs(x, y - v, inp) - 2 * base
                tol = (1e-9 if y.dtype == torch.float64 else 1e-4) * scale * (1.0 + float(v.abs().max()))
                if float(d2.abs().max()) > tol:
                    return False
    return True
