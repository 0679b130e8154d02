"""The round loop: sampling, executor, evaluation, checkpoints, callbacks, divergence checks.

One round ``t``:  ids = sample(t);  msg = broadcast(server, ids);  plans = minibatch plans;
rows, uploads = executor(local_update);  clients[ids] = rows;  server = aggregate(server, ids,
uploads);  account bytes;  check for divergence;  evaluate every k rounds;  checkpoint.

All randomness is keyed by (seed, stream, round, client), so a run resumed from a checkpoint
gives the same metrics as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.algorithms.base import adapt_for_eval
from fedsolve.core.comm import CommLedger
from fedsolve.core.executor import build_plans, make_executor
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import ClientStates
from fedsolve.simulation.metrics import evaluate
from fedsolve.simulation.sampling import SamplingConfig, sample_clients


class DivergenceError(RuntimeError):
    """Raised when a run produces NaN/inf or an exploding loss; the last good checkpoint is kept."""


class WorkConfig(BaseModel):
    """Per-client variable amounts of local work (a fraction of the configured steps)."""

    model_config = ConfigDict(extra="forbid")
    variable: Literal["none", "uniform"] = Field("none", description="'uniform': each participant does a "
                                                 "U[min_fraction, 1] fraction of its local steps")
    min_fraction: float = Field(0.1, gt=0, le=1, description="smallest fraction of local work")


class SimulationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(100, ge=1, description="communication rounds")
    eval_every: int = Field(10, ge=1, description="evaluate every k rounds (and at round 0 and the end)")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    work: WorkConfig = Field(default_factory=WorkConfig)
    executor: Literal["auto", "sequential", "vectorized", "linear", "fpfc_linear"] = Field(
        "auto", description="how clients run ('linear': batched full-batch GD for one-layer models, see "
                            "core/linear.py; 'fpfc_linear' is its former name)")
    linear_kernel: Literal["auto", "native", "torch"] = Field(
        "auto", description="kernels of the 'linear' executor and of FPFC's dense pair update: 'native' "
                            "(compiled at first use), 'torch' (tensor operations), 'auto' = native where it applies")
    chunk_size: int | None = Field(None, ge=1, description="max clients per vectorized call (memory bound)")
    metrics: list[Literal["f1", "auc"]] = Field(default_factory=lambda: ["f1", "auc"],
                                                description="extra classification metrics")
    checkpoint_every: int = Field(0, ge=0, description="write checkpoint.pt every k rounds (0: at evaluations)")
    divergence_factor: float = Field(1e4, gt=1, description="stop when train loss exceeds factor x first loss")


class Callback(Protocol):
    def on_start(self, sim: "Simulation") -> None: ...
    def on_round(self, sim: "Simulation", round_: int, info: dict[str, Any]) -> None: ...
    def on_eval(self, sim: "Simulation", record: dict[str, Any]) -> None: ...
    def on_end(self, sim: "Simulation") -> None: ...


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_NEW_FILE_MODE = 0o666 & ~_umask()   # what open() would give a new file (mkstemp's own mode is 0600)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename: never half-written. The file gets the
    mode it had, or a new file's usual mode (umask), not the temp file's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_torch_save(obj: Any, path: Path) -> None:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``: its float64 sum is finite (one pass; 4x cheaper than ``isfinite().all()``).
    A float32 tensor cannot overflow a float64 sum, so this is exact for it."""
    return math.isfinite(float(t.sum(dtype=torch.float64)))


def check_round(round_: int, train_loss: float, server: dict[str, torch.Tensor], uploads: dict[str, torch.Tensor],
                keys: tuple[str, ...] | None, first_loss: float | None, factor: float) -> float:
    """The divergence checks after round ``round_`` (shared by ``Simulation`` and the Flower server): no NaN/inf
    in the server-state entries ``keys`` (None: all), in the uploads or in ``train_loss``, and ``train_loss`` at
    most ``factor`` x the first loss. Raises :class:`DivergenceError`; returns the (possibly new) first loss."""
    keys = keys or tuple(server)
    bad = [k for k in keys if server[k].is_floating_point() and not _all_finite(server[k])]
    bad += [f"upload:{k}" for k, v in uploads.items() if v.is_floating_point() and not _all_finite(v)]
    if bad or not math.isfinite(train_loss):
        raise DivergenceError(f"round {round_ + 1}: non-finite values in {bad or ['train loss']}; "
                              f"try a smaller learning rate. The last good checkpoint is kept.")
    if first_loss is None:
        return max(abs(train_loss), 1e-8)
    if train_loss > factor * first_loss:
        raise DivergenceError(f"round {round_ + 1}: train loss {train_loss:.4g} exploded (> "
                              f"{factor:g} x first loss {first_loss:.4g}); "
                              f"try a smaller learning rate. The last good checkpoint is kept.")
    return first_loss


