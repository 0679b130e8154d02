"""The round loop: sampling, executor, evaluation, checkpoints, callbacks, divergence checks.

One round ``t``:  ids = sample(t);  msg = broadcast(server, ids);  plans = minibatch plans;
rows, uploads = executor(local_update);  clients[ids] = rows;  server = aggregate(server, ids,
uploads);  account bytes;  check for divergence;  evaluate every k rounds;  checkpoint.

All randomness is keyed by (seed, stream, round, client), so a run resumed from a checkpoint
gives the same metrics as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsolve.core.comm import CommLedger
from fedsolve.core.executor import Executor
from fedsolve.core.rng import RngStreams
from fedsolve.core.selection import make_executor
from fedsolve.core.statements import stated
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import finished, place_algorithm, sampling_round, scored_params
from fedsolve.engine.buffers import run_buffers, with_buffers
from fedsolve.engine.io import atomic_torch_save, atomic_write_bytes, atomic_write_text  # noqa: F401  (re-exported)
from fedsolve.engine.metrics import evaluate, summarize
from fedsolve.engine.sampling import SamplingConfig, sample_clients
from fedsolve.engine.schedules import Schedule
from fedsolve.engine.transport import InProcess, Transport

if TYPE_CHECKING:
    from tqdm import tqdm


class DivergenceError(RuntimeError):
    """Raised when a run produces NaN/inf or an exploding loss; the last good checkpoint is kept."""


class ResumeError(ValueError):
    """A checkpoint that cannot be continued: unreadable, or written by another run (algorithm, seed,
    number of clients, model); the message says which and what to do."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :meth:`Simulation.run`: ``round`` is the round that was running, ``checkpoint_round`` the
    round of the last checkpoint on disk (kept intact: writes are atomic); ``--resume`` continues from it."""

    def __init__(self, round_: int, checkpoint_round: int | None):
        super().__init__(f"interrupted at round {round_}")
        self.round, self.checkpoint_round = round_, checkpoint_round


class WorkConfig(BaseModel):
    """Per-client variable amounts of local work (a fraction of the configured steps)."""

    model_config = ConfigDict(extra="forbid")
    variable: Literal["none", "uniform"] = Field(
        "none", description="'uniform': each participant does a U[min_fraction, 1] fraction of its local steps"
    )
    min_fraction: float = Field(0.1, gt=0, le=1, description="smallest fraction of local work")


def _all_metrics() -> list[Literal["f1", "auc"]]:
    return ["f1", "auc"]


class SimulationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(100, ge=1, description="communication rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every k rounds (and at round 0 and the end)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    work: WorkConfig = Field(default_factory=WorkConfig)
    executor: Literal["auto", "sequential", "vectorized", "batched", "linear", "fpfc_linear"] = Field(
        "auto",
        description="how clients run ('batched': stacked-weight SGD for MLPs, core/batched_mlp.py; 'linear': "
        "batched full-batch GD for one-layer models, core/linear.py; 'fpfc_linear' is its former "
        "name; 'auto': calibrated once per machine and model, cached)",
    )
    linear_kernel: Literal["auto", "native", "torch"] = Field(
        "auto",
        description="kernels of the 'linear' executor and of FPFC's dense pair update: 'native' "
        "(compiled at first use), 'torch' (tensor operations), 'auto' = native where it applies",
    )
    chunk_size: int | None = Field(None, ge=1, description="max clients per vectorized call (memory bound)")
    device: str = Field(
        "auto",
        description="where the run's tensors live: 'cpu', 'cuda', 'cuda:N', or 'auto' "
        "(cuda when a GPU is available, else cpu)",
    )
    tf32: bool = Field(
        False,
        description="let CUDA matrix products and cuDNN convolutions use TensorFloat-32 (faster "
        "on Ampere and later GPUs, but float32 rounds then differ from the CPU's by "
        "about 1e-3 relative); off by default, so a GPU run gives the CPU's numbers",
    )
    state_memory_mb: float | None = Field(
        None,
        gt=0,
        description="memory budget of the clients' stored state rows; "
        "over it they move to a memory-mapped file (null: no budget)",
    )
    metrics: list[Literal["f1", "auc"]] = Field(
        default_factory=_all_metrics, description="extra classification metrics"
    )
    checkpoint_every: int = Field(0, ge=0, description="write checkpoint.pt every k rounds (0: at evaluations)")
    divergence_factor: float = Field(1e4, gt=1, description="stop when train loss exceeds factor x first loss")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"device: expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {v!r}")
        return v


def resolve_device(name: str) -> torch.device:
    """``simulation.device`` as a ``torch.device`` (``auto``: the first GPU when CUDA is available, else the CPU).
    Raises ``ValueError`` naming the field when a GPU is asked for and there is none."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = (
                "built with CUDA, but no GPU is visible"
                if torch.backends.cuda.is_built()
                else f"this torch {torch.__version__} is built without CUDA"
            )
            raise ValueError(
                f"simulation.device: {name!r} asked for, but CUDA is not available ({built}); use 'auto' or 'cpu'"
            )
        n = torch.cuda.device_count()
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= n:
            raise ValueError(f"simulation.device: {name!r} asked for, but there are {n} GPU(s): cuda:0 to cuda:{n - 1}")
        dev = torch.device("cuda", index)
    return dev


