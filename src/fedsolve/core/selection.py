"""How the engine chooses an executor: by how the algorithm states its update and what the model is.

``make_executor(name, problem, chunk_size, linear_kernel, algorithm, statement)`` returns the executor for a run:
``sequential`` and ``vectorized`` (``core/executor.py``) run any algorithm; ``linear`` (``core/linear.py``) runs
updates stated as full-batch gradient descent on one-layer models; ``batched`` (``core/batched_mlp.py``) runs
updates stated as plain local SGD (on the whole model or one block of it) on stacked MLPs and small CNNs; ``auto``
picks among those that apply (a calibration cached per machine and model, or fixed rules). Kept apart from
``core/executor.py`` so the executors import the shared machinery and the choice imports the executors, never the
other way round.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from fedsolve.core import batched_mlp as bm
from fedsolve.core.executor import Executor, SequentialExecutor, VectorizedExecutor, Work
from fedsolve.core.linear import LinearGDExecutor, kernels_take, linear_model_problem, stacks, whole_rows
from fedsolve.core.statements import NotStated, initial_statement

#: Largest model (in parameters) for which ``auto`` picks the vectorized executor.
#: Measured in benchmarks/round_time.py on a 2-core CPU (see docs/concepts.md).
AUTO_MAX_PARAMS = 2_000_000
#: Largest number of output positions per sample of a convolution for which ``auto`` picks the vectorized
#: executor. Under vmap a convolution becomes a grouped convolution, slow on CPU for large feature maps:
#: LeNet on 8x8 digits (64 positions) ran 1.3x faster vectorized, the HAPT model (64) about
#: level, LeNet on 28x28 MNIST (784) 2.7x slower (benchmarks/round_time.py --workloads lenet, docs/concepts.md).
AUTO_MAX_CONV_POSITIONS = 256


def conv_positions(problem) -> int:
    """The most output positions per sample of any convolution in ``problem.model`` (0 without one), from
    one forward pass on a zero sample."""
    sizes = [0]

    def hook(mod, args, out):
        sizes.append(math.prod(out.shape[2:]))

    convs = [m for m in problem.model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    if not convs:
        return 0
    handles = [m.register_forward_hook(hook) for m in convs]
    try:
        with torch.no_grad():
            problem.model(torch.zeros(1, *problem.data.input_shape, dtype=problem.data.train_x.dtype))
    finally:
        for h in handles:
            h.remove()
    return max(sizes)


def linear_gd_applies(algorithm, problem, check_problem: bool = True, statement=None) -> bool:
    """The ``linear`` executor (``core/linear.py``) can run ``algorithm``: its update is stated as plain full-batch
    gradient descent on the model's loss (``statement``: its round-0 statement, a
    :class:`~fedsolve.core.statements.Descend` on a full-batch phase), and (``check_problem``) the model is one
    ``nn.Linear`` with a supported loss."""
    if statement is None and algorithm is not None:
        statement = full_batch_statement(algorithm)
    if not _stated_sgd(algorithm, statement, full_batch=True):
        return False
    return linear_model_problem(problem) if check_problem else True


def batched_applies(algorithm, problem, check_problem: bool = True, statement=None) -> bool:
    """The ``batched`` executor (``core/batched_mlp.py``) can run ``algorithm``: its update is stated as plain local
    SGD on the model's loss or a block step of it (``statement``; where that is None, the statement of a fresh start
    whose own steps, run with ``ctx.descend``, are such steps too: :func:`stacked_statement`) and
    (``check_problem``) the model is one the executor stacks (a chain of ``nn.Linear`` layers, or a small CNN such
    as LeNet)."""
    if statement is None and algorithm is not None:
        statement = stacked_statement(algorithm)
    if algorithm is None or statement is None:
        return False
    work = algorithm.work(0)
    if not kernels_take(statement, work):
        return False
    if not check_problem:
        return True
    try:
        bm.stacked_kernel(problem)
    except ValueError:
        return False
    return True


def stacked_statement(algorithm):
    """The statement of ``algorithm``'s update from a fresh start (:func:`core.statements.initial_statement`) where
    the steps it runs itself (``ctx.descend``) are ones the batched kernels take; None otherwise."""
    work = algorithm.work(0)

    def dry(s):
        if not kernels_take(s, work):
            raise NotStated("descend")
        return s.start

    return initial_statement(algorithm, descend=dry)


def full_batch_statement(algorithm):
    """The statement of ``algorithm``'s update from a fresh start (:func:`core.statements.initial_statement`) where
    the losses it asks for (``ctx.loss``) are of full-batch phases over the clients' whole training rows, which
    the ``linear`` executor computes for all clients at once; None otherwise."""
    work = algorithm.work(0)

    def dry(params, phase="train", step=0):
        if not whole_rows(work, phase):
            raise NotStated("loss")
        return params.new_zeros(params.shape[:-1])

    return initial_statement(algorithm, loss=dry)


def _stated_sgd(algorithm, statement, full_batch: bool) -> bool:
    """``statement`` is plain SGD (:func:`core.linear.stacks`) on a phase of ``algorithm``'s round-0 work, full
    batch when ``full_batch``."""
    if algorithm is None or statement is None:
        return False
    work = algorithm.work(0)
    if not stacks(statement, work, coordinate_prox=not full_batch):  # the batched kernels take a [d] pull too
        return False
    return (work[statement.phase].batch_size is None) if full_batch else True


#: ``make_executor``'s default: the algorithm's statement is asked for from a fresh start
ASK = object()


def make_executor(
    name: str,
    problem,
    chunk_size: int | None = None,
    linear_kernel: Literal["auto", "native", "torch"] = "auto",
    algorithm=None,
    statement=ASK,
) -> Executor:
    """``sequential`` | ``vectorized`` | ``linear`` | ``batched`` | ``auto``, chosen by the engine from how
    ``algorithm`` states its update (``statement``: its round-0 statement, :func:`core.statements.stated`) and
    what the model is. ``auto``: ``linear`` where it applies, else the fastest of ``batched`` (where it applies:
    stacked MLPs and small CNNs such as LeNet), ``vectorized`` (buffer-free models) and ``sequential`` by a
    calibration cached per machine, model and local objective (``core/batched_mlp.py``); without ``algorithm``,
    with ``FEDSOLVE_CALIBRATE=0`` or when no candidate ran in the calibration: batched where it applies, else
    vectorized for small buffer-free models without large convolutions, else sequential. Under ``auto`` the fast
    executors run the rounds whose update they cannot run with the generic executor ``auto`` would pick without
    them. ``fpfc_linear`` is ``linear``'s former name; ``linear_kernel`` is the linear executor's kernel
    (``auto``, ``native`` or ``torch``)."""
    if name == "fpfc_linear":
        name = "linear"
    if statement is ASK:
        statement = (
            initial_statement(algorithm) if algorithm is not None and name in ("auto", "linear", "batched") else None
        )
    if name == "sequential":
        return SequentialExecutor()
    if name == "vectorized":
        return VectorizedExecutor(chunk_size)
    what = getattr(algorithm, "name", "this algorithm")
    if name == "linear" or (name == "auto" and linear_gd_applies(algorithm, problem, statement=statement)):
        if algorithm is None or not linear_gd_applies(algorithm, problem, check_problem=False, statement=statement):
            raise ValueError(
                f"executor: 'linear' does not run {what} with this configuration (it needs "
                f"full-batch local GD on the whole model: batch_size null); allowed: 'auto', "
                f"'sequential', 'vectorized'"
            )
        fallback = _generic(problem, chunk_size) if name == "auto" else None
        return LinearGDExecutor(problem, kernel=linear_kernel, fallback=fallback)
    if name == "batched":
        if algorithm is None or not batched_applies(algorithm, problem, check_problem=False, statement=statement):
            raise ValueError(
                f"executor: 'batched' does not run {what} with this configuration (it needs plain "
                f"local SGD on the model's loss, on the whole model or one block of it); allowed: 'auto', "
                f"'sequential', 'vectorized'"
            )
        return bm.BatchedMLPExecutor(problem)  # raises with the reason when the model is not a stacked MLP
    if name == "auto":
        batched = algorithm is not None and batched_applies(algorithm, problem, statement=statement)
        choice = None
        if algorithm is not None and bm.calibration_enabled():
            # the fastest that applies, measured once per machine, model and local objective (core/batched_mlp.py)
            cands = (["batched"] if batched else []) + (["vectorized"] if problem.vmappable else []) + ["sequential"]
            bs = algorithm.work(0).get("train", Work()).batch_size
            loss = getattr(statement, "objective", None)  # a saddle or bilevel objective is timed as itself
            choice = bm.calibrated_choice(problem, cands, bs, chunk_size, loss=loss)
        if choice is None:  # no workload to time, FEDSOLVE_CALIBRATE=0, or no candidate ran in the calibration
            if batched:
                return bm.BatchedMLPExecutor(problem, fallback=_generic(problem, chunk_size))
            return _generic(problem, chunk_size)
        if choice in ("batched", "batched:1"):  # batched:1: its chunks one after another (other jobs hold cores)
            return bm.BatchedMLPExecutor(
                problem, workers=1 if choice == "batched:1" else None, fallback=_generic(problem, chunk_size)
            )
        return make_executor(choice, problem, chunk_size, linear_kernel, algorithm, statement)
    raise ValueError(
        f"executor: {name!r} is not available for this algorithm/model; allowed: 'auto', "
        f"'sequential', 'vectorized', 'linear', 'batched'"
    )


def _generic(problem, chunk_size: int | None) -> Executor:
    """The generic executor ``auto`` falls back to: vectorized for small buffer-free models without large
    convolutions, else sequential."""
    if (
        problem.vmappable
        and problem.layout.dim <= AUTO_MAX_PARAMS
        and conv_positions(problem) <= AUTO_MAX_CONV_POSITIONS
    ):
        return VectorizedExecutor(chunk_size)
    return SequentialExecutor()
