"""The algorithm interface: five small functions, in the shape of TFF's learning process.

* ``init(x0, rngs)`` -> server state (``{name: tensor}``) and ``ClientStates`` (``[m, ...]``);
* ``broadcast(server, ids, round)`` -> the message record for the selected clients (``[k, ...]``);
* ``local_update(state, msg, ctx)`` -> ONE client's new state rows and its upload record;
* ``aggregate(server, ids, uploads, round)`` -> new server state;
* ``eval_broadcast(server, ids)`` + ``eval_model(state, msg)`` -> the flat parameters each client
  is scored with (its personalized model, its cluster's model or the global one).

``local_update`` and ``eval_model`` are pure tensor functions of one client's rows, so the
engine may run them client by client or vectorized; the server side never reads client
state, so the same object runs under Flower with client state in ``context.state``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedsolve.core.executor import LocalContext, Work
from fedsolve.core.linear import FullBatch, GDStep, LinearGDExecutor, linear_model_problem
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import ClientStates

Record = dict[str, Tensor]


class AlgorithmConfig(BaseModel):
    """Hyper-parameters shared by algorithms that train locally with SGD."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(0.05, gt=0, description="local learning rate")
    local_epochs: float | None = Field(1.0, gt=0, description="local passes over the client's data")
    local_steps: int | None = Field(None, ge=1, description="fixed number of local steps (overrides local_epochs)")
    batch_size: int | None = Field(32, ge=1, description="minibatch size (null = full batch)")
    weight_decay: float = Field(0.0, ge=0, description="L2 term (wd/2)||w||^2 added to every client loss")


