"""FederatedProblem: what the user brings (data, model, loss, named blocks).

Problems are data, not subclasses of the solver: a problem holds the per-client data, a model
factory and a per-sample loss, and, where a family needs it, extra named pieces (constraints,
upper/lower losses, source/target roles) in ``extras``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsolve.core.layout import ParamLayout
from fedsolve.core.norm import RunningStats
from fedsolve.data.federated import FederatedData

if TYPE_CHECKING:
    from pydantic import BaseModel

PerSampleLoss = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(out: Tensor, y: Tensor) -> Tensor:
    """Per-sample cross-entropy."""
    return F.cross_entropy(out, y, reduction="none")


def squared_error(out: Tensor, y: Tensor) -> Tensor:
    """Per-sample 0.5 * squared error (scalar or vector outputs)."""
    out = out.reshape(y.shape[0], -1)
    return 0.5 * (out - y.reshape(y.shape[0], -1)).pow(2).sum(-1)


LOSSES: dict[str, PerSampleLoss] = {"cross_entropy": cross_entropy, "squared_error": squared_error}


@dataclass
class FederatedProblem:
    """A federated optimization problem.

    Args:
        data: the clients' train/test splits.
        model_fn: builds a fresh model (the same architecture for every client).
        loss: per-sample loss name (``cross_entropy`` | ``squared_error``) or callable.
        blocks: named parameter blocks ``{name: [patterns]}`` (e.g. ``{"personal": ["fc2.*"]}``).
        extras: family-specific pieces (constraints, bilevel splits, domain roles, ...).
        buffers: who keeps the running statistics of the model's BatchNorm layers: ``average`` (the server
            averages them, every client is scored with the average) or ``local`` (each client its own, FedBN);
            see ``fedsolve.engine.buffers``. Ignored for a model without BatchNorm layers.
    """

    data: FederatedData
    model_fn: Callable[[], nn.Module]
    loss: str | PerSampleLoss = "cross_entropy"
    blocks: Mapping[str, Sequence[str]] = field(default_factory=dict)
    name: str = "problem"
    extras: dict[str, Any] = field(default_factory=dict)
    buffers: str = "average"

    def __post_init__(self) -> None:
        if self.buffers not in ("average", "local"):
            raise ValueError(f"buffers: unknown {self.buffers!r}; allowed: 'average', 'local'")
        if isinstance(self.loss, str):
            if self.loss not in LOSSES:
                raise ValueError(f"loss: unknown {self.loss!r}; allowed: {sorted(LOSSES)}")
            self.loss_name = self.loss
            self.loss_fn: PerSampleLoss = LOSSES[self.loss]
        else:
            self.loss_name = getattr(self.loss, "__name__", "custom")
            self.loss_fn = self.loss
        self.model = self.model_fn()
        self._check_dtype()
        self.layout = ParamLayout(self.model, self.blocks)
        #: the model's BatchNorm layers and the names of their running statistics (``core/norm.py``)
        self.running_stats = RunningStats(self.model)
        #: clients may run under ``vmap``: the model holds no state besides its parameters and the BatchNorm
        #: running statistics, which the engine keeps explicitly
        self.vmappable = self.running_stats.handles_all

    def _check_dtype(self) -> None:
        """A model whose floating-point parameters are more precise than the features (float32 data with a float64
        model) fails in the first forward pass: refused with one line. Float64 data with a float32 model runs in
        float64 (the engine's flat parameter rows carry the data's type: ``data.dtype: float64``)."""
        x = self.data.train_x
        kinds = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        wider = (
            {k for k in kinds if torch.finfo(k).bits > torch.finfo(x.dtype).bits} if x.is_floating_point() else set()
        )
        if wider:
            got = ", ".join(sorted(str(k).removeprefix("torch.") for k in kinds))
            want = str(x.dtype).removeprefix("torch.")
            raise ValueError(
                f"model_fn: the model's parameters are {got} but the data's features are {want}; "
                f"allowed: the same type for both (data.with_dtype(torch.{got}) or a {want} model)"
            )

    def check_finite(self) -> None:
        """Every client's features and (float) targets, train and test, hold finite values; else a ValueError
        naming the first client and split that does not. The engine asks it before a run, so a run that then
        produces NaN/inf owes it to its steps (a family's problem kind may check its own pieces earlier)."""
        d = self.data
        for split, x, y, off in (
            ("training", d.train_x, d.train_y, d.train_offsets),
            ("test", d.test_x, d.test_y, d.test_offsets),
        ):
            for what, t in (("features", x), ("targets", y)):
                if not t.is_floating_point() or t.numel() == 0:
                    continue
                ok = torch.isfinite(t.reshape(t.shape[0], -1)).all(-1)
                if bool(ok.all()):
                    continue
                row = int((~ok).nonzero()[0, 0])
                i = int(torch.searchsorted(off.cpu(), torch.tensor(row), right=True)) - 1
                raise ValueError(
                    f"data: client {i}'s {split} {what} hold NaN or inf (its row {row - int(off[i])}); "
                    f"allowed: finite values only"
                )

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def init_params(self, generator: torch.Generator) -> Tensor:
        """A fresh random initial flat parameter vector (deterministic given ``generator``), drawn on the CPU
        (the same numbers whatever device the run uses; the engine moves them)."""
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            model = self.model_fn()
        return self.layout.flatten(model)

    @property
    def device(self) -> torch.device:
        """Where the model and the clients' samples live (``cpu`` unless moved by :meth:`to`)."""
        return self.data.train_x.device

    def to(self, device: torch.device | str) -> FederatedProblem:
        """Move the problem to ``device`` in place (once, before a run): the clients' samples, the model and
        the parameter blocks' masks. Offsets, client weights and row groups stay on the CPU: they index and
        plan (sampling, minibatch plans), and the engine moves what it needs per round."""
        device = torch.device(device)
        self.data = copy.copy(self.data).to(device)  # a copy: data shared with other problems stays put
        self.model.to(device)
        with torch.device(device):  # the same masks, rebuilt on the device (add_block replaces a block)
            for name, patterns in self.blocks.items():
                self.layout.add_block(name, patterns)
        self.extras = {k: _moved(v, device) for k, v in self.extras.items()}  # e.g. the server's own data
        return self


def _moved(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside it on ``device``: tensors, modules (moved in place), dataclasses (rebuilt
    with ``dataclasses.replace`` where a field changed), dicts, lists and tuples; the rest as is."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, nn.Module):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            if f.init:
                v = getattr(obj, f.name)
                nv = _moved(v, device)
                if nv is not v:
                    changes[f.name] = nv
        return dataclasses.replace(obj, **changes) if changes else obj
    if isinstance(obj, dict):
        new = {k: _moved(v, device) for k, v in obj.items()}
        return new if any(new[k] is not obj[k] for k in obj) else obj
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        items = [_moved(v, device) for v in obj]
        return type(obj)(items) if any(a is not b for a, b in zip(items, obj)) else obj
    return obj


# ------------------------------------------------------------------ problem kinds
#: A problem kind turns the plain problem that a config's ``data`` and ``model`` sections build into a
#: family's problem (constraints, bilevel splits, domain roles, ...):
#: ``builder(problem, params, seed) -> FederatedProblem``. ``params`` is the config's ``problem.params``;
#: the builder validates it with :func:`parse_params` (a pydantic model with ``extra="forbid"``).
ProblemBuilder = Callable[[FederatedProblem, Mapping[str, Any], int], FederatedProblem]
PROBLEM_KINDS: dict[str, ProblemBuilder] = {}


def parse_params(model: type[BaseModel], params: Mapping[str, Any]):
    """``model(**params)``, or a ValueError with one ``field: what is wrong (got X)`` per bad field, an unknown
    key listing the allowed ones (the runner prefixes ``problem.params``)."""
    import math

    from pydantic import ValidationError

    def finite(v: Any, where: str) -> None:  # NaN and infinities pass bounds such as > 0 in pydantic
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}: expected a finite number, got {v}")
        items = v.items() if isinstance(v, Mapping) else enumerate(v) if isinstance(v, (list, tuple)) else ()
        for k, x in items:
            finite(x, f"{where}.{k}")

    for k, v in dict(params).items():
        finite(v, str(k))
    try:
        return model(**dict(params))
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"])
            if err["type"] == "extra_forbidden":  # the allowed keys are known here for top-level keys only
                msg = "unknown key" + (f"; allowed keys: {sorted(model.model_fields)}" if len(err["loc"]) == 1 else "")
            else:
                msg = err["msg"].removeprefix("Value error, ") + f" (got {err.get('input')!r})"
            lines.append(f"{where}: {msg}" if where else msg)
        raise ValueError("; ".join(lines)) from None


def register_problem_kind(name: str) -> Callable[[ProblemBuilder], ProblemBuilder]:
    """Decorator: register ``builder`` as problem kind ``name`` (``problem: {kind: name}`` in a config).

    Builders live in the modules of ``fedsolve.families``; ``fedsolve.families.get_problem_kind`` looks
    one up by name."""

    def deco(builder: ProblemBuilder) -> ProblemBuilder:
        if name in PROBLEM_KINDS and PROBLEM_KINDS[name] is not builder:
            raise ValueError(f"problem kind {name!r} registered twice")
        PROBLEM_KINDS[name] = builder
        return builder

    return deco
