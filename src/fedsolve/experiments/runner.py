"""Run experiments; write run folders a person can read.

Run folder: ``config.yaml`` (fully resolved), ``metrics.jsonl`` (numbers only: byte-identical for two
identical runs), ``timings.jsonl``, ``summary.json``, ``per_client.json``, ``checkpoint.pt`` (atomic;
``--resume`` continues bit-identically), ``plots/*.png``, ``report.md``. :func:`run_one` makes one,
:func:`run_together` several runs of one sweep as one batch. Compare folders (one run folder per algorithm and
seed, their summary and report) are ``fedsolve.experiments.compare``'s.

Resuming (:func:`check_resume`) compares the resolved config with the one the run folder was started
with and refuses any difference that changes the numbers; only ``simulation.rounds`` may grow, and the
fields in :data:`RESUME_FREE` (names, notes, evaluation and checkpoint cadence, thread count) may change.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml

from fedsolve.engine.algorithm import finished as algorithm_finished, fitted_problem
from fedsolve.engine.buffers import with_buffers
from fedsolve.engine.io import atomic_write_text
from fedsolve.engine.loop import DivergenceError, JsonlLogger, ProgressBar, RunResult, Simulation
from fedsolve.engine.provenance import provenance
from fedsolve.engine.run_folder import RunFolder, read_marker
from fedsolve.engine.schedules import make_schedule
from fedsolve.engine.tracking import close_all, make_trackers
from fedsolve.engine.transport import Transport
from fedsolve.engine.wrappers import wrap
from fedsolve.experiments.config import AlgorithmSpec, ConfigError, ExperimentConfig, TuneSpec, merged_params
from fedsolve.experiments.folders import default_run_dir, read_jsonl, slug  # noqa: F401  (default_run_dir: cli)
from fedsolve.experiments.records import RESUME_FREE, RUN_FILES, check_run_folder, config_differences, read_json
from fedsolve.experiments.report import has_direction, lower_is_better, write_run_report
from fedsolve.experiments.tuning import grid_edge, widen_grid
from fedsolve.families import check_fits, get_algorithm
from fedsolve.problems import FederatedProblem

_slug, _read_jsonl = slug, read_jsonl  # older names


def default_threads() -> int:
    """The torch thread count of a run whose config sets no ``threads``: this machine's physical cores that the
    process may use (:func:`fedsolve.core.cpus.physical_cores`: hyper-threads, CPU affinity and a container's
    CPU quota taken into account), so a 32-core workstation gets 32."""
    from fedsolve.core.cpus import physical_cores

    return physical_cores()


def set_threads(n: int | None) -> None:
    """The process's torch thread count for a run (``threads``; default :func:`default_threads`). Called when
    a run starts, never on import. Many threads are safe next to other busy processes only with passive OpenMP
    waits: ``OMP_WAIT_POLICY=PASSIVE`` is set by the ``fedsolve`` command before torch loads; with the Python
    API set it in the environment yourself, see docs/getting-started.md."""
    n = n or default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


# ------------------------------------------------------------------ building
def build_data(cfg: ExperimentConfig, seed: int):
    """The federated data of ``cfg.data`` for ``seed``: a registry dataset (``data.dataset``) or what the
    function at ``data.target`` builds, partitioned and split (:func:`fedsolve.data.datasets.federate`); bad
    input is a :class:`ConfigError` naming the field."""
    from fedsolve.experiments.config import ConfigError

    d = cfg.data
    try:
        data = _build_federated(d, seed)
    except (ValueError, KeyError, IndexError) as e:
        raise ConfigError(_data_error(d, e)) from None
    except TypeError as e:  # a parameter a dataset, partitioner or transform does not take
        raise ConfigError(f"data: {e}; see `fedsolve list` and docs/config-reference.md for the parameters") from None
    empty = [
        (i, what)
        for what, sizes in (("training", data.train_sizes), ("test", data.test_sizes))
        for i in (sizes == 0).nonzero().flatten().tolist()
    ]
    if empty:
        i, what = empty[0]
        raise ConfigError(
            f"data.num_clients: {len(empty)} client(s) get no {what} sample (client {i} first; "
            f"{data.train_x.shape[0] + data.test_x.shape[0]} samples over {data.num_clients} "
            f"clients); allowed: fewer clients, a larger test_fraction or a partition that gives "
            f"every client samples"
        )
    if d.dtype != "float32":
        data = data.with_dtype(getattr(torch, d.dtype))
    return data


def _build_federated(d, seed: int):
    from fedsolve.data.datasets import build_federated, federate
    from fedsolve.data.imports import call_target, resolve_target
    from fedsolve.data.torch_data import as_source

    transform = None
    if d.sample_transform is not None:
        fn, kw = resolve_target(d.sample_transform.target, "data.sample_transform.target"), d.sample_transform.params
        transform = lambda x: fn(x, **kw)
    common = dict(
        partition=d.partition,
        partition_params=dict(d.partition_params),
        seed=seed,
        test_fraction=d.test_fraction,
        cluster_transform=d.cluster_transform,
        transform_params=dict(d.transform_params),
        sample_transform=transform,
    )
    if d.target is None:
        return build_federated(d.dataset, d.num_clients, dataset_params=dict(d.params), **common)
    fill = {"seed": seed, **({"num_clients": d.num_clients} if d.num_clients is not None else {})}
    built = call_target(resolve_target(d.target, "data.target"), dict(d.params), "data.target", d.target, fill)
    source = as_source(built, test_fraction=d.test_fraction, seed=seed, name=d.target)
    return federate(source, d.num_clients, dataset=d.target, **common)


def _data_error(d, e: Exception) -> str:
    """An error building ``d`` as one line naming the field: ``data.params.<key>`` for a parameter the message
    starts with, ``data.<field>`` for a field of the section, else ``data``."""
    msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    head = msg.split(":", 1)[0]
    if head.split(".")[0] in d.params:
        return f"data.params.{msg}"
    if head.startswith("data") or head.split(".")[0] in type(d).model_fields:
        return msg if head.startswith("data") else f"data.{msg}"
    return f"data: {msg}"


def model_factory(cfg: ExperimentConfig, data):
    from fedsolve.models import MODELS, build_model_fn

    out_dim = (
        data.num_classes if data.task == "classification" else (1 if data.train_y.dim() == 1 else data.train_y.shape[1])
    )
    dtype = getattr(torch, cfg.data.dtype)
    if cfg.model.target is not None:
        fn = _target_model_fn(cfg.model, data, out_dim)
        try:
            fn()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return fn if dtype == torch.float32 else (lambda: fn().to(dtype))
    if cfg.model.name in MODELS:
        fn = build_model_fn(cfg.model.name, data.input_shape, out_dim, **cfg.model.params)
    else:
        from fedsolve.models import multimodal

        assert cfg.model.name is not None, "the validator sets model.name when model.target is not given"
        fn = multimodal.build_model_fn(cfg.model.name, data.input_shape, out_dim, **cfg.model.params)
    try:
        fn()
    except TypeError as e:  # a parameter the model's constructor does not take
        import inspect

        cls = MODELS[cfg.model.name][0] if cfg.model.name in MODELS else None
        allowed = [p for p in inspect.signature(cls).parameters][2:] if cls is not None else "see its docstring"
        raise ConfigError(
            f"model.params: {cfg.model.name!r} does not take {sorted(cfg.model.params)} ({e}); allowed: {allowed}"
        ) from None
    except (ValueError, RuntimeError) as e:  # a value the constructor cannot build (e.g. a negative width)
        raise ConfigError(
            f"model.params: {cfg.model.name!r} cannot be built with {cfg.model.params} ({e}); "
            f"allowed: positive sizes as in `fedsolve list models`"
        ) from None
    return fn if dtype == torch.float32 else (lambda: fn().to(dtype))


def _target_model_fn(m, data, out_dim: int):
    """The factory of ``model.target``: the named function or class called with ``model.params``, plus
    ``input_shape``, ``out_dim`` and (classification) ``num_classes`` from the data where it takes them; what it
    returns must be a ``torch.nn.Module`` (else a ``ValueError`` naming ``model.target``)."""
    from torch import nn

    from fedsolve.data.imports import call_target, resolve_target

    factory = resolve_target(m.target, "model.target")
    fill = {
        "input_shape": tuple(data.input_shape),
        "out_dim": out_dim,
        **({"num_classes": data.num_classes} if data.task == "classification" else {}),
    }

    def build() -> nn.Module:
        model = call_target(factory, dict(m.params), "model.target", m.target, fill)
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"model.target: {m.target} returned a {type(model).__name__}, not a torch.nn.Module; "
                f"allowed: a function or class that returns an nn.Module"
            )
        return model

    return build


def build_problem(cfg: ExperimentConfig, seed: int, data=None, spec: AlgorithmSpec | None = None) -> FederatedProblem:
    """The problem of ``cfg`` at ``seed`` (on ``data`` where given); with ``spec``, the one its solver runs on (FedCP's
    clients run a network around the model: ``fitted_problem``)."""
    data = data if data is not None else build_data(cfg, seed)
    model_fn = model_factory(cfg, data)
    blocks = {k: list(v) for k, v in cfg.model.blocks.items()}
    loss = "cross_entropy" if data.task == "classification" else "squared_error"
    try:
        if cfg.model.personalization:
            from fedsolve.families.personalized.blocks import personal_patterns

            blocks["personal"] = personal_patterns(model_fn(), cfg.model.personalization)
        problem = FederatedProblem(
            data=data, model_fn=model_fn, loss=loss, blocks=blocks, name=cfg.name, buffers=cfg.model.buffers
        )
    except ValueError as e:  # an unknown personalization preset, a block pattern that matches nothing
        field = "model.personalization" if str(e).startswith("personalization") else "model.blocks"
        msg = str(e).removeprefix("personalization: ")
        hint = "" if "allowed" in msg else "; allowed: name patterns that match some of those parameters"
        raise ConfigError(f"{field}: {msg}{hint}") from None
    if cfg.problem is not None:
        from fedsolve.families import get_problem_kind

        try:
            problem = get_problem_kind(cfg.problem.kind)(problem, dict(cfg.problem.params), seed)
        except ValueError as e:  # a message that names its field (data..., problem...) keeps it
            msg = str(e)
            raise ConfigError(msg if msg.startswith(("data", "problem")) else f"problem.params: {msg}") from None
    return problem if spec is None else problem_for(spec, problem)


def problem_for(spec: AlgorithmSpec, problem: FederatedProblem) -> FederatedProblem:
    """The problem ``spec``'s solver runs on (``fitted_problem``: FedCP's network around the model; the same
    problem for every other solver, and for one already fitted)."""
    try:
        return fitted_problem(get_algorithm(spec.name), problem)
    except ValueError as e:  # e.g. a model without a final linear layer for FedCP's heads
        raise ConfigError(f"algorithms: {spec.name}: {str(e).removeprefix(spec.name + ': ')}") from None


def recorded_dataset(cfg: ExperimentConfig, problem: FederatedProblem) -> str:
    """The dataset a run's summary and report name: the config's ``data.dataset`` (or ``data.target``), or,
    where a problem kind built its own parties (the constrained kinds: ``np_adult``, ``fair_adult``,
    ``qp_d500_n10_m5``), the name of the data it built -- there the ``data`` section is a placeholder."""
    name = problem.data.name
    return name if cfg.problem is not None and name not in ("", "data") else cfg.data.label


def build_algorithm(cfg: ExperimentConfig, spec: AlgorithmSpec, problem: FederatedProblem):
    """The solver of ``spec`` on ``problem``, inside the wrappers ``spec.wrap`` names (``engine/wrappers.py``)."""
    cls = get_algorithm(spec.name)
    config = cls.Config(**merged_params(cls, cfg.defaults, spec.params))
    try:
        check_fits(cls, problem)
        algo = cls(config, problem)
    except ConfigError:
        raise
    except ValueError as e:  # the problem does not fit the solver, e.g. a family's solver with no problem: section
        msg = str(e)
        raise ConfigError(
            msg
            if msg.startswith(("data", "problem", "algorithm."))
            else f"algorithms: {spec.name}: {msg.removeprefix(spec.name + ': ')}"
        ) from None
    algo.sampling = cfg.simulation.sampling  # the run's client sampling: unbiased server weights depend on it
    try:
        algo = wrap(algo, spec.wrap)
    except ValueError as e:  # an unknown wrapper kind or a wrapper's bad setting: its message names the field
        raise ConfigError(f"algorithm.{e}") from None
    return with_buffers(algo)  # BatchNorm running statistics as state (engine/buffers.py)


def build_schedule(cfg: ExperimentConfig, spec: AlgorithmSpec, algo):
    """The schedule ``spec.schedule`` names for ``algo`` (``engine/schedules.py``); None: the configured rounds."""
    if spec.schedule is None:
        return None
    try:
        return make_schedule(spec.schedule, algo, cfg.simulation)
    except ValueError as e:  # its message names the field (schedule.<field>, or simulation.<field>)
        msg = str(e)
        raise ConfigError(f"algorithm.{msg}" if msg.startswith("schedule") else msg) from None


# ------------------------------------------------------------------ one run
def resolved_config(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int) -> dict[str, Any]:
    cls = get_algorithm(spec.name)
    algo_cfg = cls.Config(**merged_params(cls, cfg.defaults, spec.params))
    raw = cfg.model_dump(mode="json", exclude={"algorithms"})
    raw["algorithm"] = {"name": spec.name, "label": spec.display, "params": algo_cfg.model_dump(mode="json")}
    raw["algorithm"].update({k: v for k, v in (("wrap", spec.wrap), ("schedule", spec.schedule)) if v})
    raw["seeds"] = [seed]
    return raw


def best_metrics(history: list[dict[str, Any]]) -> dict[str, float]:
    keys = {
        k
        for r in history
        for k in r
        if isinstance(r.get(k), (int, float))
        and k not in ("round", "time_s")
        and not k.endswith("_bytes")
        and has_direction(k)
    }
    best: dict[str, float] = {}
    for k in sorted(keys):
        vals = [r[k] for r in history if k in r and r[k] == r[k]]
        if vals:
            best[k] = float(min(vals) if lower_is_better(k) else max(vals))
    return best


def write_summary(
    run_dir: Path,
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    res: RunResult | None,
    history: list[dict],
    status: str,
    message: str = "",
    wall: float = 0.0,
    round_times: list[float] | None = None,
    extras: dict | None = None,
    executor: str | None = None,
    dataset: str | None = None,
    finished: bool = False,
) -> dict[str, Any]:
    """``executor``: the executor that ran (``simulation.executor: auto`` resolved); ``dataset``: what the run
    used (:func:`recorded_dataset`; default the config's ``data.dataset``); ``finished``: the run is over
    before its budget, by the algorithm's stopping test (its phase table reached ``done``:
    :func:`fedsolve.engine.algorithm.finished`) or by its schedule (a spent budget, a virtual horizon)."""
    final = {k: v for k, v in (history[-1] if history else {}).items() if k not in ("round", "time_s")}
    ledger = res.ledger if res is not None else None
    summary = {
        "algorithm": spec.name,
        "label": spec.display,
        "dataset": dataset or cfg.data.label,
        "experiment": cfg.name,
        "seed": seed,
        "rounds": history[-1]["round"] if history else 0,
        "finished": finished,
        "status": status,
        "message": message,
        "metrics": {"final": final, "best": best_metrics(history)},
        "communication": {
            "uplink_bytes": ledger.uplink_bytes if ledger else final.get("uplink_bytes", 0),
            "downlink_bytes": ledger.downlink_bytes if ledger else final.get("downlink_bytes", 0),
        },
        "wall_time_s": wall,
        "round_time_s_median": statistics.median(round_times) if round_times else None,
        "executor": executor,
        "extras": extras or {},
        "provenance": provenance(run_device(cfg), resolved_config(cfg, spec, seed)),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=_json_default))
    return summary


def run_device(cfg: ExperimentConfig):
    """The device a run of ``cfg`` computes on (``simulation.device`` resolved as the simulation does)."""
    from fedsolve.engine.loop import resolve_device

    try:
        return resolve_device(cfg.simulation.device)
    except ValueError:
        return cfg.simulation.device


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def check_resume(run_dir: str | Path, new: dict[str, Any]) -> None:
    """Refuse to resume ``run_dir`` with resolved config ``new`` when ``config.yaml`` there differs in anything
    that changes the numbers (:func:`config_differences`), naming the fields."""
    f = Path(run_dir) / "config.yaml"
    if not f.exists():
        return
    try:
        old = yaml.safe_load(f.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(
            f"--resume: {f} is not valid YAML ({getattr(e, 'problem', None) or e}); start over with --overwrite"
        ) from None
    old = old if isinstance(old, dict) else {}
    try:  # the old config read by this fedsolve: fields added since then get their defaults, as in `new`
        from fedsolve.experiments.config import parse_config

        ocfg = parse_config(old)
        old = resolved_config(ocfg, ocfg.all_algorithms()[0], (old.get("seeds") or [0])[0])
    except Exception:  # noqa: BLE001  (a field removed since: compare the files as they are)
        pass
    diff = config_differences(old, new)
    if diff:
        raise ConfigError(
            f"--resume: the config differs from the one {run_dir} was started with in "
            f"{'; '.join(diff)}; resume allows only a larger simulation.rounds and changes to "
            f"{', '.join(RESUME_FREE)}; undo the change, or start over with --overwrite"
        )


class _Participation:
    """Counts the rounds in which no client took part (dropout can empty a round)."""

    def __init__(self):
        self.rounds = self.empty = 0

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        self.rounds += 1
        self.empty += int(info.get("clients", 1) == 0)

    def on_eval(self, sim, record):
        pass

    def on_end(self, sim):
        pass


def _check_sampling(cfg: ExperimentConfig, m: int) -> None:
    s = cfg.simulation.sampling
    k = getattr(s, "clients_per_round", None)
    if k is not None and k > m:
        raise ConfigError(
            f"simulation.sampling.clients_per_round: {k} exceeds the {m} clients of this problem; allowed: 1 to {m}"
        )


def run_one(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    problem: FederatedProblem | None = None,
    write_report: bool = True,
    extras: dict | None = None,
    desc: str | None = None,
    track: Sequence[str] = (),
    overwrite: bool = False,
    transport: Transport | None = None,
) -> dict:
    """Run one algorithm with one seed into ``run_dir``; returns the summary dict (``extras`` are added to
    its ``extras``). A spec with ``tune`` is tuned first (:func:`run_spec`). ``resume`` continues the
    checkpoint there after :func:`check_resume`; ``overwrite`` lets a fresh run replace the one the folder
    holds (refused otherwise, :func:`~fedsolve.experiments.records.check_run_folder`); ``desc`` names the
    progress bar; ``track`` names the tracking writers (``--track``,
    :func:`fedsolve.engine.tracking.make_trackers`); ``transport``: how the clients run (default in this process;
    rank 0's :class:`~fedsolve.engine.distributed.DistributedTransport` under ``--distributed``).

    The folder is locked while the run is live and its ``run.json`` says ``running`` until the run ends
    (:class:`~fedsolve.engine.run_folder.RunFolder`); when the run starts, the files of an earlier run there
    are removed (on ``--resume`` only its summary and report, rebuilt at the end)."""
    if spec.tune is not None:
        return run_spec(
            cfg,
            spec,
            seed,
            run_dir,
            resume=resume,
            progress=progress,
            problem=problem,
            write_report=write_report,
            track=track,
            overwrite=overwrite,
        )
    run_dir = Path(run_dir)
    existed = run_dir.is_dir()
    with RunFolder(run_dir, "run") as folder:
        check_run_folder(run_dir, resume, overwrite)
        marker = read_marker(run_dir)
        started = marker is not None and marker.get("status") in ("running", "interrupted", "failed")
        empty = existed and not any(f for f in run_dir.iterdir() if not f.name.startswith("."))  # (lock aside)
        if resume and not (run_dir / "checkpoint.pt").exists() and (started or empty):
            # stopped before its first checkpoint (a full disk at its first write, Ctrl-C in round 0), or left an
            # empty folder: nothing trained to keep, so the run starts over there, with the config it started with
            check_resume(run_dir, resolved_config(cfg, spec, seed))
            resume = False
        plots = tuple(f"plots/{f.name}" for f in (run_dir / "plots").glob("*.png"))
        old = (
            ("summary.json", "report.md", *plots)
            if resume
            else tuple(f for f in RUN_FILES if f not in ("config.yaml", "run.json")) + plots
        )
        start = folder.starter(resolved_config(cfg, spec, seed), remove=old)
        try:
            summary = _run_one(
                cfg, spec, seed, run_dir, resume, progress, problem, write_report, extras, desc, track, start, transport
            )
        except DivergenceError as e:
            folder.finish("diverged", str(e))
            raise
        folder.finish(summary["status"])
        return summary


def _run_one(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    run_dir: Path,
    resume: bool,
    progress: bool,
    problem: FederatedProblem | None,
    write_report: bool,
    extras: dict | None,
    desc: str | None,
    track: Sequence[str],
    start,
    transport: Transport | None = None,
) -> dict:
    """:func:`run_one` in its locked folder; ``start``: the callback that marks the run started."""
    run = _prepare(
        cfg, spec, seed, run_dir, resume, progress, problem, write_report, extras, desc, track, start, transport
    )
    return _conclude(run, run.sim.run)


@dataclass
class _Prepared:
    """A run built in its locked folder, its resolved config written (:func:`_prepare`); :func:`_conclude` runs
    it (or takes its outcome) and writes its summary."""

    cfg: ExperimentConfig
    spec: AlgorithmSpec
    seed: int
    run_dir: Path
    problem: FederatedProblem
    algo: Any
    sim: Simulation
    watch: _Participation
    trackers: list
    write_report: bool
    extras: dict | None


def _prepare(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    run_dir: Path,
    resume: bool,
    progress: bool,
    problem: FederatedProblem | None,
    write_report: bool,
    extras: dict | None,
    desc: str | None,
    track: Sequence[str],
    start,
    transport: Transport | None = None,
) -> _Prepared:
    """The simulation of one run, built (resumed from its checkpoint with ``resume``), its config written."""
    set_threads(cfg.threads)
    run_dir = Path(run_dir)
    resolved = resolved_config(cfg, spec, seed)
    if resume:
        check_resume(run_dir, resolved)
    problem = problem_for(spec, problem) if problem is not None else build_problem(cfg, seed, spec=spec)
    _check_sampling(cfg, problem.num_clients)
    algo = build_algorithm(cfg, spec, problem)
    watch = _Participation()
    schedule = build_schedule(cfg, spec, algo)
    trackers = make_trackers(track, run_dir, f"{cfg.name}/{spec.display}/seed{seed}", resolved, cfg.name)
    try:
        sim = Simulation(
            problem,
            algo,
            cfg.simulation,
            seed,
            out_dir=run_dir,
            callbacks=[
                start,
                JsonlLogger(run_dir / "metrics.jsonl"),
                watch,
                ProgressBar(desc or f"{spec.display} s{seed}", disable=not progress),
                *trackers,
            ],
            transport=transport,
            schedule=schedule,
        )
    except ValueError as e:  # e.g. an executor that cannot run this model or algorithm, NaN in the data
        msg = str(e)
        raise ConfigError(
            msg if msg.startswith(("simulation.", "data", "problem", "model")) else f"simulation.{msg}"
        ) from None
    if resume:
        sim.load_checkpoint()
        if sim.start_round > cfg.simulation.rounds:
            raise ConfigError(
                f"--resume: simulation.rounds {cfg.simulation.rounds} is below the {sim.start_round} "
                f"rounds {run_dir} has done; allowed: {sim.start_round} or more"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
    return _Prepared(cfg, spec, seed, run_dir, problem, algo, sim, watch, trackers, write_report, extras)


def _conclude(p: _Prepared, run: Callable[[], RunResult]) -> dict:
    """Run ``p`` (``run()``: its simulation's run, or the outcome a sweep gave it) and write its summary,
    ``per_client.json`` and report; a divergence is written as such and raised."""
    cfg, spec, seed, run_dir, sim = p.cfg, p.spec, p.seed, p.run_dir, p.sim
    t0 = time.perf_counter()
    executor = None if sim.executor is None else sim.executor.name  # None: the clients ran elsewhere
    try:
        res = run()
    except DivergenceError as e:
        summary = write_summary(
            run_dir,
            cfg,
            spec,
            seed,
            None,
            sim.history,
            "diverged",
            str(e),
            wall=time.perf_counter() - t0,
            round_times=sim.round_times,
            executor=executor,
            dataset=recorded_dataset(cfg, p.problem),
        )
        if p.write_report:
            write_run_report(run_dir, summary, sim.history)
        raise
    finally:
        close_all(p.trackers)  # after a divergence too, which ends the run without on_end
    _participation_verdict(cfg, p.watch)
    # finished: the algorithm's stopping test passed, or the run ended before its rounds without an error (its
    # schedule stopped it: a spent budget, a virtual horizon), so a resume keeps it as it is
    early = bool(res.history) and res.history[-1]["round"] < cfg.simulation.rounds
    extras = {**res.extras, **(p.extras or {})}
    summary = write_summary(
        run_dir,
        cfg,
        spec,
        seed,
        res,
        res.history,
        "completed",
        solver_status(extras),
        wall=res.wall_time_s,
        round_times=res.round_times,
        extras=extras,
        executor=executor,
        dataset=recorded_dataset(cfg, p.problem),
        finished=algorithm_finished(p.algo, sim.server) or early,
    )
    if res.per_client or not (run_dir / "per_client.json").exists():
        atomic_write_text(run_dir / "per_client.json", json.dumps(res.per_client))
    if p.write_report:
        write_run_report(run_dir, summary, res.history)
    return summary


def solver_status(extras: dict[str, Any]) -> str:
    """The solver's own verdict on its run where its final record gives one (e.g. Prox-AL FL's ``did not converge:
    ...`` or ``converged (Eq. 11 passed)``, from its certificate), else ``""``: the summary's ``message``, shown
    by ``fedsolve run`` and in report.md, so a run that ended without doing what its solver promises says so."""
    return "; ".join(str(v["status"]) for v in extras.values() if isinstance(v, dict) and v.get("status"))


def run_together(
    runs: Sequence[tuple[ExperimentConfig, AlgorithmSpec, int, Path, FederatedProblem | None]],
    resume: bool = False,
    write_report: bool = False,
    overwrite: bool = True,
    track: Sequence[str] = (),
) -> list[dict | DivergenceError]:
    """Several runs ``(cfg, spec, seed, run_dir, problem)`` of one sweep (they differ in seed and scalar
    hyper-parameters), each into its own locked run folder as :func:`run_one` writes it. Where every run's
    executor is the batched one they train as one batch (:func:`fedsolve.engine.sweep.run_sweep`: clients x runs
    as rows of one kernel call per round, each run's numbers its separate run's up to float round-off), else one
    after another. ``resume`` continues each run from its folder's checkpoint where there is one; ``overwrite``
    lets a run start over in a folder that holds one (:func:`run_one`); ``track``: every run's tracking writers.
    Returns each run's summary, or the :class:`DivergenceError` that ended it (its folder marked diverged)."""
    from contextlib import ExitStack

    from fedsolve.engine.sweep import SweepTransport, batches, run_sweep

    with ExitStack() as stack:
        prepared, folders = [], []
        for cfg, spec, seed, run_dir, problem in runs:
            run_dir = Path(run_dir)
            folder = stack.enter_context(RunFolder(run_dir, "run"))
            again = resume and (run_dir / "checkpoint.pt").exists()
            check_run_folder(run_dir, again, overwrite)
            plots = tuple(f"plots/{f.name}" for f in (run_dir / "plots").glob("*.png"))
            old = (
                ("summary.json", "report.md", *plots)
                if again
                else tuple(f for f in RUN_FILES if f not in ("config.yaml", "run.json")) + plots
            )
            start = folder.starter(resolved_config(cfg, spec, seed), remove=old)
            prepared.append(
                _prepare(cfg, spec, seed, run_dir, again, False, problem, write_report, None, None, track, start)
            )
            folders.append(folder)
        sims = [p.sim for p in prepared]
        if len(sims) > 1 and all(batches(s) for s in sims):
            shared = SweepTransport()
            for s in sims:
                s.transport = shared  # built in-process; the sweep's shared transport runs their rounds
            outcomes = run_sweep(sims)
        else:
            outcomes = []
            for s in sims:
                try:
                    outcomes.append(s.run())
                except DivergenceError as e:
                    outcomes.append(e)
        out: list[dict | DivergenceError] = []
        failed: BaseException | None = None
        for p, folder, outcome in zip(prepared, folders, outcomes):
            try:
                summary = _conclude(p, partial(_given, outcome))
            except DivergenceError as e:
                folder.finish("diverged", str(e))
                out.append(e)
                continue
            except Exception as e:  # noqa: BLE001  (the others are written first, then it is raised)
                folder.finish("failed", f"{type(e).__name__}: {e}"[:300])
                failed = failed or e
                continue
            folder.finish(summary["status"])
            out.append(summary)
        if failed is not None:
            raise failed
        return out


def _given(outcome):
    """A sweep run's outcome as its own run would end: its result, or its exception raised."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _participation_verdict(cfg: ExperimentConfig, watch: _Participation) -> None:
    """Fail when no round trained anyone (dropout emptied every round); warn when some rounds were empty."""
    if not watch.empty:
        return
    d = getattr(cfg.simulation.sampling, "dropout", 0.0)
    if watch.empty == watch.rounds:
        raise ConfigError(
            f"simulation.sampling.dropout: no client took part in any of the {watch.rounds} rounds "
            f"(dropout {d}); allowed: a dropout that leaves participants in some rounds"
        )
    import sys

    print(
        f"warning: {watch.empty} of {watch.rounds} rounds had no participant (simulation.sampling.dropout "
        f"{d}); those rounds changed nothing",
        file=sys.stderr,
    )


def run_config(
    config: Any,
    algorithm: str | None = None,
    seed: int | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    progress: bool = False,
    callbacks: Sequence = (),
    overwrite: bool = False,
) -> RunResult:
    """Run one algorithm of a config in this process and return the :class:`RunResult` (``fedsolve.run``).

    ``config``: a YAML path, a mapping or an :class:`ExperimentConfig`; ``overrides``: ``--set`` strings;
    ``algorithm``: label or name (needed when the config lists several); ``seed``: default the first seed;
    ``out``: write ``config.yaml``, ``metrics.jsonl``, ``timings.jsonl`` and checkpoints there (default: nothing
    is written; the folder is locked and marked as :func:`run_one` does it, and one that holds a run is refused
    unless ``overwrite``); ``callbacks``: more :class:`~fedsolve.engine.loop.Callback` objects, called after the
    progress bar and logger. ``result.history`` is the trajectory, ``result.eval_params()`` the models the
    clients are scored with. Bad arguments are a ``ConfigError`` (a ValueError) naming the argument."""
    cfg, spec, seed = _api_run(config, algorithm, seed, overrides, callbacks)
    set_threads(cfg.threads)
    problem = build_problem(cfg, seed, spec=spec)
    _check_sampling(cfg, problem.num_clients)
    algo = build_algorithm(cfg, spec, problem)
    schedule = build_schedule(cfg, spec, algo)
    own: list = [ProgressBar(f"{spec.display} s{seed}", disable=not progress)]
    if out is None:
        return Simulation(problem, algo, cfg.simulation, seed, callbacks=[*own, *callbacks], schedule=schedule).run()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"out: {out} is a file; allowed: a folder (new, or one that holds a run of this config with overwrite=True)"
        )
    with RunFolder(out, "run") as folder:
        check_run_folder(out, resume=False, overwrite=overwrite)
        resolved = resolved_config(cfg, spec, seed)
        start = folder.starter(resolved, remove=tuple(f for f in RUN_FILES if f not in ("run.json", "config.yaml")))
        sim = Simulation(
            problem,
            algo,
            cfg.simulation,
            seed,
            out_dir=out,
            callbacks=[start, *own, JsonlLogger(out / "metrics.jsonl"), *callbacks],
            schedule=schedule,
        )
        atomic_write_text(out / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        res = sim.run()
        folder.finish("completed")
        return res


def _api_run(
    config: Any, algorithm: Any, seed: Any, overrides: Any, callbacks: Sequence = ()
) -> tuple[ExperimentConfig, AlgorithmSpec, int]:
    """:func:`run_config`'s arguments checked and read: (config, the algorithm's spec, the seed)."""
    from fedsolve.experiments.config import apply_overrides, load_config, parse_config

    if not isinstance(config, (ExperimentConfig, dict, str, os.PathLike)):
        raise ConfigError(
            f"config: expected a YAML path, a mapping or an ExperimentConfig, got "
            f"{type(config).__name__} {config!r:.60}"
        )
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides: expected a list of 'key=value' strings (as --set takes), got {overrides!r:.80}")
    if algorithm is not None and not isinstance(algorithm, str):
        raise ConfigError(f"algorithm: expected a label or name (a string), got {algorithm!r:.60}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"seed: expected a non-negative integer, got {seed!r:.60}")
    hooks = ("on_start", "on_round", "on_eval", "on_end")
    for i, cb in enumerate(callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]):
        if not all(callable(getattr(cb, h, None)) for h in hooks):
            raise ConfigError(
                f"callbacks[{i}]: {cb!r:.60} is not a Callback; allowed: objects with the methods "
                f"{', '.join(hooks)} (fedsolve.Callback)"
            )
    if isinstance(config, ExperimentConfig):
        cfg = parse_config(apply_overrides(config.model_dump(mode="json"), list(overrides))) if overrides else config
    elif isinstance(config, dict):
        cfg = parse_config(apply_overrides(config, list(overrides)))
    else:
        cfg = load_config(os.fspath(config), list(overrides))
    specs = cfg.all_algorithms()
    if algorithm is None:
        if len(specs) != 1:
            raise ConfigError(f"algorithm: the config lists several {[a.display for a in specs]}; pick one")
        spec = specs[0]
    else:
        match = [a for a in specs if algorithm in (a.display, a.name)]
        if not match:
            raise ConfigError(f"algorithm: {algorithm!r} is not in the config; allowed: {[a.display for a in specs]}")
        spec = match[0]
    if spec.tune is not None:
        raise ConfigError(f"algorithm {spec.display!r}: `tune` runs through run_one / `fedsolve compare`")
    return cfg, spec, cfg.seeds[0] if seed is None else seed


# ------------------------------------------------------------------ tuning on validation
def finished_summary(run_dir: Path) -> dict | None:
    """The summary of the completed run in ``run_dir``, or None (no run, or one that did not complete)."""
    f = run_dir / "summary.json"
    if f.exists():
        done = read_json(f)
        if done.get("status") == "completed":
            return done
    return None


def _grid_runs(
    tcfg: ExperimentConfig,
    spec: AlgorithmSpec,
    t: TuneSpec,
    seed: int,
    val_data,
    folders: list[Path],
    todo: list[int],
    resume: bool,
    progress: bool,
    overwrite: bool,
    batch: bool,
) -> dict[int, dict]:
    """The summaries of the tuning runs ``todo`` (indices into ``t.grid``), each in its folder, trained on
    ``val_data``'s training part (a run that diverges scores nothing)."""
    param, grid = t.param, t.grid
    summaries: dict[int, dict] = {}
    diverged: dict[str, Any] = {"status": "diverged", "metrics": {"final": {}}}
    if batch and len(todo) > 1:
        outs = run_together(
            [
                (tcfg, spec.with_param(param, grid[i]), seed, folders[i], build_problem(tcfg, seed, data=val_data))
                for i in todo
            ],
            resume=resume,
            overwrite=overwrite or resume,
        )
        for i, o in zip(todo, outs):
            if isinstance(o, DivergenceError):
                print(f"[fedsolve] tuning {spec.display} {param}={grid[i]} seed {seed} diverged: {o}")
            summaries[i] = o if isinstance(o, dict) else diverged
    for i in todo if not (batch and len(todo) > 1) else ():
        rd = folders[i]
        try:
            summaries[i] = run_one(
                tcfg,
                spec.with_param(param, grid[i]),
                seed,
                rd,
                progress=progress,
                resume=resume and (rd / "checkpoint.pt").exists(),
                overwrite=overwrite or resume,
                problem=build_problem(tcfg, seed, data=val_data),
                write_report=False,
            )
        except DivergenceError as e:
            print(f"[fedsolve] tuning {spec.display} {param}={grid[i]} seed {seed} diverged: {e}")
            summaries[i] = diverged
    return summaries


