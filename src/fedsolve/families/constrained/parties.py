"""The front door: a constrained problem stated party by party, in plain torch.

    problem = party_problem(objective=f, constraint=c, num_constraints=m, party_tensors={"A": A, ...}, dim=d)
    problem = quadratic_problem(A, b, C, e, C0=C0, e0=e0)

* :func:`party_problem` -- every client ``i`` its own objective ``f(w, i, data)`` and constraints
  ``c(w, i, data) -> [m]`` (``<= 0``, or ``= 0`` where ``kinds`` says ``"eq"``), the server its own
  ``c0(w, data0)``. ``data`` is the client's :class:`~fedsolve.families.constrained.problem.PartyData`: its rows
  (``data.x``, ``data.y``, ``data.mask``, from ``data=`` if given) and its slice of every per-party tensor
  (``party_tensors={"A": A}`` with ``A [n, ...]`` gives client i ``data.A = A[i]``). Read per-client numbers from
  ``data``, not by indexing a tensor with ``i`` (``i`` is a 0-d tensor; the clients may be solved all at once).
* :func:`quadratic_problem` -- the quadratic/linear case by its matrices (App. E.2, Eq. 86):
  ``min_w sum_i 1/2 w^T A_i w + b_i^T w  s.t.  C_i w + e_i = 0 (clients),  C0 w + e0 = 0 (server)``; the
  subproblems are then solved exactly (``quadratic=True``, Hessians ``A_i`` in closed form).

Both return a :class:`~fedsolve.problems.FederatedProblem` whose model is ``w`` itself; shapes and values are
checked on every client (``validate.py``). Without ``data`` each client holds one placeholder row (a regression
row of zeros), so the engine's test metrics are zeros: the record of such a run is its certificate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fedsolve.data.federated import FederatedData
from fedsolve.families.constrained.problem import (
    ConstrainedSpec,
    Constraint,
    ConstraintError,
    PartyData,
    Prox,
    ServerParty,
    constrained_problem,
)
from fedsolve.families.constrained.rows import rows_data
from fedsolve.problems import FederatedProblem

__all__ = ["party_problem", "quadratic_problem"]


def party_problem(
    objective: Callable[..., Tensor],
    dim: int,
    constraint: Callable[..., Tensor] | None = None,
    num_constraints: int = 0,
    kinds: str | Sequence[str] = "ineq",
    names: Sequence[str] = (),
    server_constraint: Callable[..., Tensor] | None = None,
    server_num: int = 0,
    server_kinds: str | Sequence[str] = "ineq",
    server_names: Sequence[str] = (),
    party_tensors: dict[str, Tensor] | None = None,
    server_tensors: dict[str, Tensor] | None = None,
    num_clients: int | None = None,
    data: FederatedData | None = None,
    server_rows: tuple[Tensor, Tensor] | None = None,
    quadratic: bool = False,
    hessian: Callable[..., Tensor] | None = None,
    prox: Prox | None = None,
    name: str = "constrained",
) -> FederatedProblem:
    """A constrained problem over ``w in R^dim`` with per-client functions (module docstring). ``num_clients``
    comes from ``party_tensors``' first dimension or ``data`` (give it when neither is there); ``server_rows``:
    the server's data ``(x0, y0)``; ``server_tensors``: tensors its ``server_constraint(w, data0)`` reads as
    ``data0.<name>``; ``hessian(i, data) -> [dim, dim]``: f_i's constant Hessian (``quadratic=True`` only)."""
    tensors = {k: torch.as_tensor(v) for k, v in (party_tensors or {}).items()}
    n = _num_clients(num_clients, tensors, data)
    if not (isinstance(dim, int) and dim >= 1):
        raise ConstraintError(f"dim: the length of w, a positive integer, got {dim!r}")
    if data is None:
        data = placeholder_rows(n, dim, name)
    client = None
    if constraint is not None:
        client = Constraint(
            constraint, num_constraints, _kinds(kinds, num_constraints), tuple(names), label="constraint"
        )
    elif num_constraints:
        raise ConstraintError("num_constraints: give constraint=c(w, i, data) too, or leave num_constraints at 0")
    server = ServerParty(prox=prox or Prox())
    if server_constraint is not None:
        x0, y0 = server_rows if server_rows is not None else (torch.zeros(1, dim), torch.zeros(1))
        server = ServerParty(
            Constraint(
                _server_fn(server_constraint, server_tensors or {}),
                server_num,
                _kinds(server_kinds, server_num),
                tuple(server_names),
                label="server_constraint",
            ),
            torch.as_tensor(x0, dtype=torch.float64),
            torch.as_tensor(y0, dtype=torch.float64),
            prox=prox or Prox(),
        )
    spec = ConstrainedSpec(
        objective=objective,
        client_constraint=client,
        server=server,
        quadratic=quadratic,
        name=name,
        hessian=hessian,
        per_party=True,
        party_tensors=tensors,
    )
    classes = 2 if data.task == "classification" and data.num_classes == 2 else None
    return constrained_problem(data, spec, dim, classes=classes, name=name)