@contextlib.contextmanager
def cuda_tf32(allow: bool):
    """cuBLAS's and cuDNN's TensorFloat-32 switches (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``) set to ``allow`` inside the block and restored after it. PyTorch's own
    default lets cuDNN convolutions use TF32, which puts float32 CNN rounds about 1e-3 away from the CPU's."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@contextlib.contextmanager
def _on_gpu(device: torch.device, tf32: bool):
    """New tensors on ``device`` and the TF32 switches at ``tf32``, both from entering the block to leaving it."""
    with torch.device(device), cuda_tf32(tf32):
        yield


def _on_run_device(method):
    """A ``Simulation`` method run with new tensors created on the run's device (nothing changes on the CPU)."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        with self.on_device():
            return method(self, *args, **kwargs)

    return wrapped


class Callback(Protocol):
    def on_start(self, sim: Simulation) -> None: ...
    def on_round(self, sim: Simulation, round_: int, info: dict[str, Any]) -> None: ...
    def on_eval(self, sim: Simulation, record: dict[str, Any]) -> None: ...
    def on_end(self, sim: Simulation) -> None: ...


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``. A NaN or inf entry makes the sum in ``t``'s own type NaN or inf (IEEE arithmetic
    never turns them finite again), so a finite sum proves every entry finite in one vectorized pass (float32:
    about 40x cheaper than ``isfinite().all()`` and 140x than a float64 sum on 2 CPU cores); a sum that is not
    finite (a NaN or inf entry, or finite entries whose sum overflows) is settled by ``isfinite().all()``."""
    return math.isfinite(float(t.sum())) or bool(torch.isfinite(t).all())


def _joined(floats: list[torch.Tensor]) -> torch.Tensor:
    """``floats`` as one vector (promoted to the widest type), the 0-d entries stacked in one op rather than
    reshaped one by one (a round's scalar records are most of its entries), the 1-d ones as they are."""
    parts = [v if v.dim() == 1 else v.reshape(-1) for v in floats if v.dim()]
    scalars = [v for v in floats if not v.dim()]
    if scalars:
        parts.append(torch.stack(scalars))
    return torch.cat(parts)


def check_round(
    round_: int,
    train_loss: float | None,
    server: dict[str, torch.Tensor],
    uploads: dict[str, torch.Tensor],
    keys: tuple[str, ...] | None,
    first_loss: float | None,
    factor: float,
    reason: str | None = None,
) -> float | None:
    """The divergence checks after round ``round_`` (shared by ``Simulation`` and the Flower server): no NaN/inf
    in the server-state entries ``keys`` (None: all), in the uploads or in ``train_loss``; no ``reason`` from the
    watched measure (:func:`watched`); and ``train_loss`` at most ``factor`` x the first loss (``None``: not
    watched). Raises :class:`DivergenceError`; returns the (possibly new) first loss."""
    vals = [server[k] for k in keys or server]
    vals += uploads.values()
    floats = [v for v in vals if v.is_floating_point()]
    if floats and all(v.is_cpu and v.numel() <= 4096 for v in floats) and _all_finite(_joined(floats)):
        bad = []  # every entry small: one pass over them all (a millisecond round has dozens of scalars)
    else:
        named = [(k, server[k]) for k in keys or server] + [(f"upload:{k}", v) for k, v in uploads.items()]
        bad = [k for k, v in named if v.is_floating_point() and not _all_finite(v)]
    if bad or (train_loss is not None and not math.isfinite(train_loss)):
        raise DivergenceError(
            f"round {round_ + 1}: non-finite values in {bad or ['train loss']}; the data and the "
            f"problem were checked finite, so the step is too large: try a smaller learning rate. "
            f"The last good checkpoint is kept."
        )
    if reason:
        raise DivergenceError(f"round {round_ + 1}: {reason}. The last good checkpoint is kept.")
    if train_loss is None:
        return first_loss
    if first_loss is None:
        return max(abs(train_loss), 1e-8)
    if train_loss > factor * first_loss:
        raise DivergenceError(
            f"round {round_ + 1}: train loss {train_loss:.4g} exploded (> "
            f"{factor:g} x first loss {first_loss:.4g}); "
            f"try a smaller learning rate. The last good checkpoint is kept."
        )
    return first_loss


def watched(algo, server: dict[str, torch.Tensor], start: float | None, factor: float) -> str | None:
    """Why the run diverges by the measure ``algo.watch`` names when it is a server-state key (its largest absolute
    entry above ``factor`` x ``start``, the first value's ``max(1, |.|_inf)``), else None."""
    if start is None or algo.watch in (None, "train_loss"):
        return None
    size = float(server[algo.watch].abs().max())
    if size > factor * start:
        return (
            f"the iterate {algo.watch!r} diverged (|{algo.watch}|_inf = {size:.3g} > divergence_factor {factor:g} "
            f"x max(1, its first |.|_inf) = {factor * start:.3g}); try smaller step sizes"
        )
    return None


def watch_start(algo, server: dict[str, torch.Tensor]) -> float | None:
    """``max(1, |server[algo.watch]|_inf)`` at the start, for :func:`watched` (None: no server key watched)."""
    if algo.watch in (None, "train_loss") or algo.watch not in server:
        return None
    return max(1.0, float(server[algo.watch].abs().max()))


def eval_due(done: int, cfg: SimulationConfig, finished: bool = False) -> bool:
    """The evaluation cadence (shared by ``Simulation`` and the Flower server): after every ``cfg.eval_every``
    rounds and after the last one, ``cfg.rounds`` or the round after which the algorithm has ``finished``
    (``done`` rounds finished; round 0 is evaluated before the first)."""
    return done % cfg.eval_every == 0 or done == cfg.rounds or finished


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    server: dict[str, torch.Tensor]
    clients: ClientStates
    ledger: CommLedger
    wall_time_s: float
    round_times: list[float]
    extras: dict[str, Any] = field(default_factory=dict)
    per_client: list[dict[str, float]] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)  # {"round", "time_s"} per evaluation
    simulation: Any = field(default=None, repr=False)  # the Simulation that produced this result

    def eval_params(self) -> torch.Tensor:
        """``[num_clients, d]``: the model each client is scored with at the end (:meth:`Simulation.eval_params`)."""
        return self.simulation.eval_params()