def tune_spec(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    data,
    tune_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    batch: bool = False,
) -> tuple[AlgorithmSpec, dict[str, Any]]:
    """Choose ``spec.tune.param`` from its grid on validation data (:class:`TuneSpec`).

    One run per grid value in ``tune_dir/<param>=<value>`` on ``data.split_validation``; the value with the
    best final validation metric wins (ties and order: the first tried). Runs that diverge score nothing. With
    ``tune.widen`` = k, a pick at the grid's smallest or largest value tunes again on as many new values beyond it
    (:func:`fedsolve.experiments.tuning.widen_grid`; values the algorithm's config refuses are left out), up to k
    times, and the pick is the best of every value tried. Returns the spec with the chosen value (and no ``tune``)
    and a record of the choice: every value tried in increasing order (``grid``) with its ``scores``, the value,
    ``widened`` (the passes made, with ``widen``) and ``edge`` (:func:`grid_edge`: ``lowest``/``highest`` when the
    pick is still the smallest or largest value tried, so nothing tried brackets it; else null).
    ``resume`` keeps finished tuning runs and continues the others; with it or ``overwrite`` a tuning run
    without a checkpoint starts over in its folder. ``batch``: the missing grid runs train together as one
    sweep (:func:`run_together`) where their executor batches.
    """
    t = spec.tune
    if t is None:
        raise ValueError(f"{spec.display}: nothing to tune (the algorithm has no tune: section)")
    metric = t.metric or ("test_accuracy" if data.task == "classification" else "test_rmse")
    try:
        val_data = data.split_validation(t.val_fraction, seed)
    except ValueError as e:  # e.g. domain data without labelled target validation images
        raise ConfigError(f"algorithm.{e}" if str(e).startswith("tune") else f"algorithm.tune: {e}") from None
    rounds = cfg.simulation.rounds if t.rounds is None else min(t.rounds, cfg.simulation.rounds)
    tcfg = cfg.model_copy(update={"simulation": cfg.simulation.model_copy(update={"rounds": rounds})})
    tried: list[Any] = []  # every value run, in the order tried
    scores: list[float | None] = []
    wall, passes, grid = 0.0, 0, list(t.grid)
    sign = 1.0 if lower_is_better(metric) else -1.0
    while True:
        try:
            summaries = _tuning_pass(tcfg, spec, t, grid, seed, val_data, tune_dir, resume, progress, overwrite, batch)
        except ConfigError as e:  # the tuning rounds do not fit the schedule (e.g. a local budget): name tune.rounds
            if rounds == cfg.simulation.rounds or not str(e).startswith("simulation.rounds: "):
                raise
            why = str(e).removeprefix("simulation.rounds: ").split("; allowed")[0]
            raise ConfigError(
                f"algorithm.tune.rounds: {t.rounds} tuning rounds do not fit algorithm.schedule ({why}); "
                f"allowed: null (the tuning runs as long as the run)"
            ) from None
        for v, summary in zip(grid, summaries):
            tried.append(v)
            scores.append(_validation_score(spec, summary, metric))
            wall += summary.get("wall_time_s") or 0.0
        scored = {i: sc for i, sc in enumerate(scores) if sc is not None}
        if not scored:
            raise DivergenceError(
                f"{spec.display} seed {seed}: no tuning run of {t.param} over {tried} gave a "
                f"validation {metric} (every run diverged); "
                f"the tuning runs are in {tune_dir}"
            )
        best = min(scored, key=lambda i: (sign * scored[i], i))
        edge = grid_edge(tried, best)
        if passes >= t.widen or edge not in ("lowest", "highest"):
            break
        grid = [v for v in widen_grid(tried, edge, len(t.grid)) if _allowed(spec, cfg, t.param, v)]
        if not grid:  # zero or the parameter's own bound: nothing lies beyond this edge
            break
        passes += 1
    order = sorted(range(len(tried)), key=lambda i: tried[i]) if t.widen else list(range(len(tried)))
    info = {
        "param": t.param,
        "value": tried[best],
        "metric": metric,
        "grid": [tried[i] for i in order],
        "scores": [scores[i] for i in order],
        "val_fraction": t.val_fraction,
        "rounds": tcfg.simulation.rounds,
        "wall_time_s": wall,
        "edge": edge,
    }
    if t.widen:
        info["widened"] = passes
    return spec.with_param(t.param, tried[best]), info


