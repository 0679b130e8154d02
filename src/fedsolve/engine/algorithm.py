"""The algorithm interface: eight small functions and a few declarations, in the shape of TFF's learning process.

The functions (``Algorithm`` has no other public method; a test holds it to eight):

* ``init(x0, rngs)`` -> server state (``{name: tensor}``) and ``ClientStates`` (``[m, ...]``);
* ``broadcast(server, ids, round_)`` -> the message record for the selected clients (``[k, ...]``); with
  ``round_=None`` the message the clients are scored with;
* ``local_update(state, msg, ctx)`` -> ONE client's update: a statement (``core/statements.py``: ``Descend``,
  ``Solved``), which every executor compiles its own way, or the new state rows and the upload computed with
  ``ctx``;
* ``aggregate(server, ids, uploads, round_)`` -> new server state;
* ``eval_model(state, msg)`` -> ONE client's evaluation parameters (or a ``Descend`` statement from them: the
  adaptation a client does right before it is scored, planned by ``work(None)``);
* ``work(round_)`` -> the phases of local work of round ``round_`` and their size (``round_=None``: evaluation);
* ``report(server, clients, final=False)`` -> per-evaluation scalars (diagnostics; a ``[m, d]`` tensor value is
  a set of models the engine scores too, logged under its key as a prefix); ``final=True``: what goes into
  summary.json;
* ``setup()`` -> derive constants from the config (run again after ``set_hparams`` and on device placement).

The declarations (class attributes): ``name``, ``description``, ``Config``; ``communicates``;
``reports_train_loss``; ``watch`` (what the divergence guard watches); ``finite_check_keys``; ``averages`` (for
server pieces and DP, ``engine/server.py``); ``phases`` (a :class:`~fedsolve.engine.phases.PhaseTable`: the run
is finished when it reaches the table's ``done`` phase; a phase may keep its client sample).

``local_update`` and ``eval_model`` are pure tensor functions of one client's rows, so the engine may run them
client by client or vectorized; the server side never reads client state, so the same object runs under Flower
with client state in ``context.state``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedsolve.core.context import LocalContext
from fedsolve.core.plans import Work
from fedsolve.core.rng import RngStreams
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.phases import PhaseTable
from fedsolve.problems import FederatedProblem

Record = dict[str, Tensor]


@dataclass(frozen=True)
class Averages:
    """What an averaging solver declares for server pieces and DP (``engine/server.py``): the server key of the
    global model, the upload key, whether an upload is the client's ``model`` or its ``delta`` from the global one,
    and the weights of the average (``samples``: n_i shares; ``uniform``)."""

    key: str
    upload: str
    kind: Literal["model", "delta"] = "model"
    weights: Literal["samples", "uniform"] = "samples"


class AlgorithmConfig(BaseModel):
    """Hyper-parameters shared by algorithms that train locally with SGD."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(0.05, gt=0, description="local learning rate")
    local_epochs: float | None = Field(1.0, gt=0, description="local passes over the client's data")
    local_steps: int | None = Field(None, ge=1, description="fixed number of local steps (overrides local_epochs)")
    batch_size: int | None = Field(32, ge=1, description="minibatch size (null = full batch)")
    weight_decay: float = Field(0.0, ge=0, description="L2 term (wd/2)||w||^2 added to every client loss")


