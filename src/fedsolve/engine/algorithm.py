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

from fedsolve.core.context import LocalContext
from fedsolve.core.plans import Work
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
    #: False for algorithms whose rounds minimise no training loss (the constrained solvers: their records carry the
    #: objective and the KKT certificate instead): the engine then logs no ``train_loss`` and watches none
    reports_train_loss: ClassVar[bool] = True
    #: server-state keys checked for NaN/inf each round (None: all); large pair stores may opt out
    finite_check_keys: ClassVar[tuple[str, ...] | None] = None
    #: the run's choice of compiled kernels (``simulation.linear_kernel``: auto, native or torch), set by the engine
    kernel: str = "auto"
    #: how the server averages, for server pieces and DP (``engine/server.py``): ``(server key of the global model,
    #: upload key, "model" | "delta")`` (the upload is the client's model, or its change from the global model);
    #: None: the algorithm keeps no single averaged global model
    averages: ClassVar[tuple[str, str, str] | None] = None

    def __init__(self, config: AlgorithmConfig | Mapping[str, Any] | None, problem):
        if config is None:
            config = self.Config()
        elif not isinstance(config, self.Config):
            config = self.Config(**dict(config))
        self.cfg = config
        self.problem = problem
        self.layout = problem.layout
        self.num_clients = problem.num_clients
        self.client_weights = problem.data.weights   # n_i / n in the data's float type (float64 data: exact)
        self.setup()

    def setup(self) -> None:
        """Hook for subclasses (masks, derived constants)."""

    # ----------------------------------------------------------- participation
    def sampling_round(self, server: Record, round_: int) -> int:
        """The round whose client draw round ``round_`` goes to: ``round_`` itself (a fresh sample every
        communication round) unless a protocol keeps one sample over several rounds (FedNest's FedInn and
        FedOut), which returns the round where its block began. The engine and the Flower server both ask."""
        return round_

    def divergence(self, server: Record, factor: float) -> str | None:
        """Why the run is diverging, judged from the server state (``factor``: the run's ``divergence_factor``),
        or None. For algorithms whose rounds report no train loss for the engine to watch (the engine stops the
        run with this reason and keeps the last good checkpoint)."""
        return None

    def local_objective(self):
        """The loss ``f(params, x, y, w)`` this algorithm's local steps descend when it is not the model's loss
        (e.g. an adversarial objective), else None: ``executor: auto`` times the executors on it."""
        return None

    def finished(self, server: Record) -> bool:
        """True once the algorithm has nothing left to do (e.g. a stopping test such as Prox-AL's Eq. 11 has
        passed, or its outer cap is reached): further rounds leave every state unchanged, so a driver may stop
        early. Default False (run the configured rounds)."""
        return False

    def stacked_update(self, msgs: Record) -> bool:
        """True when this round's ``local_update`` (messages ``msgs``) reads no data and no plan (it ignores
        ``ctx``) and is written with batch-agnostic tensor ops (leading dimensions broadcast, reductions over
        the last axis), so the vectorized executor may call it ONCE on the stacked rows ``[K, ...]`` of the
        selected clients instead of under ``vmap``: the same numbers without vmap's per-operation dispatch
        (e.g. the constrained solver's exact ADMM rounds). Default False."""
        return False

    def stacked_batches(self, msgs: Record) -> bool:
        """True when this round's ``local_update`` reads only full batches (``ctx.batch(phase)``) and is written
        for the stacked clients: the vectorized executor then calls it ONCE with a
        :class:`~fedsolve.core.context.StackedContext` (every tensor with a leading client dimension), so it may
        loop until every client is done (e.g. the constrained solver's Newton solves to each client's
        tolerance), which ``vmap``'s fixed program cannot. Default False."""
        return False

    # ----------------------------------------------------------- local work
    def work(self, round_: int = 0) -> dict[str, Work]:
        """Phases of local work in round ``round_`` and their size (default: one ``train`` phase)."""
        c = self.cfg
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def local_sgd(self, ctx: LocalContext, params: Tensor, phase: str = "train", extra=None, mask=None,
                  lr: float | None = None, scale: float | Tensor = 1.0, until=None) -> Tensor:
        """``ctx.sgd`` with this algorithm's learning rate and weight decay folded into ``f_i``."""
        if mask is None:
            mask = shared_mask(self)
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

    # ----------------------------------------------------------- reporting
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


def shared_mask(algo: Algorithm) -> Tensor | None:
    """Mask of the parameters ``algo`` trains when its ``cfg.shared_only`` is set (None: all of them).

    The FedAPM paper's code runs FedAvg/FedProx/FedADMM on the shared block only (the personal
    block never trains and stays at its common init, fedapm spec 4.3); ``shared_only`` reproduces
    that. Off by default: baselines train the whole model.
    """
    if not getattr(algo.cfg, "shared_only", False):
        return None
    if not algo.layout.has_block("personal"):
        raise ValueError(f"{algo.name}: shared_only=true needs a 'personal' block in the problem "
                         f"(model.blocks or model.personalization)")
    return (~algo.layout.mask("personal")).to(torch.float32)


