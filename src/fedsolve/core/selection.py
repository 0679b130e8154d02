"""How the engine chooses an executor: by what the algorithm declares and what the model is.

``make_executor(name, problem, chunk_size, linear_kernel, algorithm)`` returns the executor for a run:
``sequential`` and ``vectorized`` (``core/executor.py``) run any algorithm; ``linear`` (``core/linear.py``)
runs algorithms that declare a full-batch GD form on one-layer models; ``batched`` (``core/batched_mlp.py``)
runs algorithms that declare plain local SGD on stacked MLPs; ``auto`` picks among those that apply (a
calibration cached per machine and model, or fixed rules). Kept apart from ``core/executor.py`` so the
executors import the shared machinery and the choice imports the executors, never the other way round.
"""

from __future__ import annotations

import math

import torch

from fedsolve.core import batched_mlp as bm
from fedsolve.core.executor import (Executor, SequentialExecutor, VectorizedExecutor, Work,  # noqa: F401
                                    linear_gd_owner_ok)
from fedsolve.core.linear import LinearGDExecutor, linear_model_problem


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


def linear_gd_applies(algorithm, problem, check_problem: bool = True) -> bool:
    """The ``linear`` executor (``core/linear.py``) can run ``algorithm``: it declares the full-batch GD form of
    its local update (the optional methods ``supports_linear_gd()`` -> True with this configuration, and
    ``linear_gd(rows, msgs, ids, round_, full)`` -> ``GDStep``), ``linear_gd`` is defined by the class that
    defines ``local_update`` (a subclass that changes one without the other is refused), every work phase is
    full-batch and (``check_problem``) the model is one ``nn.Linear`` with a supported loss."""
    if not linear_gd_owner_ok(algorithm):
        return False
    if any(w.batch_size is not None for w in algorithm.work(0).values()):
        return False
    if not check_problem:
        return True
    return linear_model_problem(problem)


def make_executor(name: str, problem, chunk_size: int | None = None, linear_kernel: str = "auto",
                  algorithm=None) -> Executor:
    """``sequential`` | ``vectorized`` | ``linear`` | ``batched`` | ``auto``, chosen by the engine from what
    ``algorithm`` declares (:func:`linear_gd_applies`, ``core.batched_mlp.batched_sgd_applies``). ``auto``:
    ``linear`` where it applies, else the fastest of ``batched`` (where it applies: stacked MLPs and small CNNs
    such as LeNet), ``vectorized`` (buffer-free models) and ``sequential`` by a calibration cached per machine,
    model and local objective (``core/batched_mlp.py``; timed on ``algorithm.local_objective()`` where the
    algorithm declares one, e.g. an adversarial loss); without ``algorithm`` (no batch size to time), with
    ``FEDSOLVE_CALIBRATE=0`` or when no candidate ran in the calibration: batched where it applies, else
    vectorized for small buffer-free models without large convolutions, else sequential. ``fpfc_linear``
    is ``linear``'s former name; ``linear_kernel`` is the linear executor's kernel (``auto``, ``native`` or
    ``torch``)."""
    if name == "fpfc_linear":
        name = "linear"
    if name == "sequential":
        return SequentialExecutor()
    if name == "vectorized":
        return VectorizedExecutor(chunk_size)
    if name == "linear" or (name == "auto" and algorithm is not None and linear_gd_applies(algorithm, problem)):
        if algorithm is None or not linear_gd_applies(algorithm, problem, check_problem=False):
            what = getattr(algorithm, "name", "this algorithm")
            raise ValueError(f"executor: 'linear' does not run {what} with this configuration (it needs "
                             f"full-batch local GD on the whole model: batch_size null); allowed: 'auto', "
                             f"'sequential', 'vectorized'")
        return LinearGDExecutor(problem, kernel=linear_kernel)

    if name == "batched":
        if algorithm is None or not bm.batched_sgd_applies(algorithm, problem, check_problem=False):
            what = getattr(algorithm, "name", "this algorithm")
            raise ValueError(f"executor: 'batched' does not run {what} with this configuration (it needs local "
                             f"SGD declared by the algorithm's linear_gd with linear_gd_minibatch, one 'train' "
                             f"phase); allowed: 'auto', 'sequential', 'vectorized'")
        return bm.BatchedMLPExecutor(problem)   # raises with the reason when the model is not a stacked MLP
    if name == "auto":
        batched = algorithm is not None and bm.batched_sgd_applies(algorithm, problem)
        choice = None
        if algorithm is not None and bm.calibration_enabled():
            # the fastest that applies, measured once per machine, model and local objective (core/batched_mlp.py)
            cands = (["batched"] if batched else []) + (["vectorized"] if problem.vmappable else []) + ["sequential"]
            bs = algorithm.work(0).get("train", Work()).batch_size
            choice = bm.calibrated_choice(problem, cands, bs, chunk_size, loss=algorithm.local_objective())
        if choice is None:   # no workload to time, FEDSOLVE_CALIBRATE=0, or no candidate ran in the calibration
            if batched:
                return bm.BatchedMLPExecutor(problem)
            if (problem.vmappable and problem.layout.dim <= AUTO_MAX_PARAMS
                    and conv_positions(problem) <= AUTO_MAX_CONV_POSITIONS):
                return VectorizedExecutor(chunk_size)
            return SequentialExecutor()
        if choice == "batched:1":   # batched, its chunks one after another (other jobs hold the other cores)
            return bm.BatchedMLPExecutor(problem, workers=1)
        return make_executor(choice, problem, chunk_size, linear_kernel, algorithm)
    raise ValueError(f"executor: {name!r} is not available for this algorithm/model; allowed: 'auto', "
                     f"'sequential', 'vectorized', 'linear', 'batched'")