def _tuning_pass(tcfg, spec, t, grid, seed, val_data, tune_dir, resume, progress, overwrite, batch) -> list[dict]:
    """The summaries of the tuning runs of ``grid``'s values, in order (finished ones kept with ``resume``)."""
    folders = [Path(tune_dir) / _slug(f"{t.param}={v}") for v in grid]
    summaries = {i: d for i, d in enumerate(map(finished_summary, folders)) if resume and d is not None}
    todo = [i for i in range(len(grid)) if i not in summaries]
    summaries.update(
        _grid_runs(
            tcfg,
            spec,
            t.model_copy(update={"grid": grid}),
            seed,
            val_data,
            folders,
            todo,
            resume=resume,
            progress=progress,
            overwrite=overwrite,
            batch=batch,
        )
    )
    return [summaries[i] for i in range(len(grid))]


def _validation_score(spec: AlgorithmSpec, summary: dict, metric: str) -> float | None:
    """A tuning run's validation ``metric`` (None for a run that diverged or scored NaN)."""
    final = summary["metrics"]["final"]
    if summary.get("status") == "completed" and metric not in final:
        raise ConfigError(
            f"algorithm {spec.name!r} tune.metric: {metric!r} is not reported by this run; "
            f"allowed: {sorted(k for k, x in final.items() if isinstance(x, (int, float)))}"
        )
    val = final.get(metric) if summary.get("status") == "completed" else None
    return float(val) if isinstance(val, (int, float)) and val == val else None