# ------------------------------------------------------------------ optional capabilities
# An algorithm may declare more than the five functions; the engine looks for these methods:
#   supports_linear_gd() + linear_gd(rows, msgs, ids, round_, full) -> GDStep: its local update as full-batch GD,
#       run by the ``linear`` executor (``core.selection.linear_gd_applies``, ``core/linear.py``);
#   eval_work() -> {phase: Work} + eval_adapt(params, ctx) -> params: local work every client does right before
#       it is scored (Per-FedAvg's adaptation step), see :func:`adapt_for_eval`;
#   extra_evals(server, clients) -> {prefix: [m, d]}: more models the engine scores at each evaluation
#       (logged as ``prefix + accuracy/loss/rmse``).
def eval_phases(algo) -> dict[str, Work]:
    """The phases of ``algo``'s evaluation-time adaptation (its optional ``eval_work()``); ``{}``: none."""
    eval_work = getattr(algo, "eval_work", None)
    return eval_work() if eval_work is not None else {}


def adapt_for_eval(algo, params: Tensor, problem, rngs: RngStreams, round_: int, executor: str = "auto") -> Tensor:
    """Every client's scored parameters ``[m, d]``: ``params`` after ``algo.eval_adapt`` (batches from ``rngs`` at
    ``round_``); ``params`` itself when ``algo`` declares no evaluation-time adaptation."""
    phases = eval_phases(algo)
    if not phases:
        return params
    return run_plain(problem, params, phases, lambda ctx, w: algo.eval_adapt(w, ctx), rngs, round_, executor)


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
    from fedsolve.core.plans import build_plans
    from fedsolve.core.selection import make_executor

    ids = torch.arange(problem.num_clients)
    plans = build_plans(phases, problem.data.train_offsets, ids, rngs, round_, groups=problem.data.row_groups)
    rows, _, _ = make_executor(executor, problem).run(_PlainWork(problem, update), {"w": start.clone()}, {}, ids,
                                                      plans, problem.data)
    return rows["w"]


def weighted_mean(rows: Tensor, weights: Tensor) -> Tensor:
    """``sum_k weights_k rows_k / sum_k weights_k`` over the first dimension (FedAvg aggregation: pass
    ``algo.client_weights[ids]``). The weights are normalized in the rows' dtype and device, so in float64
    they sum to 1 to float64 rounding."""
    w = weights.to(rows.device, rows.dtype)
    w = w / w.sum()
    return (w.unsqueeze(-1) * rows.reshape(rows.shape[0], -1)).sum(0).reshape(rows.shape[1:])


def aggregation_weights(algo: Algorithm, ids: Tensor | None, like: Tensor, weighting: str = "uniform") -> Tensor:
    """Server weights of the clients ``ids`` (None: all m): ones (``weighting: uniform``) or their sample shares
    ``algo.client_weights`` (any other value), in ``like``'s dtype and device."""
    if weighting == "uniform":
        n = algo.num_clients if ids is None else ids.numel()
        return torch.ones(n, dtype=like.dtype, device=like.device)
    w = algo.client_weights if ids is None else algo.client_weights[ids]
    return w.to(like.device, like.dtype)


def stale_mean_step(zsum: Tensor, dz: Tensor, weights: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """One round of a server mean over ALL m clients' latest uploads ``z_i`` (stale for the clients not selected),
    kept as the float64 running sum ``S = sum_i w_i z_i``: the participants (weights ``w_ids``) send
    ``dz_i = z_i^{t+1} - z_i^t``, and ``S' = S + sum w_i dz_i``. Returns ``(S', S' / total)`` with ``total =
    sum_i w_i`` over all m: O(participants) per round, no ``[m, d]`` table (inexact ADMM servers)."""
    s = zsum + (weights.to(dz.device, dz.dtype) @ dz).double()
    return s, (s / total).to(dz.dtype)


def place_algorithm(algo: Algorithm, device: torch.device | str) -> Algorithm:
    """Put ``algo``'s own tensors on ``device`` (the engine calls it once when a run is placed on a GPU, after
    ``problem.to(device)``): the client weights, and what :meth:`Algorithm.setup` derives (run again under the
    device, then any tensor attribute still elsewhere is moved)."""
    device = torch.device(device)
    algo.client_weights = algo.client_weights.to(device)
    with torch.device(device):
        algo.setup()
    for k, v in list(vars(algo).items()):
        if isinstance(v, Tensor) and v.device != device:
            setattr(algo, k, v.to(device))
    return algo


# ------------------------------------------------------------------ registry
ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise ValueError(f"algorithm {cls.name!r} registered twice")
    ALGORITHMS[cls.name] = cls
    return cls


def lookup_algorithm(name: str) -> type[Algorithm]:
    """The algorithm registered as ``name`` (``fedsolve.families.get_algorithm`` imports every family first)."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algorithm: unknown {name!r}; allowed: {sorted(ALGORITHMS)}") from None
