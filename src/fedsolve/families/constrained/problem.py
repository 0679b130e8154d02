"""Constrained federated problems (paper 002, Eq. 5): the problem layer, no solver code.

    minimize_w   sum_{i=1}^n f_i(w; Z_i) + h(w)
    subject to   c_0(w; Z_0) <= 0          (server constraint, data Z_0 held only by the server)
                 c_i(w; Z_i) <= 0          (client constraints, client i's data Z_i)
                 (any scalar constraint may instead be an equality, ``kind="eq"``; spec 1.6)

A party's data ``Z`` is a set of rows ``(x, y)``: a client's are its training rows of the
:class:`~fedsolve.data.federated.FederatedData`, the server's are held by :class:`ServerParty`.
The user writes ``f`` and ``c`` as torch functions of the flat parameter ``w`` ``[d]`` and the
party's rows ``(x [N, p], y [N], mask [N])``; ``mask`` is 1 on real rows and 0 on padding (a
vectorized call pads clients to the same number of rows), so sums must be masked. The same
functions serve every client (per-client differences are data), which is what lets all clients'
subproblems be solved at once. Gradients come from autograd. ``h`` is given by its prox
(:class:`Prox`). Constraints are data of the problem, attached to a
:class:`~fedsolve.problems.FederatedProblem` as ``problem.extras["constraints"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch
from torch import Tensor, nn

from fedsolve.data.federated import FederatedData
from fedsolve.problems import FederatedProblem

__all__ = ["PartyFn", "Prox", "Constraint", "ServerParty", "ConstrainedSpec", "ConstraintError", "LinearScore",
           "constrained_problem", "get_spec", "masked_mean", "logistic_loss"]

#: ``fn(w, x, y, mask) -> Tensor``: a scalar (objective) or a ``[m]`` vector (constraints)
PartyFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
Kind = Literal["ineq", "eq"]


class ConstraintError(ValueError):
    """A constraint (or the objective) was given in a form the solvers cannot use; the message names it."""


# ------------------------------------------------------------------ helpers for user functions
def masked_mean(v: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``v`` over the rows where ``mask`` is 1 (0 when there are none)."""
    return (v * mask).sum() / mask.sum().clamp_min(1.0)


def logistic_loss(score: Tensor, y: Tensor) -> Tensor:
    """Eq. 31: ``phi(w; (x, y)) = -y s + log(1 + exp(s))`` with ``s = w^T x``, computed stably (softplus)."""
    return torch.nn.functional.softplus(score) - y * score


# ------------------------------------------------------------------ h by its prox
@dataclass(frozen=True)
class Prox:
    """The simple convex function ``h`` of Eq. 5, given by its prox (Assumption 2a).

    * ``zero``: h = 0;  * ``l1``: h = lam ||w||_1;  * ``box``: indicator of ``lo <= w <= hi``;
    * ``projection``: indicator of a closed convex set, ``project(v)`` its Euclidean projection.
    """

    kind: Literal["zero", "l1", "box", "projection"] = "zero"
    lam: float = 0.0
    lo: float = float("-inf")
    hi: float = float("inf")
    project: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("zero", "l1", "box", "projection"):
            raise ConstraintError(f"prox.kind: unknown {self.kind!r}; allowed: 'zero', 'l1', 'box', 'projection'")
        if self.kind == "l1" and not self.lam >= 0:
            raise ConstraintError(f"prox l1: lam must be >= 0, got {self.lam}")
        if self.kind == "box" and not self.lo <= self.hi:
            raise ConstraintError(f"prox box: need lo <= hi, got lo={self.lo}, hi={self.hi}")
        if self.kind == "projection" and self.project is None:
            raise ConstraintError("prox projection: give project(v) -> the projection of v onto the set")

    @property
    def is_zero(self) -> bool:
        return self.kind == "zero" or (self.kind == "l1" and self.lam == 0)

    def __call__(self, v: Tensor, gamma: float) -> Tensor:
        """``prox_{gamma h}(v) = argmin_w h(w) + ||w - v||^2 / (2 gamma)``."""
        if self.is_zero:
            return v
        if self.kind == "l1":
            return torch.sign(v) * (v.abs() - gamma * self.lam).clamp_min(0.0)
        if self.kind == "box":
            return v.clamp(self.lo, self.hi)
        return self.project(v)

    def value(self, w: Tensor) -> float:
        if self.is_zero:
            return 0.0
        if self.kind == "l1":
            return float(self.lam * w.abs().sum())
        inside = bool(torch.allclose(self(w, 1.0), w, atol=1e-9, rtol=0))
        return 0.0 if inside else float("inf")

    def stationarity(self, w: Tensor, g: Tensor) -> float:
        """``dist_inf(0, g + dh(w))`` (Definition 1): exact for zero, l1 and box; for a general projection
        the upper bound ``||w - P(w - g)||_inf`` of a unit prox step (spec 3.4)."""
        if self.is_zero:
            return float(g.abs().max()) if g.numel() else 0.0
        if self.kind == "l1":
            lam = self.lam
            r = torch.where(w != 0, (g + lam * torch.sign(w)).abs(), (g.abs() - lam).clamp_min(0.0))
            return float(r.max())
        if self.kind == "box":
            # normal cone of the box: g_j may be cancelled by any v <= 0 at lo, v >= 0 at hi
            at_lo, at_hi = w <= self.lo, w >= self.hi
            r = torch.where(at_lo, (-g).clamp_min(0.0), g.abs())
            r = torch.where(at_hi, g.clamp_min(0.0), r)
            return float(r.max())
        return float((w - self.project(w - g)).abs().max())