def eval_due(done: int, cfg: "SimulationConfig") -> bool:
    """The evaluation cadence (shared by ``Simulation`` and the Flower server): after every ``cfg.eval_every``
    rounds and after the last one (``done`` rounds finished; round 0 is evaluated before the first)."""
    return done % cfg.eval_every == 0 or done == cfg.rounds


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


class Simulation:
    """Runs one algorithm on one problem for ``cfg.rounds`` rounds."""

    def __init__(self, problem, algorithm, cfg: SimulationConfig, seed: int, out_dir: str | Path | None = None,
                 callbacks: list[Callback] | None = None):
        self.problem = problem
        self.algo = algorithm
        self.cfg = cfg
        self.seed = seed
        self.rngs = RngStreams(seed)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.callbacks = list(callbacks or [])
        self.linear_kernel = cfg.linear_kernel
        algorithm.kernel = self.linear_kernel   # the algorithm's own compiled kernels (FPFC's pair update)
        self.use_executor(cfg.executor)
        self.vectorized_eval = problem.vmappable
        self.history: list[dict[str, Any]] = []
        self.round_times: list[float] = []
        self.ledger = CommLedger()
        self.start_round = 0
        self.round = 0   # rounds run by run_round / step so far (the next round's index)
        self._first_loss: float | None = None
        self._elapsed = 0.0
        self._t0 = time.perf_counter()
        self.per_client: list[dict[str, float]] = []
        x0 = problem.init_params(self.rngs.torch("init"))
        self.server, self.clients = algorithm.init(x0, self.rngs)

    # ------------------------------------------------------------ checkpoints
    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.out_dir is None else self.out_dir / "checkpoint.pt"

    def save_checkpoint(self, next_round: int) -> None:
        if self.checkpoint_path is None:
            return
        atomic_torch_save({
            "round": next_round, "seed": self.seed, "algorithm": self.algo.name,
            "server": self.server, "clients": self.clients.state_dict(), "ledger": self.ledger.state_dict(),
            "history": self.history, "round_times": self.round_times, "first_loss": self._first_loss,
            "elapsed": self._elapsed + time.perf_counter() - self._t0,
        }, self.checkpoint_path)

    def load_checkpoint(self, path: str | Path | None = None) -> None:
        path = Path(path) if path is not None else self.checkpoint_path
        if path is None or not path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {path}")
        ck = torch.load(path, weights_only=False)
        if ck["seed"] != self.seed or ck["algorithm"] != self.algo.name:
            raise ValueError(f"--resume: checkpoint is for algorithm={ck['algorithm']} seed={ck['seed']}, "
                             f"not {self.algo.name} seed={self.seed}")
        self.start_round = ck["round"]
        self.server = ck["server"]
        self.clients = ClientStates.from_state_dict(ck["clients"]) if ck["clients"] else ClientStates(
            self.problem.num_clients)
        self.ledger = CommLedger.from_state_dict(ck["ledger"])
        self.history = ck["history"]
        self.round_times = ck["round_times"]
        self._first_loss = ck["first_loss"]
        self._elapsed = ck["elapsed"]

    # ------------------------------------------------------------ evaluation
    def eval_params(self, round_: int | None = None) -> torch.Tensor:
        """Every client's scored parameters after ``round_`` rounds (default: the last evaluated round),
        including the algorithm's evaluation-time adaptation (``Algorithm.eval_work``)."""
        ids = torch.arange(self.problem.num_clients)
        msg = self.algo.eval_broadcast(self.server, ids)
        states = self.clients.state_dict()
        if self.vectorized_eval:
            params = torch.func.vmap(self.algo.eval_model)(states, msg)
        else:
            params = torch.stack([self.algo.eval_model({k: v[i] for k, v in states.items()},
                                                       {k: v[i] for k, v in msg.items()}) for i in range(ids.numel())])
        if round_ is None:
            round_ = self.history[-1]["round"] if self.history else 0
        executor = self.cfg.executor if self.cfg.executor in ("sequential", "vectorized") else "auto"
        return adapt_for_eval(self.algo, params, self.problem, self.rngs, round_, executor)

    def evaluate(self, round_: int, train_loss: float | None) -> dict[str, Any]:
        params = self.eval_params(round_)
        summary, per = evaluate(self.problem, params, self.vectorized_eval, tuple(self.cfg.metrics))
        self.per_client = per
        rec: dict[str, Any] = {"round": round_}
        if train_loss is not None:
            rec["train_loss"] = train_loss
        rec.update(summary)
        rec.update(self.algo.diagnostics(self.server, self.clients))
        extra_evals = getattr(self.algo, "extra_evals", None)   # optional: more models to score, {prefix: [m, d]}
        for prefix, other in (extra_evals(self.server, self.clients) if extra_evals else {}).items():
            s, _ = evaluate(self.problem, other, self.vectorized_eval, ())
            rec.update({prefix + k.removeprefix("test_"): v for k, v in s.items()
                        if k in ("test_accuracy", "test_loss", "test_rmse")})
        rec["uplink_bytes"] = self.ledger.uplink_bytes
        rec["downlink_bytes"] = self.ledger.downlink_bytes
        rec["time_s"] = self._elapsed + time.perf_counter() - self._t0
        return rec

    # ------------------------------------------------------------ checks
    def _check(self, round_: int, train_loss: float, uploads: dict[str, torch.Tensor]) -> None:
        self._first_loss = check_round(round_, train_loss, self.server, uploads, self.algo.finite_check_keys,
                                       self._first_loss, self.cfg.divergence_factor)

    # ------------------------------------------------------------ main loop
    def participants(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The sampled clients that take part in round ``t`` (hook: a deployment replay drops the
        clients whose uploads never arrived, treating them as not selected)."""
        return ids

    def run_round(self, t: int, ids: torch.Tensor | None = None) -> dict[str, Any]:
        """Communication round ``t`` with the clients ``ids`` (default: drawn by ``cfg.sampling``; a scheduler
        such as asyncFPFC's passes the clients whose uploads arrive)."""
        m = self.problem.num_clients
        data = self.problem.data
        if ids is None:
            ids = self.participants(t, sample_clients(self.cfg.sampling, m, data.weights,
                                                      self.rngs.numpy("sampling", t)))
        if ids.numel() == 0:
            return {"round": t, "clients": 0, "train_loss": float("nan"), "ids": ids}
        scale = None
        if self.cfg.work.variable == "uniform":
            g = self.rngs.numpy("work", t)
            scale = torch.as_tensor(g.uniform(self.cfg.work.min_fraction, 1.0, size=m))[ids]
        msgs = self.algo.broadcast(self.server, ids, t)
        plans = build_plans(self.algo.work(t), data.train_offsets, ids, self.rngs, t, scale, data.row_groups)
        rows = self.clients.gather(ids)
        new_rows, uploads, losses = self.executor.run(self.algo, rows, msgs, ids, plans, data, t)
        self.clients.scatter(ids, new_rows)
        self.server = self.algo.aggregate(self.server, ids, uploads, t)
        if self.algo.communicates:
            self.ledger.add_round(t, msgs, uploads)
        w = data.weights[ids].double()
        train_loss = float((losses.double() * w).sum() / w.sum())
        self._check(t, train_loss, uploads)
        self.round = t + 1
        return {"round": t, "clients": int(ids.numel()), "train_loss": train_loss, "ids": ids}

    # ------------------------------------------------------------ the API protocols drive a run with
    def step(self, ids: torch.Tensor | None = None) -> dict[str, Any]:
        """Run the next communication round (after the last one run, or ``start_round``) with the clients ``ids``
        (default: sampled), time it and tell the callbacks' ``on_round``; returns the round's info (``round``,
        ``clients``, ``train_loss``, ``ids``)."""
        t = max(self.round, self.start_round)
        t1 = time.perf_counter()
        with torch.enable_grad():
            info = self.run_round(t, ids)
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
            raise ValueError(f"set_state: {clients.num_clients} client rows, the problem has "
                             f"{self.problem.num_clients} clients")
        self.server, self.clients = server, clients

    def set_hparams(self, **changes: Any) -> None:
        """Change hyper-parameters of the algorithm's config for the next rounds (e.g. FPFC's ``lam`` along a
        path). The whole config is validated again and the algorithm's ``setup`` re-derives everything that
        depends on it, so no cached value of the old config survives."""
        algo = self.algo
        cfg = type(algo.cfg)(**{**algo.cfg.model_dump(), **changes})
        algo.cfg = cfg
        algo.setup()

    def use_executor(self, name: str) -> None:
        """Run the clients with executor ``name`` from the next round on (as ``SimulationConfig.executor``)."""
        c = self.cfg
        self.executor = make_executor(name, self.problem, c.chunk_size, self.linear_kernel, self.algo)

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds of this run so far (across resumes)."""
        return self._elapsed + time.perf_counter() - self._t0

    def run(self, resume: bool = False) -> RunResult:
        if resume:
            self.load_checkpoint()
        torch.set_grad_enabled(True)
        self._t0 = time.perf_counter()
        for cb in self.callbacks:
            cb.on_start(self)
        if self.start_round == 0 and not self.history:
            rec = self.evaluate(0, None)
            # the loss of the initial model is the reference for "exploding" (a blow-up in round 1 counts)
            if math.isfinite(rec.get("test_loss", float("nan"))):
                self._first_loss = max(abs(rec["test_loss"]), 1e-8)
            self.history.append(rec)
            for cb in self.callbacks:
                cb.on_eval(self, rec)
            self.save_checkpoint(0)  # the initial state is the first "last good" checkpoint
        last_loss = None
        for t in range(self.start_round, self.cfg.rounds):
            t1 = time.perf_counter()
            info = self.run_round(t)
            self.round_times.append(time.perf_counter() - t1)
            if math.isfinite(info["train_loss"]):
                last_loss = info["train_loss"]
            for cb in self.callbacks:
                cb.on_round(self, t, info)
            done = t + 1
            is_eval = eval_due(done, self.cfg)
            if is_eval:
                rec = self.evaluate(done, last_loss)
                tl = rec.get("test_loss", rec.get("test_rmse", 0.0))
                if not math.isfinite(tl):
                    raise DivergenceError(f"round {done}: the evaluated models give a non-finite test loss; try a "
                                          f"smaller learning rate. The last good checkpoint is kept.")
                self.history.append(rec)
                for cb in self.callbacks:
                    cb.on_eval(self, rec)
            ck_every = self.cfg.checkpoint_every
            if (ck_every and done % ck_every == 0) or (not ck_every and is_eval):
                self.save_checkpoint(done)
        wall = self._elapsed + time.perf_counter() - self._t0
        for cb in self.callbacks:
            cb.on_end(self)
        return RunResult(self.history, self.server, self.clients, self.ledger, wall, self.round_times,
                         self.algo.finalize(self.server, self.clients), self.per_client)


# ------------------------------------------------------------------ callbacks
class JsonlLogger:
    """Writes ``metrics.jsonl`` (one line per evaluated round), rewritten atomically."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        pass

    def on_eval(self, sim, record):
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in sim.history))

    def on_end(self, sim):
        pass


class ProgressBar:
    """tqdm bar with round, latest metrics and ETA."""

    def __init__(self, desc: str = "", keys: tuple[str, ...] = ("train_loss", "test_accuracy", "test_rmse"),
                 disable: bool | None = None, position: int | None = None):
        self.desc, self.keys, self.disable, self.position = desc, keys, disable, position
        self.bar = None

    def on_start(self, sim):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=sim.cfg.rounds, initial=sim.start_round, desc=self.desc, unit="rnd",
                        disable=self.disable, leave=False, position=self.position, dynamic_ncols=True)

    def on_round(self, sim, round_, info):
        if self.bar is not None:
            self.bar.update(1)

    def on_eval(self, sim, record):
        if self.bar is not None:
            self.bar.set_postfix({k: f"{record[k]:.4f}" for k in self.keys if k in record}, refresh=False)

    def on_end(self, sim):
        if self.bar is not None:
            self.bar.close()