class Algorithm:
    """Base class; subclasses set ``name``, ``description``, ``Config`` and the five functions."""

    name: ClassVar[str] = "base"
    description: ClassVar[str] = ""
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    #: False for algorithms whose clients never talk to the server (e.g. Local)
    communicates: ClassVar[bool] = True
    #: server-state keys checked for NaN/inf each round (None: all); large pair stores may opt out
    finite_check_keys: ClassVar[tuple[str, ...] | None] = None
    #: the run's choice of compiled kernels (``simulation.linear_kernel``), set by :meth:`use_kernels`
    kernel: str = "auto"

    def __init__(self, config: AlgorithmConfig | Mapping[str, Any] | None, problem):
        if config is None:
            config = self.Config()
        elif not isinstance(config, self.Config):
            config = self.Config(**dict(config))
        self.cfg = config
        self.problem = problem
        self.layout = problem.layout
        self.num_clients = problem.num_clients
        self.client_weights = problem.data.weights.to(torch.float32)
        self.setup()

    def setup(self) -> None:
        """Hook for subclasses (masks, derived constants)."""

    def use_kernels(self, kernel: str) -> None:
        """The run's ``simulation.linear_kernel`` (``auto``, ``native`` or ``torch``), for server-side work
        that has a compiled kernel too (FPFC's pair update); the executor gets it in :meth:`make_executor`."""
        if kernel not in ("auto", "native", "torch"):
            raise ValueError(f"linear_kernel: expected 'auto', 'native' or 'torch', got {kernel!r}")
        self.kernel = kernel

    # ----------------------------------------------------------- local work
    def work(self, round_: int = 0) -> dict[str, Work]:
        """Phases of local work in round ``round_`` and their size (default: one ``train`` phase)."""
        c = self.cfg
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def shared_mask(self) -> Tensor | None:
        """Mask of the parameters this algorithm trains when ``cfg.shared_only`` is set.

        The FedAPM paper's code runs FedAvg/FedProx/FedADMM on the shared block only (the personal
        block never trains and stays at its common init, fedapm spec 4.3); ``shared_only`` reproduces
        that. Off by default: baselines train the whole model.
        """
        if not getattr(self.cfg, "shared_only", False):
            return None
        if not self.layout.has_block("personal"):
            raise ValueError(f"{self.name}: shared_only=true needs a 'personal' block in the problem "
                             f"(model.blocks or model.personalization)")
        return (~self.layout.mask("personal")).to(torch.float32)

    def local_sgd(self, ctx: LocalContext, params: Tensor, phase: str = "train", extra=None, mask=None,
                  lr: float | None = None, scale: float | Tensor = 1.0, until=None) -> Tensor:
        """``ctx.sgd`` with this algorithm's learning rate and weight decay folded into ``f_i``."""
        if mask is None:
            mask = self.shared_mask()
        wd = self.cfg.weight_decay
        if wd > 0:
            base = extra
            extra = (lambda p: scale * wd * p + (base(p) if base is not None else 0.0))
        return ctx.sgd(params, self.cfg.lr if lr is None else lr, phase, extra=extra, mask=mask, scale=scale,
                       until=until)

    # ----------------------------------------------------------- the five functions
    def init(self, x0: Tensor, rngs: RngStreams) -> tuple[Record, ClientStates]:
        raise NotImplementedError

    def broadcast(self, server: Record, ids: Tensor, round_: int) -> Record:
        raise NotImplementedError

    def local_update(self, state: Record, msg: Record, ctx: LocalContext) -> tuple[Record, Record]:
        raise NotImplementedError

    def aggregate(self, server: Record, ids: Tensor, uploads: Record, round_: int) -> Record:
        raise NotImplementedError

    def eval_broadcast(self, server: Record, ids: Tensor) -> Record:
        """What the server sends for evaluation (default: nothing; clients use their state)."""
        return {}

    def eval_model(self, state: Record, msg: Record) -> Tensor:
        """ONE client's evaluation parameters from its state rows and the eval message."""
        raise NotImplementedError

    def eval_work(self) -> dict[str, Work]:
        """Local work every client does on its training data right before it is scored, starting from its
        :meth:`eval_model` parameters (Per-FedAvg's adaptation step); ``{}`` (default): none."""
        return {}

    def eval_adapt(self, params: Tensor, ctx: LocalContext) -> Tensor:
        """ONE client's evaluation-time adaptation of ``params`` with the phases of :meth:`eval_work`."""
        return params

    def adapt_for_eval(self, params: Tensor, problem, rngs: RngStreams, round_: int,
                       executor: str = "auto") -> Tensor:
        """Every client's scored parameters ``[m, d]``: ``params`` after :meth:`eval_adapt` (batches from
        ``rngs`` at ``round_``); ``params`` itself when :meth:`eval_work` is empty."""
        phases = self.eval_work()
        if not phases:
            return params
        return run_plain(problem, params, phases, lambda ctx, w: self.eval_adapt(w, ctx), rngs, round_, executor)

    # ----------------------------------------------------------- optional
    def make_executor(self, name: str, chunk_size: int | None = None, linear_kernel: str = "auto"):
        """An algorithm-specific executor for ``name``, or None (the engine's).

        ``linear`` (or ``auto`` when :meth:`linear_executor_ok`): the batched one-layer executor of
        ``core/linear.py``, which runs :meth:`linear_gd` with ``linear_kernel``.
        """
        if name == "fpfc_linear":   # the executor's former name
            name = "linear"
        if name == "linear":
            if not self.linear_executor_ok(check_problem=False):
                raise ValueError(f"executor: 'linear' does not run {self.name} with this configuration (it needs "
                                 f"full-batch local GD on the whole model: batch_size null); allowed: 'auto', "
                                 f"'sequential', 'vectorized'")
            return LinearGDExecutor(self.problem, kernel=linear_kernel)
        if name == "auto" and self.linear_executor_ok():
            return LinearGDExecutor(self.problem, kernel=linear_kernel)
        return None

    def supports_linear_gd(self) -> bool:
        """True when, with this configuration, :meth:`linear_gd` describes the local update."""
        return False

    def linear_executor_ok(self, check_problem: bool = True) -> bool:
        """The ``linear`` executor applies: :meth:`supports_linear_gd`, ``linear_gd`` defined by the class
        that defines ``local_update`` (a subclass that changes one without the other is refused), every
        work phase full-batch and (``check_problem``) a one-``nn.Linear`` model with a supported loss."""
        if not self.supports_linear_gd():
            return False
        owner = lambda attr: next(k for k in type(self).__mro__ if attr in k.__dict__)  # noqa: E731
        if owner("local_update") is not owner("linear_gd"):   # a subclass changed the update, not its GD form
            return False
        if any(w.batch_size is not None for w in self.work(0).values()):
            return False
        return linear_model_problem(self.problem) if check_problem else True

    def linear_gd(self, rows: Record, msgs: Record, ids: Tensor, round_: int, full: FullBatch) -> GDStep:
        """This round's local update of clients ``ids`` as full-batch GD (``core.linear.GDStep``); called
        only when :meth:`supports_linear_gd`.

        ``rows``/``msgs`` are the selected clients' state and messages ``[k, ...]``; ``full.loss(w)`` /
        ``full.grad(w)`` (``w`` ``[k, d]``) are each client's mean training loss and its gradient (e.g.
        IFCA's cluster choice, Per-FedAvg's adaptation step).
        Must match :meth:`local_update` (tests compare the two executors per algorithm).
        """
        raise NotImplementedError(f"{self.name} has no full-batch GD form (supports_linear_gd is False)")

    def diagnostics(self, server: Record, clients: ClientStates) -> dict[str, float]:
        """Extra per-round scalars for the metrics log (e.g. model deviation, clusters found)."""
        return {}

    def finalize(self, server: Record, clients: ClientStates) -> dict[str, Any]:
        """Anything to store in summary.json at the end (e.g. cluster assignments)."""
        return {}

    # ----------------------------------------------------------- helpers for subclasses
    def expand(self, vec: Tensor, ids: Tensor) -> Tensor:
        """One server tensor sent to every selected client: ``[d] -> [k, d]`` (a view)."""
        return vec.unsqueeze(0).expand(ids.numel(), *vec.shape)

    def weighted_mean(self, rows: Tensor, ids: Tensor) -> Tensor:
        """Sample-size weighted mean of the selected clients' rows (FedAvg aggregation)."""
        w = self.client_weights[ids]
        w = (w / w.sum()).to(rows.dtype)
        return (w.unsqueeze(-1) * rows.reshape(rows.shape[0], -1)).sum(0).reshape(rows.shape[1:])