# ------------------------------------------------------------------ constraints and parties
@dataclass(frozen=True)
class Constraint:
    """A party's stacked scalar constraints ``c(w; Z) [m]`` with their kinds and names.

    ``fn(w, x, y, mask) -> [m]``; ``kinds[j]`` is ``"ineq"`` (``c_j <= 0``) or ``"eq"`` (``c_j = 0``).
    """

    fn: PartyFn
    num: int
    kinds: tuple[Kind, ...] = ()
    names: tuple[str, ...] = ()
    label: str = "constraint"

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConstraintError(f"{self.label}: fn must be callable (w, x, y, mask) -> [m]")
        if int(self.num) < 1:
            raise ConstraintError(f"{self.label}: num must be >= 1 (omit the constraint instead), got {self.num}")
        kinds = tuple(self.kinds) or ("ineq",) * self.num
        if len(kinds) != self.num or any(k not in ("ineq", "eq") for k in kinds):
            raise ConstraintError(f"{self.label}: kinds must list {self.num} of 'ineq'/'eq', got {self.kinds}")
        names = tuple(self.names) or tuple(f"{self.label}[{j}]" for j in range(self.num))
        if len(names) != self.num:
            raise ConstraintError(f"{self.label}: names must list {self.num} names, got {len(names)}")
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "names", names)

    @property
    def eq_mask(self) -> Tensor:
        return torch.tensor([k == "eq" for k in self.kinds])


@dataclass
class ServerParty:
    """What only the server holds: its data ``Z_0 = (x, y)``, its constraint ``c_0`` (or None) and ``h``.

    The server side of a solver is built from this object alone, so it holds no client data."""

    constraint: Constraint | None = None
    x: Tensor | None = None
    y: Tensor | None = None
    prox: Prox = field(default_factory=Prox)

    def rows(self) -> tuple[Tensor, Tensor, Tensor]:
        x = self.x if self.x is not None else torch.zeros(1, 1, dtype=torch.float64)
        y = self.y if self.y is not None else torch.zeros(x.shape[0], dtype=torch.float64)
        return x.double(), y.double(), torch.ones(x.shape[0], dtype=torch.float64)

    def c(self, w: Tensor) -> Tensor:
        if self.constraint is None:
            return w.new_zeros(0)
        return self.constraint.fn(w, *(t.to(w.device) for t in self.rows()))