class Simulation:
    """Runs one algorithm on one problem for ``cfg.rounds`` rounds."""

    def __init__(
        self,
        problem,
        algorithm,
        cfg: SimulationConfig,
        seed: int,
        out_dir: str | Path | None = None,
        callbacks: list[Callback] | None = None,
        schedule: Schedule | None = None,
        transport: Transport | None = None,
    ):
        self.problem = problem
        #: how the clients' work reaches them (``engine/transport.py``): in this process, or a Flower grid
        self.transport = transport if transport is not None else InProcess()
        #: the protocol that steers the run round by round (``engine/schedules.py``); the plain schedule changes nothing
        self.schedule = schedule if schedule is not None else Schedule()
        self._log: dict[str, float] = {}  # the schedule's numbers for the next evaluation record
        if hasattr(problem, "check_finite"):  # finite data: a NaN in a round owes it to the steps (check_round)
            problem.check_finite()
        algorithm = with_buffers(algorithm)  # BatchNorm running statistics kept as state (engine/buffers.py)
        self.algo = algorithm
        self.cfg = cfg
        self.seed = seed
        self.rngs = RngStreams(seed)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.callbacks = list(callbacks or [])
        self.device = resolve_device(cfg.device)
        if self.device.type != "cpu" and cfg.linear_kernel == "native":
            raise ValueError(
                f"simulation.linear_kernel: 'native' (compiled C kernels) runs on the CPU only; with "
                f"simulation.device {cfg.device!r} use 'auto' or 'torch'"
            )
        #: the kernels in use: ``cfg.linear_kernel`` on the CPU, the tensor operations (``torch``) on a GPU
        self.linear_kernel = cfg.linear_kernel if self.device.type == "cpu" else "torch"
        algorithm.kernel = self.linear_kernel  # the algorithm's own compiled kernels (FPFC's pair update)
        self.vectorized_eval = problem.vmappable
        self.history: list[dict[str, Any]] = []
        self.round_times: list[float] = []
        self.timings: list[dict[str, float]] = []  # {"round", "time_s"} per evaluation (timings.jsonl)
        self.checkpoint_round: int | None = None  # round of the last checkpoint written or loaded
        self.ledger = CommLedger()
        self.start_round = 0
        self.round = 0  # rounds run by run_round / step so far (the next round's index)
        self._first_loss: float | None = None
        self._elapsed = 0.0
        self._t0 = time.perf_counter()
        self.per_client: list[dict[str, float]] = []
        if problem.device.type != "cpu":  # a problem placed on a device before (its data stays): init on the CPU
            place_algorithm(algorithm, "cpu")
        algorithm.sampling = cfg.sampling  # the run's client sampling, told before init (Algorithm.sampling)
        x0 = problem.init_params(self.rngs.torch("init"))
        self.server, self.clients = algorithm.init(x0, self.rngs)  # on the CPU: the same numbers on any device
        if self.device.type != "cpu" or problem.device.type != "cpu":  # placed on the run's device once
            problem.to(self.device)
            place_algorithm(algorithm, self.device)
            self.server = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in self.server.items()}
            self.clients = self.clients.to(self.device)
        self._watch_start = watch_start(algorithm, self.server)
        if not self.transport.holds_clients:  # the nodes hold their client's rows: the server keeps none
            self.clients = None
            self.executor: Executor | None = None
            return
        self._state_budget()
        self.use_executor(cfg.executor)

    def _budget_and_folder(self) -> tuple[int | None, Path | None]:
        """``cfg.state_memory_mb`` in bytes and the spill files' folder (beside the checkpoint, else None: a temp
        folder)."""
        if self.cfg.state_memory_mb is None:
            return None, None
        return int(self.cfg.state_memory_mb * 2**20), None if self.out_dir is None else self.out_dir / "client_states"

    def _state_budget(self) -> None:
        """``cfg.state_memory_mb`` on the client states (spill files beside the checkpoint, else in a temp folder)."""
        budget, where = self._budget_and_folder()
        if budget is not None:
            self.clients.set_budget(budget, where)

    def on_device(self) -> contextlib.AbstractContextManager:
        """A context in which new tensors are created on the run's device (``torch.device``) and CUDA's
        TensorFloat-32 switches are ``simulation.tf32`` (:func:`cuda_tf32`); a no-op on the CPU. The engine runs
        the algorithm's functions and the executors in it."""
        if self.device.type == "cpu":
            return contextlib.nullcontext()
        return _on_gpu(self.device, self.cfg.tf32)

    # ------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "checkpoint.pt"

    def save_checkpoint(self, next_round: int) -> None:
        if self.checkpoint_path is None:
            return
        atomic_torch_save(
            {
                "round": next_round,
                "seed": self.seed,
                "algorithm": self.algo.name,
                "num_clients": self.problem.num_clients,
                "dim": self.problem.layout.dim,
                "server": self.server,
                "clients": self.clients.compact_state_dict(),
                "ledger": self.ledger.state_dict(),
                "history": self.history,
                "round_times": self.round_times,
                "timings": self.timings,
                "first_loss": self._first_loss,
                "per_client": self.per_client,
                "elapsed": self._elapsed + time.perf_counter() - self._t0,
                "schedule": self.schedule.state_dict(),
                "schedule_log": self._log,
                "hparams": self.algo.cfg.model_dump(),
                "watch_start": self._watch_start,
            },
            self.checkpoint_path,
        )
        self.checkpoint_round = next_round

    def load_checkpoint(self, path: str | Path | None = None) -> None:
        path = Path(path) if path is not None else self.checkpoint_path
        if path is None or not path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {path}")
        try:
            # a GPU run resumes anywhere; on the CPU the file is mapped, not read into memory (the stored rows go
            # from it to their place, a spill file over the memory budget)
            ck = torch.load(path, weights_only=False, map_location=self.device, mmap=self.device.type == "cpu")
            if not isinstance(ck, dict) or not {"round", "seed", "algorithm", "server", "clients"} <= set(ck):
                raise ValueError("not a fedsolve checkpoint")
        except Exception as e:  # noqa: BLE001  (truncated, garbage or foreign: torch raises many types)
            raise ResumeError(
                f"--resume: {path} is unreadable ({type(e).__name__}: {str(e)[:120]}); start over with --overwrite"
            ) from None
        self._check_checkpoint(ck, path)
        self.start_round = ck["round"]
        self.server = ck["server"]
        budget, where = self._budget_and_folder()
        self.clients = ClientStates.load(
            ck["clients"], self.problem.num_clients, budget_bytes=budget, spill_dir=where
        )  # the stored rows only, over the budget in spill files
        self.ledger = CommLedger.from_state_dict(ck["ledger"])
        self.history = ck["history"]
        self.round_times = ck["round_times"]
        # a checkpoint of an older fedsolve kept time_s in the records: move it to the timings
        self.timings = ck.get("timings") or [
            {"round": r["round"], "time_s": r["time_s"]} for r in self.history if "time_s" in r
        ]
        self.history = [{k: v for k, v in r.items() if k != "time_s"} for r in self.history]
        self._first_loss = ck["first_loss"]
        self._elapsed = ck["elapsed"]
        self.per_client = ck.get("per_client", [])  # the last evaluation's (a finished run keeps its own)
        self.checkpoint_round = self.start_round
        self.round = self.start_round
        if ck.get("hparams") is not None and ck["hparams"] != self.algo.cfg.model_dump():
            self.set_hparams(**ck["hparams"])  # a schedule changed them (e.g. lambda along a path)
        self.schedule.load_state_dict(self, ck.get("schedule", {}))
        self._log = dict(ck.get("schedule_log", {}))
        self._watch_start = ck.get("watch_start", self._watch_start)

    def _check_checkpoint(self, ck: dict[str, Any], path: Path) -> None:
        """Refuse a checkpoint of another run: algorithm, seed, number of clients, parameter count, and the
        names and shapes of the server and client state (what this run's ``init`` gives)."""
        mine = {
            "algorithm": self.algo.name,
            "seed": self.seed,
            "num_clients": self.problem.num_clients,
            "dim": self.problem.layout.dim,
        }
        diff = [f"{k} {ck[k]!r} (this run: {v!r})" for k, v in mine.items() if k in ck and ck[k] != v]
        for where, new, old in (
            ("server", self.server, ck["server"]),
            ("client state", ClientStates.shapes(self.clients), ClientStates.shapes(ck["clients"])),
        ):
            missing = sorted(set(new) - set(old))
            if missing:  # e.g. a checkpoint of an older version of the algorithm, whose state had other names
                diff.append(
                    f"{where} {', '.join(map(repr, missing))} missing (the checkpoint has "
                    f"{', '.join(map(repr, sorted(old))) or 'nothing'}: written by another version?)"
                )
            for k in sorted(set(new) & set(old)):
                if not isinstance(new[k], torch.Tensor):
                    continue
                # a server pool that starts empty and grows (FPFC's sparse pairs) may have any leading size
                lead = 1 if where == "server" and new[k].dim() and new[k].shape[0] == 0 else 0
                if (
                    not isinstance(old[k], torch.Tensor)
                    or tuple(old[k].shape)[lead:] != tuple(new[k].shape)[lead:]
                    or old[k].dim() != new[k].dim()
                    or old[k].dtype != new[k].dtype
                ):
                    got = (tuple(old[k].shape), old[k].dtype) if isinstance(old[k], torch.Tensor) else type(old[k])
                    diff.append(f"{where} {k!r} {got} (this run: {(tuple(new[k].shape), new[k].dtype)})")
        if diff:
            raise ResumeError(
                f"--resume: {path} belongs to another run: {'; '.join(diff)}; use another --out, "
                f"or start over with --overwrite"
            )

    # ------------------------------------------------------------ evaluation
    @_on_run_device
    def eval_params(self, round_: int | None = None) -> torch.Tensor:
        """Every client's scored parameters ``[num_clients, d]`` after ``round_`` rounds (default: the last
        evaluated round), including the adaptation some algorithms do before scoring (``eval_model`` stating it).

        This is THE way to read a trained model, whatever the algorithm: the global model sits under a
        different server key per algorithm (``w``, ``z``, ``x``, ...) and personalized or clustered methods
        score each client with its own model; row ``i`` is what client ``i`` is scored with.
        ``problem.layout.unflatten(row)`` gives named tensors, ``problem.layout.load_into(model, row)`` a module."""
        ids = torch.arange(self.problem.num_clients)
        msg = self.algo.broadcast(self.server, ids, None)
        if round_ is None:
            round_ = self.history[-1]["round"] if self.history else 0
        executor = self.cfg.executor if self.cfg.executor in ("sequential", "vectorized") else "auto"
        return scored_params(
            self.algo, self.clients.state_dict(), msg, self.problem, self.rngs, round_, self.vectorized_eval, executor
        )

    @_on_run_device
    def eval_buffers(self) -> dict[str, torch.Tensor] | None:
        """Every client's BatchNorm running statistics ``{buffer name: [num_clients, ...]}``, the ones it is scored
        with beside :meth:`eval_params` (``problem.buffers``: its own, or the server's average); None for a model
        without them. A module of client ``i``: ``model.load_state_dict({**layout.unflatten(params[i]),
        **{name: v[i] for name, v in buffers.items()}})``."""
        return run_buffers(self.algo, self.server, self.clients, self.problem.num_clients)

    @_on_run_device
    def evaluate(self, round_: int, train_loss: float | None) -> dict[str, Any]:
        """THE evaluator: the transport scores every reachable client; the record holds the summary of their
        metrics (:func:`~fedsolve.engine.metrics.summarize`), the algorithm's report (where the client states are
        here), the schedule's numbers and the bytes communicated so far."""
        per, extra = self.transport.score(self, round_)
        self.per_client = per
        rec: dict[str, Any] = {"round": round_}
        if train_loss is not None:
            rec["train_loss"] = train_loss
        rec.update(summarize(per, prefix="test_"))
        rec.update(extra)
        if self.clients is not None:
            for key, value in self.algo.report(self.server, self.clients).items():
                if isinstance(value, torch.Tensor) and value.dim() == 2:  # more models to score, under the key
                    s, _ = evaluate(self.problem, value, self.vectorized_eval, (), buffers=self.eval_buffers())
                    rec.update(
                        {
                            key + k.removeprefix("test_"): v
                            for k, v in s.items()
                            if k in ("test_accuracy", "test_loss", "test_rmse")
                        }
                    )
                else:
                    rec[key] = value
        rec.update(self._log)
        rec["uplink_bytes"] = self.ledger.uplink_bytes
        rec["downlink_bytes"] = self.ledger.downlink_bytes
        # wall-clock time goes to ``timings``, not into the record: two identical runs give identical metrics
        self.timings.append({"round": round_, "time_s": self._elapsed + time.perf_counter() - self._t0})
        return rec

    # ------------------------------------------------------------ checks
    def _check(self, round_: int, train_loss: float | None, uploads: dict[str, torch.Tensor]) -> None:
        watch_loss = train_loss if self.algo.watch == "train_loss" else None
        if not (train_loss is None or math.isfinite(train_loss)):
            watch_loss = train_loss  # a non-finite loss is always an error
        self._first_loss = check_round(
            round_,
            watch_loss,
            self.server,
            uploads,
            self.algo.finite_check_keys,
            self._first_loss,
            self.cfg.divergence_factor,
            watched(self.algo, self.server, self._watch_start, self.cfg.divergence_factor),
        )

    # ------------------------------------------------------------ main loop
    def participants(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The sampled clients that take part in round ``t`` (the transport's say: a deployment drops the clients
        without a live node; a deployment replay those whose uploads never arrived)."""
        return self.transport.participants(self, t, ids)

    def run_round(self, t: int, ids: torch.Tensor | None = None) -> dict[str, Any]:
        """THE round body, whatever the transport: communication round ``t`` with the clients ``ids`` (default:
        drawn by ``cfg.sampling``; a schedule such as asyncFPFC's passes the clients whose uploads arrive)."""
        m = self.problem.num_clients
        data = self.problem.data
        if ids is None:
            draw = sampling_round(self.algo, self.server, t)
            ids = self.participants(
                t, sample_clients(self.cfg.sampling, m, data.weights, lambda: self.rngs.numpy("sampling", draw))
            )
        if ids.numel() == 0:  # nobody took part: the round still counts (states unchanged)
            self.round = t + 1
            return {"round": t, "clients": 0, "train_loss": float("nan"), "ids": ids}
        scale = None
        if self.cfg.work.variable == "uniform":
            g = self.rngs.numpy("work", t)
            scale = torch.as_tensor(g.uniform(self.cfg.work.min_fraction, 1.0, size=m))[ids]
        # the engine samples and plans on the CPU (ids); the algorithm and the states see ids on the device (dids)
        ids = ids.cpu()
        dids = ids.to(self.device)
        with self.on_device():
            msgs = self.algo.broadcast(self.server, dids, t)
            answered, uploads, losses = self.transport.train(self, t, dids, msgs, scale)
            if answered is not None:  # the clients whose uploads arrived are the round's participants
                ids, dids = ids[answered.cpu()], dids[answered]
                msgs = {k: v[answered] for k, v in msgs.items()}
                if ids.numel() == 0:
                    self.round = t + 1
                    return {"round": t, "clients": 0, "train_loss": float("nan"), "ids": ids}
            self.server = self.algo.aggregate(self.server, dids, uploads, t)
        if self.algo.communicates:
            self.ledger.add_round(t, msgs, uploads)
        train_loss = None
        if self.algo.reports_train_loss:
            w = data.weights[ids].double()
            train_loss = float((losses.double().cpu() * w).sum() / w.sum())
        self._check(t, train_loss, uploads)
        self.round = t + 1
        return {
            "round": t,
            "clients": int(ids.numel()),
            "train_loss": float("nan") if train_loss is None else train_loss,
            "ids": ids,
        }

    # ------------------------------------------------------------ the API protocols drive a run with
    def step(self, ids: torch.Tensor | None = None) -> dict[str, Any]:
        """Run the next communication round (after the last one run, or ``start_round``) with the clients ``ids``
        (default: sampled), time it and tell the callbacks' ``on_round``; returns the round's info (``round``,
        ``clients``, ``train_loss``, ``ids``)."""
        t = max(self.round, self.start_round)
        t1 = time.perf_counter()
        if ids is None:
            ids = self.schedule.before_round(self, t)
        with torch.enable_grad():
            info = self.run_round(t, ids)
        decision = self.schedule.after_round(self, t, info)
        self._log.update(decision.log)
        info["evaluate"], info["stop"] = decision.evaluate, decision.stop
        self.round_times.append(time.perf_counter() - t1)
        for cb in self.callbacks:
            cb.on_round(self, t, info)
        return info

    def state(self) -> tuple[dict[str, torch.Tensor], ClientStates]:
        """The current server state and client states (the live objects, not copies)."""
        return self.server, self.clients

    def set_state(self, server: dict[str, torch.Tensor], clients: ClientStates) -> None:
        """Replace the server and client states (e.g. return to a saved point of a path); the next round
        continues from them."""
        if clients.num_clients != self.problem.num_clients:
            raise ValueError(
                f"set_state: {clients.num_clients} client rows, the problem has {self.problem.num_clients} clients"
            )
        if self.device.type != "cpu":  # on the run's device (a no-op for tensors already there)
            server = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in server.items()}
            clients = clients.to(self.device)
        self.server, self.clients = server, clients

    def set_hparams(self, **changes: Any) -> None:
        """Change hyper-parameters of the algorithm's config for the next rounds (e.g. FPFC's ``lam`` along a
        path). The whole config is validated again and the algorithm's ``setup`` re-derives everything that
        depends on it, so no cached value of the old config survives."""
        algo = self.algo
        cfg = type(algo.cfg)(**{**algo.cfg.model_dump(), **changes})
        algo.cfg = cfg
        if self.device.type == "cpu":
            algo.setup()
        else:
            place_algorithm(algo, self.device)  # runs setup on the device

    def use_executor(self, name: str) -> None:
        """Run the clients with executor ``name`` from the next round on (as ``SimulationConfig.executor``), chosen
        by how the algorithm states its update for the next round (:func:`~fedsolve.core.statements.stated`)."""
        c = self.cfg
        with self.on_device():
            self.executor = make_executor(
                name, self.problem, c.chunk_size, self.linear_kernel, self.algo, self._statement(self.round)
            )

    def _statement(self, round_: int):
        """The algorithm's update of two clients in round ``round_`` as a statement (None: not stated)."""
        ids = torch.arange(min(2, self.problem.num_clients), device=self.device)
        try:  # a server state that a driver completes after construction (e.g. newcomers) broadcasts nothing yet
            with torch.no_grad():
                msgs = self.algo.broadcast(self.server, ids, round_)
        except Exception:  # noqa: BLE001
            return None
        return stated(self.algo, self.clients.gather(ids), msgs, round_)

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds of this run so far (across resumes)."""
        return self._elapsed + time.perf_counter() - self._t0

    def run(self, resume: bool = False) -> RunResult:
        if resume:
            self.load_checkpoint()
        torch.set_grad_enabled(True)
        self._t0 = time.perf_counter()
        self.transport.start(self)
        for cb in self.callbacks:
            cb.on_start(self)
        if self.start_round == 0 and not self.history:
            self.schedule.start(self)
            rec = self.evaluate(0, None)
            # the loss of the initial model is the reference for "exploding" (a blow-up in round 1 counts)
            if math.isfinite(rec.get("test_loss", float("nan"))):
                self._first_loss = max(abs(rec["test_loss"]), 1e-8)
            self.history.append(rec)
            for cb in self.callbacks:
                cb.on_eval(self, rec)
            self.save_checkpoint(0)  # the initial state is the first "last good" checkpoint
        last_loss = None
        t = self.start_round
        try:
            last_loss = self._rounds(last_loss)
        except KeyboardInterrupt:  # Ctrl-C: the last checkpoint on disk is intact (atomic writes)
            for cb in self.callbacks:
                if hasattr(cb, "on_interrupt"):
                    cb.on_interrupt(self)
            raise RunInterrupted(max(self.round, t), self.checkpoint_round) from None
        wall = self._elapsed + time.perf_counter() - self._t0
        for cb in self.callbacks:
            cb.on_end(self)
        with self.on_device():
            extras = self.algo.report(self.server, self.clients, final=True) if self.clients is not None else {}
        extras.update(self.schedule.summary())
        return RunResult(
            self.history,
            self.server,
            self.clients,
            self.ledger,
            wall,
            self.round_times,
            extras,
            self.per_client,
            self.timings,
            self,
        )

    def _rounds(self, last_loss: float | None) -> float | None:
        """Rounds ``start_round .. cfg.rounds - 1`` with their evaluations and checkpoints (:meth:`run`)."""
        return drive_rounds(
            max(self.round, self.start_round),
            self.cfg.rounds,
            lambda t: self.step(),
            self._after_round,
            last_loss,
            finished=lambda: finished(self.algo, self.server),
        )

    def _after_round(self, done: int, last_loss: float | None, info: dict[str, Any]) -> None:
        """After ``done`` rounds: evaluate when due (a non-finite test loss stops the run), checkpoint when due
        (both after the round that finishes the algorithm's work, ``info["finished"]``)."""
        finished = info["finished"]
        forced = info.get("evaluate")
        is_eval = (
            eval_due(done, self.cfg, finished) if forced is None else (forced or finished or done == self.cfg.rounds)
        )
        if is_eval:
            rec = self.evaluate(done, last_loss)
            tl = rec.get("test_loss", rec.get("test_rmse", 0.0))
            if not math.isfinite(tl):
                raise DivergenceError(
                    f"round {done}: the evaluated models give a non-finite test loss; try a "
                    f"smaller learning rate. The last good checkpoint is kept."
                )
            self.history.append(rec)
            self._log = {}
            for cb in self.callbacks:
                cb.on_eval(self, rec)
        ck_every = self.cfg.checkpoint_every
        if (ck_every and done % ck_every == 0) or (is_eval and (not ck_every or finished)):
            self.save_checkpoint(done)


def drive_rounds(
    first: int,
    rounds: int,
    step: Callable[[int], dict[str, Any]],
    after: Callable[[int, float | None, dict[str, Any]], None],
    last_loss: float | None = None,
    finished: Callable[[], bool] = lambda: False,
) -> float | None:
    """THE round loop of fedsolve, shared by :class:`Simulation` and the Flower server: for ``t`` in
    ``first .. rounds - 1``, ``info = step(t)`` runs communication round ``t`` (its ``train_loss`` may be NaN when
    nobody took part), then ``after(t + 1, last finite train loss, info)`` evaluates, logs and checkpoints
    when due. ``finished()`` (the algorithm's :meth:`~fedsolve.engine.algorithm.Algorithm.finished`: its stopping
    test passed, every later round would be idle) is asked once per round, passed on as ``info["finished"]``, and
    ends the loop there (or at once, for a resumed run that had finished). Returns the last finite train loss."""
    if first < rounds and finished():
        return last_loss
    for t in range(first, rounds):
        info = step(t)
        if math.isfinite(info["train_loss"]):
            last_loss = info["train_loss"]
        info["finished"] = finished() or bool(info.get("stop"))
        after(t + 1, last_loss, info)
        if info["finished"]:
            break
    return last_loss


# ------------------------------------------------------------------ callbacks
class JsonlLogger:
    """Writes ``metrics.jsonl`` (one line per evaluated round: numbers only, so two identical runs give
    byte-identical files) and, beside it, ``timings.jsonl`` (``{"round", "time_s"}``: wall-clock seconds since
    the start, continued across ``--resume``); both rewritten atomically at every evaluation."""

    def __init__(self, path: str | Path, timings: str | Path | None = None):
        self.path = Path(path)
        self.timings_path = Path(timings) if timings is not None else self.path.with_name("timings.jsonl")

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        pass

    def on_eval(self, sim, record):
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in sim.history))
        atomic_write_text(self.timings_path, "".join(json.dumps(r) + "\n" for r in sim.timings))

    def on_end(self, sim):
        pass