def _allowed(spec: AlgorithmSpec, cfg: ExperimentConfig, param: str, value: Any) -> bool:
    """Whether the algorithm's config takes ``param = value`` (a widened value beyond a bound is left out)."""
    cls = get_algorithm(spec.name)
    try:
        cls.Config(**{**merged_params(cls, cfg.defaults, spec.params), param: value})
    except ValueError:  # pydantic's ValidationError is a ValueError
        return False
    return True


def run_spec(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    problem: FederatedProblem | None = None,
    write_report: bool = True,
    desc: str | None = None,
    track: Sequence[str] = (),
    overwrite: bool = False,
    batch: bool = False,
) -> dict:
    """:func:`run_one`, after choosing the tuned hyper-parameter on validation (``run_dir/tune``) when
    ``spec.tune`` is set; the choice is recorded in the summary's ``extras["tuned"]``. ``track``: the tracking
    writers of the final run (the tuning runs have none); ``resume`` continues a checkpoint where there is one,
    ``overwrite`` lets a run start over in a folder that holds one; ``batch``: the tuning grid's runs train as one
    sweep where they can (:func:`tune_spec`)."""
    if spec.tune is None:
        return run_one(
            cfg,
            spec,
            seed,
            run_dir,
            resume=resume and (Path(run_dir) / "checkpoint.pt").exists(),
            progress=progress,
            problem=problem,
            write_report=write_report,
            desc=desc,
            track=track,
            overwrite=overwrite,
        )
    problem = problem if problem is not None else build_problem(cfg, seed)
    run_dir = Path(run_dir)
    try:
        chosen, info = tune_spec(
            cfg,
            spec,
            seed,
            problem.data,
            run_dir / "tune",
            resume=resume,
            progress=progress,
            overwrite=overwrite,
            batch=batch,
        )
    except DivergenceError as e:
        write_summary(run_dir, cfg, spec, seed, None, [], "diverged", str(e), dataset=recorded_dataset(cfg, problem))
        raise
    return run_one(
        cfg,
        chosen,
        seed,
        run_dir,
        resume=resume and (run_dir / "checkpoint.pt").exists(),
        progress=progress,
        problem=problem,
        write_report=write_report,
        extras={"tuned": info},
        desc=desc,
        track=track,
        overwrite=overwrite,
    )
