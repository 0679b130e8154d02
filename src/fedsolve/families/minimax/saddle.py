"""Federated saddle problems: ``min_x max_y f(x, y) = (1/N) sum_i f_i(x, y)`` (FedMM eq. 3), x and y shared.

A minimax problem is a :class:`~fedsolve.problems.FederatedProblem` whose parameters fall into two named blocks of
its ``ParamLayout``: ``omega`` (the MIN player x) and ``psi`` (the MAX player y). ``problem.extras["minimax"]``
(:class:`Minimax`) holds the saddle objective ``f_i`` as a function of the whole flat parameter vector and one
weighted minibatch ``(rows, y, w)`` of the client's data. Three ways to state one:

* ``clients.client_saddle_problem``: one plain torch function ``f(i, x, y, d)`` of the client index ``i``, the
  two players and client i's own data ``d`` (a tensor, a tuple or a dict of tensors per client);
* ``clients.quadratic_saddle_problem``: ``f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y``
  from the clients' matrices;
* :func:`saddle_problem` (here): an objective ``objective(omega, psi, (x, y, w))`` on minibatches of data rows
  and any model (stochastic local steps); adversarial domain adaptation (``problem.py``) is built like it.

Every client's data is checked finite when the problem is built (:func:`check_finite_data`), and the max part
concave at the start where it can be checked (:func:`check_concave`), so a run that still produces NaN/inf has a
step size too large.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from fedsolve.data.federated import FederatedData
from fedsolve.problems import FederatedProblem

__all__ = [
    "OMEGA",
    "PSI",
    "Minimax",
    "minimax_of",
    "player_signs",
    "with_saddle_objective",
    "check_finite_data",
    "check_concave",
    "saddle_problem",
]

OMEGA, PSI = "omega", "psi"
_Problem = TypeVar("_Problem", bound=FederatedProblem)
Batch = tuple[Tensor, Tensor, Tensor]
#: ``f_i(params, x, y, w)``: the saddle objective on one weighted minibatch, ``params`` the flat vector
FlatObjective = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: a user's saddle objective ``objective(omega, psi, (x, y, w))`` on data rows
SaddleObjective = Callable[[Tensor, Tensor, Batch], Tensor]
#: the largest max player whose Hessian the concavity check forms (beyond: power iteration)
DENSE_HESSIAN_MAX = 256
#: Hessian-vector products per power iteration of the concavity check
POWER_STEPS = 30


@dataclass(frozen=True)
class Minimax:
    """What a minimax solver needs besides the layout's ``omega``/``psi`` blocks.

    ``loss(params, x, y, w)``: ``f_i`` on one minibatch; omega descends it, psi ascends it.
    ``feature_scale``: factor on the step size of the ``features`` block where the solver has no explicit
    ``feature_lr`` (1 from scratch; 0.05 in the pretrained regime: 0.01 x 0.05 = the paper's 0.0005).
    ``psi_scale``: factor on psi's GRADIENT of ``f_i`` only (not on a solver's penalty or dual terms):
    1 in the paper; ``problem.psi_gradient_scale`` for the authors' code."""

    loss: FlatObjective
    name: str = "saddle"
    feature_scale: float = 1.0
    psi_scale: float = 1.0


def minimax_of(problem) -> Minimax:
    """The problem's minimax objective; a clear error for a problem that is not a minimax problem."""
    mm = getattr(problem, "extras", {}).get("minimax")
    if not isinstance(mm, Minimax):
        raise ValueError(
            "problem: the minimax solvers need a minimax problem; allowed: problem: {kind: "
            "domain_adaptation} in a config (with domain data), or a problem from "
            "fedsolve.families.minimax (client_saddle_problem, quadratic_saddle_problem, saddle_problem)"
        )
    return mm


def player_signs(layout) -> Tensor:
    """``[d]`` vector: +1 on omega (descent), -1 on psi (ascent); checks that the blocks split the model."""
    for b in (OMEGA, PSI):
        if not layout.has_block(b):
            raise ValueError(f"minimax problem: the layout has no {b!r} block; blocks: {layout.block_names()}")
    om, ps = layout.mask(OMEGA), layout.mask(PSI)
    if bool((om & ps).any()):
        raise ValueError(f"minimax problem: blocks 'omega' and 'psi' overlap on {int((om & ps).sum())} parameters")
    if not bool((om | ps).all()):
        left = [n for n in layout.names if n not in layout.block_params(OMEGA) + layout.block_params(PSI)]
        raise ValueError(f"minimax problem: parameters in neither 'omega' nor 'psi': {left}")
    return torch.where(om, 1.0, -1.0)


def with_saddle_objective(
    problem: _Problem,
    loss_of_layout,
    name: str,
    feature_scale: float = 1.0,
    psi_scale: float = 1.0,
    checked: bool = False,
) -> _Problem:
    """``problem`` with its data checked finite (unless ``checked``: already done) and ``extras["minimax"]`` set to
    the objective ``loss_of_layout(layout)`` (the layout's ``omega``/``psi`` blocks checked to split the model)."""
    if not checked:
        check_finite_data(problem.data)
    player_signs(problem.layout)
    problem.extras["minimax"] = Minimax(loss_of_layout(problem.layout), name, feature_scale, psi_scale)
    return problem