@dataclass
class ConstrainedSpec:
    """The constraint structure of a problem: ``f_i``, ``c_i`` (same functions for every client), server.

    ``quadratic=True`` declares every ``f_i`` quadratic and every constraint affine with ``kind="eq"``, so
    the proximal-AL subproblems are quadratics solved exactly by one linear solve (App. E.2). A quadratic
    problem may also give ``hessian(x, y, mask) -> [d, d]``, the (constant) Hessian of ``f_i`` from the party's
    rows in closed form; without it the solver builds it by automatic differentiation (about 4 d^3-sized
    products per client instead of one). It is checked against automatic differentiation at a test point.
    """

    objective: PartyFn
    client_constraint: Constraint | None = None
    server: ServerParty = field(default_factory=ServerParty)
    quadratic: bool = False
    name: str = "constrained"
    hessian: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if not callable(self.objective):
            raise ConstraintError("objective: must be callable (w, x, y, mask) -> scalar")
        if self.hessian is not None and not self.quadratic:
            raise ConstraintError("hessian: a closed-form Hessian is only used by quadratic problems; set "
                                  "quadratic=True (f_i quadratic, constraints affine equalities) or drop it")
        if self.hessian is not None and not callable(self.hessian):
            raise ConstraintError("hessian: must be callable (x, y, mask) -> [d, d] tensor")
        if self.quadratic:
            for c in (self.client_constraint, self.server.constraint):
                if c is not None and any(k != "eq" for k in c.kinds):
                    raise ConstraintError(f"{c.label}: quadratic=true needs affine equality constraints "
                                          f"(kind 'eq'); its [.]_+ penalty is not quadratic")

    @property
    def m_client(self) -> int:
        return 0 if self.client_constraint is None else self.client_constraint.num

    @property
    def m_server(self) -> int:
        return 0 if self.server.constraint is None else self.server.constraint.num

    def c_client(self, w: Tensor, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
        if self.client_constraint is None:
            return w.new_zeros(0)
        return self.client_constraint.fn(w, x, y, mask)

    # -------------------------------------------------------------- validation
    def validate(self, data: FederatedData, d: int) -> None:
        """Check shapes, finiteness and dependence on ``w`` at a random point; errors name the constraint."""
        g = torch.Generator().manual_seed(0)
        w = torch.randn(d, generator=g, dtype=torch.float64) / d ** 0.5
        x, y = data.client_train(0)
        rows = (x.double(), y.double(), torch.ones(x.shape[0], dtype=torch.float64))
        _check_fn("objective", lambda v: self.objective(v, *rows), w, None, need_w=True)
        if self.client_constraint is not None:
            c = self.client_constraint
            _check_fn(c.label, lambda v: c.fn(v, *rows), w, c.num, need_w=True, names=c.names)
        if self.server.constraint is not None:
            c = self.server.constraint
            _check_fn(c.label, self.server.c, w, c.num, need_w=True, names=c.names)
        if self.hessian is not None:
            _check_hessian(self.hessian, self.objective, rows, w)


def _check_hessian(hessian, objective: PartyFn, rows: tuple[Tensor, Tensor, Tensor], w: Tensor) -> None:
    """``hessian(*rows)``: a finite, symmetric ``[d, d]`` tensor whose product with a test vector equals the
    Hessian-vector product of ``objective`` by automatic differentiation (relative 1e-8)."""
    d = w.numel()
    try:
        H = hessian(*rows)
    except Exception as e:  # noqa: BLE001 - re-raised with the field's name
        raise ConstraintError(f"hessian: evaluating it on client 0's rows failed: {type(e).__name__}: {e}") from e
    if not isinstance(H, Tensor) or tuple(H.shape) != (d, d):
        got = tuple(H.shape) if isinstance(H, Tensor) else type(H).__name__
        raise ConstraintError(f"hessian: expected a [{d}, {d}] tensor (d x d), got {got}")
    H = H.double()
    if not torch.isfinite(H).all():
        raise ConstraintError("hessian: non-finite entries on client 0's rows")
    v = torch.sin(torch.arange(d, dtype=torch.float64) + 1.0)
    _, hv = torch.func.jvp(torch.func.grad(lambda u: objective(u, *rows)), (w,), (v,))
    scale = max(float(hv.abs().max()), float((H @ v).abs().max()), 1e-12)
    if float((H @ v - hv).abs().max()) > 1e-8 * scale or float((H - H.mT).abs().max()) > 1e-10 * max(
            float(H.abs().max()), 1e-12):
        raise ConstraintError("hessian: does not match the objective's Hessian by automatic differentiation "
                              "(or is not symmetric) on client 0's rows: it must be grad^2 f_i for the party's rows")


def _check_fn(label: str, fn, w: Tensor, num: int | None, need_w: bool, names=()) -> None:
    wr = w.clone().requires_grad_(True)
    try:
        out = fn(wr)
    except Exception as e:  # noqa: BLE001 - re-raised with the constraint's name
        raise ConstraintError(f"{label}: evaluating it at a test point failed: {type(e).__name__}: {e}") from e
    if not isinstance(out, Tensor):
        raise ConstraintError(f"{label}: must return a torch tensor, got {type(out).__name__}")
    want = () if num is None else (num,)
    if tuple(out.shape) != want:
        raise ConstraintError(f"{label}: expected shape {want} ({'scalar' if num is None else f'{num} values'}), "
                              f"got {tuple(out.shape)}")
    if not torch.isfinite(out).all():
        bad = [names[j] for j in range(len(names)) if not torch.isfinite(out[j])] if names else []
        raise ConstraintError(f"{label}: non-finite value at a test point {bad or ''}".rstrip())
    if need_w:
        if not out.requires_grad:
            raise ConstraintError(f"{label}: is not a function of w (no autograd path from w to its value)")
        for j in range(out.numel()):
            (gj,) = torch.autograd.grad(out.reshape(-1)[j], wr, retain_graph=True, allow_unused=True)
            if gj is None:
                nm = names[j] if names else label
                raise ConstraintError(f"{nm}: is not a function of w (its gradient is missing)")
            if not torch.isfinite(gj).all():
                nm = names[j] if names else label
                raise ConstraintError(f"{nm}: non-finite gradient at a test point")


# ------------------------------------------------------------------ the model: w itself
class LinearScore(nn.Module):
    """The flat parameter ``w [d]`` as a model: ``score = x[:, :d] @ w``.

    ``classes=2`` outputs logits ``[0, score]`` (so the engine's test loss is the logistic loss and
    accuracy/AUC are reported); ``classes=None`` outputs ``[N, 1]`` (regression-style rows, e.g. QP data).
    """

    def __init__(self, d: int, classes: int | None = 2, dtype: torch.dtype = torch.float64):
        super().__init__()
        self.d, self.classes = int(d), classes
        self.w = nn.Parameter(torch.zeros(self.d, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        s = x[..., : self.d].to(self.w.dtype) @ self.w
        if self.classes == 2:
            return torch.stack([torch.zeros_like(s), s], -1)
        return s.unsqueeze(-1)


def _zero_loss(out: Tensor, y: Tensor) -> Tensor:
    """Per-sample loss of rows that are not samples (QP coefficient rows): 0."""
    return out.reshape(out.shape[0], -1).sum(-1) * 0.0


def constrained_problem(data: FederatedData, spec: ConstrainedSpec, d: int, classes: int | None = 2,
                        name: str | None = None, validate: bool = True) -> FederatedProblem:
    """A :class:`FederatedProblem` over ``w in R^d`` carrying ``spec`` as ``extras["constraints"]``.

    ``classes=2``: the rows are binary-labelled samples (test metrics = logistic loss / accuracy of the
    score); ``classes=None``: the rows are coefficient rows (test metrics are not meaningful, loss 0).
    """
    if validate:
        spec.validate(data, d)
    loss = "cross_entropy" if classes == 2 else _zero_loss
    return FederatedProblem(data, lambda: LinearScore(d, classes), loss=loss, name=name or spec.name,
                            extras={"constraints": spec})


def get_spec(problem: FederatedProblem, who: str = "solver") -> ConstrainedSpec:
    spec = problem.extras.get("constraints") if hasattr(problem, "extras") else None
    if not isinstance(spec, ConstrainedSpec):
        raise ValueError(f"{who}: the problem has no constraints (problem.extras['constraints'] must be a "
                         f"ConstrainedSpec; build it with fedsolve.families.constrained.problem.constrained_problem or a "
                         f"'problem: {{kind: ...}}' section)")
    return spec


def stack_rows(rows: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """Pad parties' rows to one shape: ``x [n, N, p]``, ``y [n, N]``, ``mask [n, N]`` (float64)."""
    N = max(int(x.shape[0]) for x, _ in rows)
    X = torch.zeros(len(rows), N, *rows[0][0].shape[1:], dtype=torch.float64)
    Y = torch.zeros(len(rows), N, dtype=torch.float64)
    M = torch.zeros(len(rows), N, dtype=torch.float64)
    for i, (x, y) in enumerate(rows):
        X[i, : x.shape[0]] = x.double()
        Y[i, : x.shape[0]] = y.double()
        M[i, : x.shape[0]] = 1.0
    return X, Y, M
