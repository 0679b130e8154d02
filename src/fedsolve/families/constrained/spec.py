"""The data of a constrained federated problem (``problem.py`` has the whole picture): a party's arguments
(:class:`Part`, :class:`PartyData`), its constraint (:class:`Constraint`), the server's party (:class:`ServerParty`)
and the problem's functions and declarations (:class:`ConstrainedSpec`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from fedsolve.data.federated import FederatedData
from fedsolve.families.constrained.prox import ConstraintError, Prox

#: ``fn(w, x, y, mask) -> Tensor``: a scalar (objective) or a ``[m]`` vector (constraints)
PartyFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
Kind = Literal["ineq", "eq"]


# ------------------------------------------------------------------ a party's arguments
class PartyData(SimpleNamespace):
    """What a per-party function receives as ``data``: ``x``, ``y``, ``mask`` (the party's rows; ``mask`` is 0 on
    padding) and the party's slice of each per-party tensor of the problem (``data.A`` = ``A[i]``)."""


class Part(NamedTuple):
    """One client's arguments to the problem's functions inside the solvers: its rows (float64), its index ``i``
    (0-d integer tensor) and its slices of the per-party tensors. A tuple of tensors, so the Parts of several
    clients form one Part with a leading client dimension, like their state rows."""

    x: Tensor
    y: Tensor
    mask: Tensor
    i: Tensor
    tensors: dict[str, Tensor]

    def data(self) -> PartyData:
        return PartyData(x=self.x, y=self.y, mask=self.mask, **self.tensors)


def as_part(rows) -> Part:
    """A :class:`Part` from a Part or from the rows ``(x, y, mask)`` of a client of a row-form problem."""
    if isinstance(rows, Part):
        return rows
    x, y, mask = rows
    return Part(x, y, mask, torch.zeros((), dtype=torch.long), {})


# ------------------------------------------------------------------ helpers for user functions
def masked_mean(v: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``v`` over the rows where ``mask`` is 1 (0 when there are none)."""
    return (v * mask).sum() / mask.sum().clamp_min(1.0)


def logistic_loss(score: Tensor, y: Tensor) -> Tensor:
    """Eq. 31: ``phi(w; (x, y)) = -y s + log(1 + exp(s))`` with ``s = w^T x``, computed stably (softplus)."""
    return torch.nn.functional.softplus(score) - y * score


# ------------------------------------------------------------------ constraints and parties
@dataclass(frozen=True)
class Constraint:
    """A party's scalar constraints as one vector ``c(w; Z) [m]`` with their kinds and names.

    ``fn(w, x, y, mask) -> [m]``; ``kinds[j]`` is ``"ineq"`` (``c_j <= 0``) or ``"eq"`` (``c_j = 0``).
    """

    fn: Callable[..., Tensor]  # a PartyFn on rows, or fn(w, i, data) in the per-party form
    num: int
    kinds: tuple[str, ...] = ()  # each a Kind; any other string is rejected in __post_init__
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
    """The constraint structure of a problem: ``f_i``, ``c_i`` of the clients, the server's party.

    ``per_party=False``: ``objective(w, x, y, mask)`` and ``client_constraint.fn(w, x, y, mask)``, the same
    functions for every client; ``per_party=True``: ``objective(w, i, data)`` and ``client_constraint.fn(w, i,
    data)`` (module docstring), with ``party_tensors`` (``{name: [n, ...]}``) sliced per client into ``data``.
    ``quadratic=True`` declares every ``f_i`` quadratic and every constraint affine with ``kind="eq"``, so
    the proximal-AL subproblems are quadratics solved exactly by one linear solve (App. E.2); the declaration is
    checked on every client (``validate.py``). A quadratic problem may also give ``hessian``, the (constant)
    Hessian ``[d, d]`` of ``f_i`` in closed form (``hessian(x, y, mask)``, or ``hessian(i, data)`` per party);
    without it the solver builds it by automatic differentiation (about 4 d^3-sized products per client instead
    of one). It is checked against automatic differentiation on every client.
    """

    objective: Callable[..., Tensor]
    client_constraint: Constraint | None = None
    server: ServerParty = field(default_factory=ServerParty)
    quadratic: bool = False
    name: str = "constrained"
    hessian: Callable[..., Tensor] | None = None
    per_party: bool = False
    party_tensors: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not callable(self.objective):
            raise ConstraintError("objective: must be callable (w, x, y, mask) -> scalar")
        if self.hessian is not None and not self.quadratic:
            raise ConstraintError(
                "hessian: a closed-form Hessian is only used by quadratic problems; set "
                "quadratic=True (f_i quadratic, constraints affine equalities) or drop it"
            )
        if self.hessian is not None and not callable(self.hessian):
            raise ConstraintError("hessian: must be callable (x, y, mask) -> [d, d] tensor")
        if self.party_tensors and not self.per_party:
            raise ConstraintError("party_tensors: per-party tensors reach per-party functions only (per_party=True)")
        if self.quadratic:
            for c in (self.client_constraint, self.server.constraint):
                if c is not None and any(k != "eq" for k in c.kinds):
                    raise ConstraintError(
                        f"{c.label}: quadratic=true needs affine equality constraints "
                        f"(kind 'eq'); its [.]_+ penalty is not quadratic"
                    )

    @property
    def m_client(self) -> int:
        return 0 if self.client_constraint is None else self.client_constraint.num

    @property
    def m_server(self) -> int:
        return 0 if self.server.constraint is None else self.server.constraint.num

    @property
    def client_eq(self) -> Tensor:
        """The equality mask ``[m]`` of the client constraint (empty without one)."""
        c = self.client_constraint
        return c.eq_mask if c is not None else torch.zeros(0, dtype=torch.bool)

    def c_client(self, w: Tensor, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
        """The client constraint of a row-form problem on the rows ``(x, y, mask)``."""
        return self.c(w, (x, y, mask))

    # -------------------------------------------------------------- a client's functions, either form
    def f(self, w: Tensor, part) -> Tensor:
        """``f_i(w)`` of the client whose :class:`Part` (or rows ``(x, y, mask)``) is ``part``."""
        p = as_part(part)
        return self.objective(w, p.i, p.data()) if self.per_party else self.objective(w, p.x, p.y, p.mask)

    def c(self, w: Tensor, part) -> Tensor:
        """``c_i(w)`` ``[m]`` of that client (``[0]`` without a client constraint)."""
        if self.client_constraint is None:
            return w.new_zeros(0)
        p = as_part(part)
        fn = self.client_constraint.fn
        return fn(w, p.i, p.data()) if self.per_party else fn(w, p.x, p.y, p.mask)

    def hess(self, part) -> Tensor:
        """The closed-form Hessian ``[d, d]`` of that client's ``f_i`` (``hessian`` must be given)."""
        p = as_part(part)
        assert self.hessian is not None, "hess is called only for a problem that gives its hessian"
        return self.hessian(p.i, p.data()) if self.per_party else self.hessian(p.x, p.y, p.mask)

    def part(self, data: FederatedData, i: int) -> Part:
        """Client ``i``'s :class:`Part`: its training rows (float64, mask 1) and its per-party tensor slices."""
        x, y = data.client_train(i)
        dev = x.device
        return Part(
            x.double(),
            y.double(),
            torch.ones(x.shape[0], dtype=torch.float64, device=dev),
            torch.tensor(i, device=dev),
            {k: v[i].to(dev) for k, v in self.party_tensors.items()},
        )