def check_finite_data(data: FederatedData, roles: Mapping[str, str] | None = None) -> None:
    """Every client's training and test features (and real-valued targets) hold no NaN/inf; the error names the
    field, the first client and row. ``roles``: how the message names a field (e.g. ``test_x``: "target test
    images")."""
    roles = roles or {}
    fields = [("train_x", data.train_x, data.train_offsets), ("test_x", data.test_x, data.test_offsets)]
    fields += [
        (k, t, o)
        for k, t, o in (("train_y", data.train_y, data.train_offsets), ("test_y", data.test_y, data.test_offsets))
        if t.is_floating_point()
    ]
    for key, t, offsets in fields:
        if not t.is_floating_point():
            continue
        bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(-1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            client = int(torch.searchsorted(offsets, torch.tensor(row), right=True)) - 1
            what = f" ({roles[key]})" if key in roles else ""
            raise ValueError(
                f"data.{key}{what}: client {client} holds NaN/inf values ({int(bad.sum())} row(s) in all, "
                f"its row {row - int(offsets[client])} first); allowed: finite values only"
            )


# ------------------------------------------------------------------ objectives on data rows
def saddle_problem(
    data: FederatedData,
    model_fn: Callable[[], nn.Module],
    objective: SaddleObjective,
    omega: Sequence[str],
    psi: Sequence[str],
    *,
    name: str = "saddle",
    eval_loss: str = "squared_error",
    extra_blocks: dict | None = None,
    concave: bool = True,
) -> FederatedProblem:
    """A minimax problem from an objective ``objective(omega, psi, (x, y, w))`` on minibatches of data rows
    (``omega``/``psi``: the flat block vectors; a weighted mean over the batch rows). ``omega``/``psi``:
    parameter-name patterns of the two players (together all of ``model_fn()``'s parameters). ``eval_loss``
    scores ``model(x)`` on test data. ``concave``: check that the clients' mean objective (each on its whole
    training data) is concave in psi at ``model_fn()``'s parameters (:func:`check_concave`)."""
    blocks = {OMEGA: list(omega), PSI: list(psi), **(extra_blocks or {})}
    problem = FederatedProblem(data=data, model_fn=model_fn, loss=eval_loss, blocks=blocks, name=name)

    def lift(layout):
        io = torch.nonzero(layout.mask(OMEGA)).flatten()
        ip = torch.nonzero(layout.mask(PSI)).flatten()
        return lambda params, x, y, w: objective(
            params[..., io.to(params.device)], params[..., ip.to(params.device)], (x, y, w)
        )

    problem = with_saddle_objective(problem, lift, name)
    if concave:
        layout, f = problem.layout, problem.extras["minimax"].loss
        w0, ip = layout.flatten(problem.model).detach(), layout.mask(PSI)

        def mean_f(psi_vec: Tensor) -> Tensor:
            w = w0.masked_scatter(ip, psi_vec)
            return torch.stack([f(w, *_client_rows(data, i)) for i in range(data.num_clients)]).mean()

        check_concave(mean_f, w0[ip], "objective")
    return problem


def _client_rows(data: FederatedData, i: int) -> Batch:
    """Client ``i``'s training rows with the weights of their mean."""
    x, y = data.client_train(i)
    return (
        x,
        y,
        torch.full((y.shape[0],), 1.0 / max(y.shape[0], 1), dtype=x.dtype if x.is_floating_point() else torch.float32),
    )


def check_concave(mean_f: Callable[[Tensor], Tensor], y0: Tensor, where: str) -> None:
    """``mean_f`` (the clients' mean objective as a function of the flat max player) is concave at ``y0``: no
    direction ``v`` with ``v'Hv > 0`` for its Hessian ``H`` (beyond a round-off tolerance). Up to
    :data:`DENSE_HESSIAN_MAX` entries the Hessian is formed and its largest eigenvalue taken; beyond, a direction is
    sought by power iteration on ``H`` and on ``H + |lambda_1| I`` (:data:`POWER_STEPS` Hessian-vector products
    each), so the error is a proof (a direction found) and a missed one is possible. ``where`` names the function
    in the error."""
    y = y0.detach().reshape(-1).clone()
    if y.numel() <= DENSE_HESSIAN_MAX:
        h = torch.autograd.functional.hessian(mean_f, y)
        h = 0.5 * (h + h.T)
        top, size = float(torch.linalg.eigvalsh(h.double()).max()), float(h.abs().max())
    else:
        top, size = _top_curvature(mean_f, y)
    tol = (1e-5 if y0.dtype == torch.float32 else 1e-10) * max(1.0, size)
    if top > tol:
        raise ValueError(
            f"{where}: the max part is not concave: at the start point the Hessian in y of the clients' "
            f"mean has the eigenvalue {top:.3g} > 0 (the ascent runs off along it, whatever the step "
            f"size); allowed: a function concave in y (strongly concave for a unique saddle point)"
        )


def _top_curvature(mean_f: Callable[[Tensor], Tensor], y: Tensor) -> tuple[float, float]:
    """``(the largest v'Hv found over unit v, |lambda_1|)`` by power iteration with Hessian-vector products."""

    def hvp(v: Tensor) -> Tensor:
        return torch.autograd.functional.hvp(mean_f, y, v)[1]

    def power(shift: float) -> float:
        v = torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=y.dtype).to(y.device)
        for _ in range(POWER_STEPS):
            v = v / v.norm().clamp_min(1e-30)
            v = hvp(v) + shift * v
        v = v / v.norm().clamp_min(1e-30)
        return float(v @ hvp(v))

    first = power(0.0)
    return (first if first > 0 else power(abs(first))), abs(first)