class _PlainWork:
    """What an executor needs to run ``update(ctx, w) -> w`` on every client: a problem, a local update."""

    def __init__(self, problem, update):
        self.problem, self._update = problem, update

    def local_update(self, state, msg, ctx):
        return {"w": self._update(ctx, state["w"])}, {}


def run_plain(problem, start: Tensor, phases: dict[str, Work], update, rngs: RngStreams, round_: int = 0,
              executor: str = "auto") -> Tensor:
    """``update(ctx, w)`` for every client of ``problem`` from the rows of ``start`` ``[m, d]``, with the
    minibatch plans of ``phases`` drawn from ``rngs`` at ``round_`` (newcomers, evaluation adaptation)."""
    from fedsolve.core.executor import build_plans, make_executor

    ids = torch.arange(problem.num_clients)
    plans = build_plans(phases, problem.data.train_offsets, ids, rngs, round_, groups=problem.data.row_groups)
    rows, _, _ = make_executor(executor, problem).run(_PlainWork(problem, update), {"w": start.clone()}, {}, ids,
                                                      plans, problem.data)
    return rows["w"]


# ------------------------------------------------------------------ registry
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise ValueError(f"algorithm {cls.name!r} registered twice")
    ALGORITHMS[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type[Algorithm]:
    from fedsolve import algorithms as _  # noqa: F401  (populate the registry)

    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algorithm: unknown {name!r}; allowed: {sorted(ALGORITHMS)}") from None