class Algorithm:
    """Base class; subclasses set ``name``, ``description``, ``Config`` and the functions (module docstring)."""

    name: ClassVar[str] = "base"
    description: str = ""  # (a wrapper sets its own per instance)
    #: the validated config class: an AlgorithmConfig, or a solver's own pydantic model with other fields
    Config: ClassVar[type[BaseModel]] = AlgorithmConfig
    #: False for algorithms whose clients never talk to the server (e.g. Local)
    communicates: ClassVar[bool] = True
    #: False for algorithms whose rounds minimise no training loss (the constrained solvers: their records carry the
    #: objective and the KKT certificate instead): the engine then logs no ``train_loss``
    reports_train_loss: ClassVar[bool] = True
    #: what the divergence guard watches besides NaN/inf: ``"train_loss"`` (the round's train loss against the
    #: first evaluation's loss, for losses that are positive and fall), a server-state key (its largest absolute
    #: entry against ``max(1, its first value's)``: an iterate that must stay bounded, e.g. a saddle problem's
    #: model), or None (nothing beyond NaN/inf)
    watch: str | None = "train_loss"
    #: server-state keys checked for NaN/inf each round (None: all); large pair stores may opt out
    finite_check_keys: ClassVar[tuple[str, ...] | None] = None
    #: how the server averages, for server pieces and DP (``engine/server.py``); None: no single averaged model
    averages: ClassVar[Averages | None] = None
    #: the protocol's phases (``engine/phases.py``), for a protocol with several message types or nested loops
    phases: PhaseTable | None = None
    #: the run's choice of compiled kernels (``simulation.linear_kernel``: auto, native or torch), set by the engine
    kernel: str = "auto"
    #: a solver whose clients run a larger network around the problem's model (FedCP): ``wrapper(model) -> module``,
    #: put around the problem's model by :func:`fitted_problem` before the solver is built (None: the model as is)
    model_wrapper: ClassVar[Any] = None
    #: the run's client sampling (``simulation.sampling``), set by the engine before ``init``: a solver whose server
    #: weights depend on how clients are drawn reads it (None: outside a run)
    sampling: Any = None

    def __init__(self, config: BaseModel | Mapping[str, Any] | None, problem):
        if config is None:
            config = self.Config()
        elif not isinstance(config, self.Config):
            config = self.Config(**dict(config))
        self.cfg: Any = config  # a subclass declares its own ``cfg: XConfig`` for the type checker
        self.problem = problem
        self.layout = problem.layout
        self.num_clients = problem.num_clients
        self.client_weights = problem.data.weights  # n_i / n in the data's float type (float64 data: exact)
        self.setup()

    # ----------------------------------------------------------- the functions
    def setup(self) -> None:
        """Derive constants from the config (masks, blocks); run again after ``set_hparams`` and on placement."""

    def init(self, x0: Tensor, rngs: RngStreams) -> tuple[Record, ClientStates]:
        raise NotImplementedError

    def broadcast(self, server: Record, ids: Tensor, round_: int | None) -> Record:
        raise NotImplementedError

    def local_update(self, state: Record, msg: Record, ctx: LocalContext):
        raise NotImplementedError

    def aggregate(self, server: Record, ids: Tensor, uploads: Record, round_: int) -> Record:
        raise NotImplementedError

    def eval_model(self, state: Record, msg: Record):
        """ONE client's evaluation parameters from its state rows and the evaluation message (``broadcast`` with
        ``round_=None``), or a ``Descend`` statement: the adaptation done right before scoring."""
        raise NotImplementedError

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        """Phases of local work in round ``round_`` and their size (default: one ``train`` phase from the config;
        ``round_=None``: the phases of the adaptation before scoring, none by default)."""
        c = self.cfg
        if round_ is None:
            return {}
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def report(self, server: Record, clients: ClientStates, final: bool = False) -> dict[str, Any]:
        """Per-evaluation scalars (e.g. model deviation, clusters found; a ``[m, d]`` tensor is a set of models the
        engine scores as well); ``final``: what goes into summary.json at the end (e.g. cluster assignments)."""
        return {}


def fitted_problem(cls: type[Algorithm], problem: FederatedProblem) -> FederatedProblem:
    """The problem solver class ``cls`` runs on: ``problem`` itself, or, where ``cls.model_wrapper`` is set, a copy
    whose model is the wrapper around a fresh model of ``problem`` (its named blocks dropped: they name the inner
    model's tensors; a problem whose model is already the wrapper stays as it is). A problem that carries a family's
    pieces (``extras``) cannot be rewrapped: ``ValueError``."""
    wrapper = cls.model_wrapper
    if wrapper is None or (isinstance(wrapper, type) and isinstance(problem.model, wrapper)):
        return problem
    if not isinstance(problem, FederatedProblem) or problem.extras:
        raise ValueError(f"{cls.name}: needs a plain empirical-risk problem (data and a model, no problem: section)")
    inner = problem.model_fn
    return replace(problem, model_fn=lambda: wrapper(inner()), blocks={})


def expand(vec: Tensor, ids: Tensor) -> Tensor:
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
        raise ValueError(
            f"{algo.name}: shared_only=true needs a 'personal' block in the problem "
            f"(model.blocks or model.personalization)"
        )
    return (~algo.layout.mask("personal")).to(torch.float32)