def quadratic_problem(A, b, C=None, e=None, C0=None, e0=None, name: str = "qp") -> FederatedProblem:
    """Eq. 86 by its matrices: clients i = 0..n-1 hold ``A [n, d, d]`` (symmetric positive semidefinite), ``b [n, d]``
    and, optionally, equality constraints ``C [n, m, d] w + e [n, m] = 0``; the server optionally ``C0 [m0, d] w +
    e0 [m0] = 0``. Solved exactly by Prox-AL FL's quadratic subproblem solves."""
    A, b = _f64(A, "A"), _f64(b, "b")
    if A.dim() != 3 or A.shape[1] != A.shape[2]:
        raise ConstraintError(f"A: expected [n, d, d] (one d x d matrix per client), got {tuple(A.shape)}")
    n, d = A.shape[0], A.shape[1]
    _shape(b, (n, d), "b", "[n, d]")
    tensors = {"A": (A + A.mT) / 2, "b": b}
    m = 0
    if (C is None) != (e is None):
        raise ConstraintError("C, e: give both (C_i w + e_i = 0) or neither")
    if C is not None:
        C, e = _f64(C, "C"), _f64(e, "e")
        if C.dim() != 3:
            raise ConstraintError(f"C: expected [n, m, d] (m constraint rows per client), got {tuple(C.shape)}")
        m = C.shape[1]
        _shape(C, (n, m, d), "C", "[n, m, d]")
        _shape(e, (n, m), "e", "[n, m]")
        tensors.update(C=C, e=e)
    server = {}
    if (C0 is None) != (e0 is None):
        raise ConstraintError("C0, e0: give both (C0 w + e0 = 0, the server's) or neither")
    if C0 is not None:
        C0, e0 = _f64(C0, "C0"), _f64(e0, "e0")
        if C0.dim() != 2:
            raise ConstraintError(f"C0: expected [m0, d], got {tuple(C0.shape)}")
        _shape(C0, (C0.shape[0], d), "C0", "[m0, d]")
        _shape(e0, (C0.shape[0],), "e0", "[m0]")
        server = {"C": C0, "e": e0}
    return party_problem(
        lambda w, i, p: 0.5 * (w * (p.A @ w)).sum() + (p.b * w).sum(),
        d,
        constraint=(lambda w, i, p: p.C @ w + p.e) if m else None,
        num_constraints=m,
        kinds="eq",
        names=tuple(f"C_i w + e_i [{j}]" for j in range(m)),
        server_constraint=(lambda w, p: p.C @ w + p.e) if server else None,
        server_num=server["C"].shape[0] if server else 0,
        server_kinds="eq",
        server_names=tuple(f"C0 w + e0 [{j}]" for j in range(server["C"].shape[0])) if server else (),
        party_tensors=tensors,
        server_tensors=server,
        quadratic=True,
        hessian=lambda i, p: p.A,
        name=name,
    )


# ------------------------------------------------------------------ helpers
def placeholder_rows(n: int, d: int, name: str) -> FederatedData:
    """One regression row of zeros ``[1, d]`` per client for training and none for test: the data of a problem
    whose parties hold their functions and tensors only (no test rows, so no test loss or RMSE is reported: of
    rows that are not samples they would be a meaningless 0)."""

    rows = [(np.zeros((1, d)), np.zeros(1)) for _ in range(n)]
    return rows_data(rows, [(np.zeros((0, d)), np.zeros(0)) for _ in range(n)], task="regression", name=name)


def _server_fn(fn, tensors: dict[str, Tensor]):
    """The server's ``fn(w, data0)`` on its rows ``(x, y, mask)``, its tensors where ``w`` is."""
    return lambda w, x, y, mask: fn(
        w, PartyData(x=x, y=y, mask=mask, **{k: torch.as_tensor(v).to(w.device, w.dtype) for k, v in tensors.items()})
    )


def _num_clients(n: int | None, tensors: dict[str, Tensor], data: FederatedData | None) -> int:
    seen = {f"party_tensors.{k}": int(v.shape[0]) for k, v in tensors.items() if v.dim() > 0}
    if data is not None:
        seen["data"] = data.num_clients
    if n is not None:
        seen["num_clients"] = n
    if not seen:
        raise ConstraintError("num_clients: give it, party_tensors (one entry per client) or data")
    if len(set(seen.values())) > 1:
        raise ConstraintError(
            f"num_clients: the clients disagree: {seen}; every per-party tensor needs one entry per client"
        )
    n = next(iter(seen.values()))
    if n < 1:
        raise ConstraintError(f"num_clients: need at least one client, got {n}")
    return n


def _kinds(kinds: str | Sequence[str], num: int) -> tuple[str, ...]:
    if isinstance(kinds, str):
        return (kinds,) * num
    return tuple(kinds)


def _f64(v, field: str) -> Tensor:
    try:
        return torch.as_tensor(np.asarray(v) if not isinstance(v, Tensor) else v).double()
    except (TypeError, ValueError) as err:
        raise ConstraintError(f"{field}: expected a tensor or array of numbers ({err})") from None


def _shape(t: Tensor, want: tuple[int, ...], field: str, form: str) -> None:
    if tuple(t.shape) != tuple(want):
        raise ConstraintError(f"{field}: expected {form} = {list(want)}, got {list(t.shape)}")