class ProgressBar:
    """tqdm bar with round, latest metrics and ETA; its last line shows the final evaluation's metrics.

    ``desc`` names the run (``compare`` adds "run k of N"); ``on_eval`` refreshes the shown metrics at once,
    so the bar never shows the previous evaluation's numbers after the last round."""

    def __init__(
        self,
        desc: str = "",
        keys: tuple[str, ...] = ("train_loss", "test_accuracy", "test_rmse"),
        disable: bool | None = None,
        position: int | None = None,
        leave: bool = True,
    ):
        self.desc, self.keys, self.disable, self.position, self.leave = desc, keys, disable, position, leave
        self.bar: tqdm[Any] | None = None

    def on_start(self, sim):
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=sim.cfg.rounds,
            initial=sim.start_round,
            desc=self.desc,
            unit="rnd",
            disable=self.disable,
            leave=self.leave,
            position=self.position,
            dynamic_ncols=True,
        )
        if sim.history:
            self.on_eval(sim, sim.history[-1])

    def on_round(self, sim, round_, info):
        if self.bar is not None:
            self.bar.update(1)

    def on_eval(self, sim, record):
        if self.bar is not None:
            self.bar.set_postfix({k: f"{record[k]:.4f}" for k in self.keys if k in record}, refresh=True)

    def on_end(self, sim):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    on_interrupt = on_end
