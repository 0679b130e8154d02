"""A client's local update stated as data: what it computes, never how an executor runs it.

An algorithm's ``local_update(state, msg, ctx)`` returns one of these statements (or, for work no statement
describes, the new state rows and the upload it computed itself with ``ctx``). Every executor compiles a
statement its own way: the sequential one client by client, the vectorized one for all selected clients at once,
the fast paths (``core/linear.py``, ``core/batched_mlp.py``) with hand-written stacked kernels where the model and
the statement fit them. So the algorithm states its update once and gets the fastest executor that applies.

* :class:`Descend`: (minibatch) gradient descent on the client's loss plus the usual extra terms,
  ``f_i(p) * scale + (weight_decay/2)||p||^2 + <linear, p> + (prox/2)||p - anchor||^2``, from ``start`` over the
  planned steps of ``phase``, optionally on the coordinates of a mask only or with momentum / Adam steps; then
  ``then(p, steps)`` turns the final parameters and the number of steps taken into (new state rows, upload).
* :class:`Solved`: the new rows and the upload, computed from the state rows and the message alone with
  batch-agnostic tensor operations (leading dimensions broadcast, reductions over the last axis): an executor
  may evaluate the same code once on the stacked rows of all selected clients.
* :class:`Minimize`: Newton's method on a smooth objective of the client's full batch, from ``start`` until the
  client's own tolerance ``||grad||_inf <= tol`` is met (an inexact subproblem solve, e.g. Prox-AL FL's Eq. 19);
  then ``then(u, residual, gradient)`` gives (new state rows, upload). Every client stops at its own tolerance,
  whether the clients run one by one or all at once (``core/newton.py``).

Written for ONE client (``[d]`` rows); the same statement built from stacked rows (``[K, d]``) states the update of
K clients, which is how the fast executors read it (:func:`stated`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

Record = dict[str, Tensor]
Then = Callable[[Tensor, Tensor], tuple[Record, Record]]


@dataclass(frozen=True, eq=False)
class Descend:
    """Local gradient descent, stated (see the module docstring). Each active step of ``phase``:

        g = scale * grad f_i(p) + scale * weight_decay * p + linear + prox * (p - anchor) + extra(p)
        g = g * mask                                              (if a mask is given)
        p = p - lr * g     (``optimizer='sgd'``; 'momentum' and 'adam' keep their buffers over the phase's steps)

    Absent terms are left out (``anchor`` None: the pull is ``prox * p``). ``f_i`` is the model's weighted mean loss
    on the planned minibatch, or ``objective(params, x, y, w)`` (a flat loss, or a
    :class:`~fedsolve.core.context.TensorLoss`). ``block`` (a :class:`~fedsolve.core.context.ParamBlock`): ``start``
    is that block's vector and only the block trains, the rest of the model fixed at ``rest`` (the gradient of the
    block's tensors only). ``until(p, g) -> bool`` stops the client for good once true (an inexactness rule).
    ``then(p, steps)``: ``steps`` is the number of active steps the client took (a tensor).
    """

    start: Tensor
    lr: float | Tensor
    then: Then | None  # None only for a statement a client runs itself (``ctx.descend``), never returned
    phase: str = "train"
    weight_decay: float = 0.0
    linear: Tensor | None = None
    prox: float | Tensor = 0.0
    anchor: Tensor | None = None
    mask: Tensor | None = None
    scale: float | Tensor = 1.0
    objective: Callable[..., Tensor] | None = None
    until: Callable[[Tensor, Tensor], Tensor] | None = None
    extra: Callable[[Tensor], Tensor] | None = None
    block: Any = None
    rest: Tensor | None = None
    optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def plain(self) -> bool:
        """Plain SGD on the model's own loss, whole model, no stopping rule: what the stacked kernels run."""
        return (
            self.objective is None
            and self.until is None
            and self.mask is None
            and self.optimizer == "sgd"
            and self.extra is None
            and self.block is None
            and isinstance(self.scale, (int, float))
            and self.scale == 1.0
            and isinstance(self.prox, (int, float))
            and isinstance(self.lr, (int, float))
        )


@dataclass(frozen=True, eq=False)
class Solved:
    """The update in closed form: ``rows`` (new state rows) and ``upload``, computed from the state rows and the
    message alone with batch-agnostic tensor operations (no data read)."""

    rows: Record
    upload: Record


@dataclass(frozen=True, eq=False)
class Minimize:
    """Newton's method (:func:`~fedsolve.core.newton.newton`) on ONE client's smooth objective
    ``fun(u, x, y, w, *args)`` over its full batch ``(x, y, w)`` of ``phase`` (planned as one full batch:
    ``Work(batch_size=None)``; ``w`` is 0 on padding rows), from ``start`` until ``||grad_u fun||_inf <= tol`` or
    ``max_iter`` steps (``modified``: an indefinite Hessian shifted to positive definite, towards a local minimiser).

    ``then(u, residual, gradient) -> (new state rows, upload)``: ``u`` the solution, ``residual`` its
    ``||grad||_inf`` (the solve is verified, never assumed), ``gradient(fn, v, *fargs)`` the gradient in ``v`` of
    another function ``fn(v, x, y, w, *fargs)`` of the same client's batch (e.g. a residual evaluated at the
    server's point). Written for one client; the same statement from stacked rows states the solves of K clients,
    each stopping at its own tolerance."""

    fun: Callable[..., Tensor]
    start: Tensor
    tol: float | Tensor
    then: Callable[..., tuple[Record, Record]]
    args: tuple = ()
    phase: str = "train"
    max_iter: int = 200
    modified: bool = True


Statement = Descend | Solved | Minimize


def is_statement(obj: Any) -> bool:
    return isinstance(obj, (Descend, Solved, Minimize))


class NotStated(Exception):
    """Raised by the probing context when an algorithm's update reads the context instead of stating itself."""


class ProbeContext:
    """What :func:`stated` passes as ``ctx``: its ``round``, ``descend`` where the caller gives one (an executor
    that runs a client's own :class:`Descend` steps on the stacked rows of all its clients, or a dry check of them)
    and ``loss`` likewise (the stacked clients' losses of a full-batch phase, ``[K]``); any other use of it means
    the update is not stated as data this round."""

    def __init__(
        self,
        round_: int,
        descend: Callable[[Descend], Tensor] | None = None,
        loss: Callable[[Tensor, str, int], Tensor] | None = None,
    ):
        self.round = int(round_)
        self._descend = descend
        self._loss = loss

    def descend(self, s: Descend) -> Tensor:
        if self._descend is None:
            raise NotStated("descend")
        return self._descend(s)

    def loss(self, params: Tensor, phase: str = "train", step: int = 0) -> Tensor:
        if self._loss is None:
            raise NotStated("loss")
        return self._loss(params, phase, step)

    def __getattr__(self, name: str):
        raise NotStated(name)


def stated(
    algo,
    rows: Record,
    msgs: Record,
    round_: int = 0,
    descend: Callable[[Descend], Tensor] | None = None,
    loss: Callable[[Tensor, str, int], Tensor] | None = None,
) -> Statement | None:
    """``algo``'s update of the stacked clients (rows and messages ``[K, ...]``) as a statement, or None when this
    round's update is not stated (it uses the context, returns computed rows, or fails on stacked rows: the generic
    executors then run it client by client, where any real error surfaces). ``descend``: what ``ctx.descend`` does
    with the stacked rows of a step the update runs itself (raising :class:`NotStated` where it cannot); without
    it such an update is not stated. ``loss``: what ``ctx.loss(params [K, d], phase, step)`` gives (the clients'
    losses ``[K]``), likewise."""
    try:
        out = algo.local_update(rows, msgs, ProbeContext(round_, descend, loss))
    except Exception:  # noqa: BLE001  (not stated for stacked rows; the generic path reports real errors)
        return None
    return out if is_statement(out) else None


def initial_statement(
    algo,
    round_: int = 0,
    descend: Callable[[Descend], Tensor] | None = None,
    loss: Callable[[Tensor, str, int], Tensor] | None = None,
) -> Statement | None:
    """:func:`stated` for two clients of ``algo`` from a fresh start (its ``init`` at the problem's initial
    parameters, seed 0): how it states its update when no run is at hand (``core.selection.make_executor``)."""
    import torch

    from fedsolve.core.rng import RngStreams

    problem = algo.problem
    rngs = RngStreams(0)
    try:  # a server state that a driver completes after construction (e.g. newcomers) broadcasts nothing yet
        server, clients = algo.init(problem.init_params(rngs.torch("init")), rngs)
        ids = torch.arange(min(2, problem.num_clients))
        with torch.no_grad():
            msgs = algo.broadcast(server, ids, round_)
    except Exception:  # noqa: BLE001
        return None
    return stated(algo, clients.gather(ids), msgs, round_, descend, loss)
