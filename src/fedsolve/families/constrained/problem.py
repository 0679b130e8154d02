"""Constrained federated problems (paper 002, Eq. 5): the problem layer, no solver code.

    minimize_w   sum_{i=1}^n f_i(w; Z_i) + h(w)
    subject to   c_0(w; Z_0) <= 0          (server constraint, data Z_0 held only by the server)
                 c_i(w; Z_i) <= 0          (client constraints, client i's data Z_i)
                 (any scalar constraint may instead be an equality, ``kind="eq"``; spec 1.6)

A party's data ``Z`` is a set of rows ``(x, y)``: a client's are its training rows of the
:class:`~fedsolve.data.federated.FederatedData`, the server's are held by :class:`ServerParty`.
``f`` and ``c`` are torch functions of the flat parameter ``w`` ``[d]``, in one of two forms:

* per party (``per_party=True``; the front door, ``parties.py``): ``f(w, i, data)`` with the client's index
  ``i`` (a 0-d integer tensor, clients 0..n-1) and its :class:`PartyData` (its rows and its slice of the
  problem's per-party tensors ``party_tensors``, e.g. its own matrix ``data.A``): each client its own function;
* on rows (the paper's problem kinds): ``f(w, x, y, mask)``, one function for every client, the clients
  differing by their rows.

``mask`` is 1 on real rows and 0 on padding (the clients' rows may be padded to one length), so sums must be
masked. Inside the solvers a party's arguments travel as one :class:`Part`. Gradients come from autograd. ``h``
is given by its prox (:class:`Prox`). Constraints are data of the problem, attached to a
:class:`~fedsolve.problems.FederatedProblem` as ``problem.extras["constraints"]``; ``validate.py`` checks them
on every client. The classes live in ``spec.py``; this module re-exports them with the problem's builder.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedsolve.data.federated import FederatedData
from fedsolve.families.constrained.prox import ConstraintError, Prox
from fedsolve.families.constrained.spec import (
    ConstrainedSpec,
    Constraint,
    Part,
    PartyData,
    PartyFn,
    ServerParty,
    logistic_loss,
    masked_mean,
)
from fedsolve.families.constrained.validate import validate as validate_spec
from fedsolve.problems import FederatedProblem

__all__ = [
    "ConstrainedSpec",
    "Constraint",
    "ConstraintError",
    "LinearScore",
    "Part",
    "PartyData",
    "PartyFn",
    "Prox",
    "ServerParty",
    "constrained_problem",
    "get_spec",
    "logistic_loss",
    "masked_mean",
]


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


def constrained_problem(
    data: FederatedData,
    spec: ConstrainedSpec,
    d: int,
    classes: int | None = 2,
    name: str | None = None,
    validate: bool = True,
) -> FederatedProblem:
    """A :class:`FederatedProblem` over ``w in R^d`` carrying ``spec`` as ``extras["constraints"]``.

    ``classes=2``: the rows are binary-labelled samples (test metrics = logistic loss / accuracy of the
    score); ``classes=None``: the rows are coefficient rows (test metrics are not meaningful, loss 0).
    """
    if validate:
        validate_spec(spec, data, d)
    loss = "cross_entropy" if classes == 2 else _zero_loss
    return FederatedProblem(
        data, lambda: LinearScore(d, classes), loss=loss, name=name or spec.name, extras={"constraints": spec}
    )


def get_spec(problem: FederatedProblem, who: str = "solver") -> ConstrainedSpec:
    """The problem's :class:`ConstrainedSpec`; a problem without one is a ValueError naming the config's ``problem``
    section (a config error, one line from the CLI)."""
    spec = problem.extras.get("constraints") if hasattr(problem, "extras") else None
    if not isinstance(spec, ConstrainedSpec):
        raise ValueError(
            f"problem: {who} solves constrained problems and this one has no constraints; allowed: a 'problem: "
            f"{{kind: constrained_qp | neyman_pearson | fairness}}' section, or a problem built by "
            f"fedsolve.families.constrained.quadratic_problem / party_problem"
        )
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