# ------------------------------------------------------------------ evaluation
def scored_params(
    algo: Algorithm,
    states: Record,
    msg: Record,
    problem,
    rngs: RngStreams,
    round_: int,
    vectorized: bool,
    executor: str = "auto",
) -> Tensor:
    """Every client's scored parameters ``[m, d]`` from the state rows ``states`` and the scoring message ``msg``
    (``[m, ...]``): ``eval_model`` per client (vmapped when ``vectorized``); where it returns a ``Descend``
    statement (the adaptation a client does right before it is scored), that statement carried out for every
    client on the phases of ``work(None)`` (batches from ``rngs`` at ``round_``)."""
    stmt = _eval_statement(algo, states, msg)
    if stmt is not None:
        return run_statement(problem, stmt, algo.work(None), rngs, round_, executor)
    if vectorized:
        return torch.func.vmap(algo.eval_model)(states, msg)
    m = next(iter(states.values())).shape[0] if states else next(iter(msg.values())).shape[0]
    return torch.stack(
        [algo.eval_model({k: v[i] for k, v in states.items()}, {k: v[i] for k, v in msg.items()}) for i in range(m)]
    )


def _eval_statement(algo: Algorithm, states: Record, msg: Record) -> Descend | None:
    """``eval_model`` on the stacked rows when it states an adaptation (a ``Descend``), else None."""
    if not algo.work(None):
        return None
    try:
        out = algo.eval_model(states, msg)
    except Exception:  # noqa: BLE001  (not batch-agnostic: it returns parameters, computed per client)
        return None
    return out if isinstance(out, Descend) else None


def finished(algo: Algorithm, server: Record) -> bool:
    """The run has nothing left to do: the algorithm's phase table reached its ``done`` phase."""
    return algo.phases is not None and algo.phases.finished(server)


def sampling_round(algo: Algorithm, server: Record, round_: int) -> int:
    """The round whose client draw round ``round_`` takes (a phase may keep the sample of its first round)."""
    return algo.phases.sampling_round(server, round_) if algo.phases is not None else round_


class _Stated:
    """A stacked ``Descend`` as an algorithm the executors run client by client: its tensor fields travel as
    each client's rows (start) and message (the rest), the other fields are shared."""

    TENSORS = ("anchor", "linear", "mask", "lr", "prox", "scale")

    def __init__(self, problem, stmt: Descend):
        self.problem, self.stmt = problem, stmt

    def rows_and_msgs(self) -> tuple[Record, Record]:
        """The start as the clients' rows; the tensor fields with a row per client (``[m, d]``, like the start) as
        their message; the rest (numbers, a ``[d]`` mask or per-coordinate step size) shared."""
        s = self.stmt
        msgs = {
            k: getattr(s, k)
            for k in self.TENSORS
            if isinstance(getattr(s, k), Tensor) and getattr(s, k).dim() == s.start.dim()
        }
        return {"w": s.start}, msgs

    def local_update(self, state, msg, ctx):
        fields = {k: msg.get(k, getattr(self.stmt, k)) for k in self.TENSORS}
        return replace(self.stmt, start=state["w"], then=lambda w, steps: ({"w": w}, {}), **fields)


def run_statement(
    problem, stmt: Descend, phases: dict[str, Work], rngs: RngStreams, round_: int = 0, executor: str = "auto"
) -> Tensor:
    """The stacked statement ``stmt`` (one row per client of ``problem``) carried out for every client, with the
    minibatch plans of ``phases`` drawn from ``rngs`` at ``round_``: the final parameters ``[m, d]``."""
    from fedsolve.core.plans import build_plans
    from fedsolve.core.selection import make_executor

    work = _Stated(problem, stmt)
    rows, msgs = work.rows_and_msgs()
    ids = torch.arange(problem.num_clients)
    plans = build_plans(phases, problem.data.train_offsets, ids, rngs, round_, groups=problem.data.row_groups)
    name = executor if executor in ("sequential", "vectorized") else "auto"
    out, _, _ = make_executor(name, problem, statement=None).run(work, rows, msgs, ids, plans, problem.data)
    return out["w"]


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


def fresh(algo: Algorithm) -> Algorithm:
    """A copy of ``algo``, wrappers included, that shares its problem (data, model, layout): the same solver for
    another run."""
    p = algo.problem
    keep = [p, p.data, p.layout, p.model, algo.client_weights]
    return copy.deepcopy(algo, {id(x): x for x in keep})


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
