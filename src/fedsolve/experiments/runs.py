"""The runs of a compare or a grid suite, and the one place that runs them.

A :class:`Run` is one algorithm with one seed on one cell's experiment config, into its own run folder.
:func:`run_all` runs a list of them:

* on ``resume`` a finished run whose config agrees is kept as it is (:func:`kept`); the others continue from
  their checkpoints;
* runs that differ only in seed and scalar hyper-parameters of one algorithm on one model (:func:`sweep_key`)
  train together as one batch (:func:`fedsolve.experiments.runner.run_together`, ``engine/sweep.py``: clients x
  runs as rows of one kernel call per round, where the executor is the batched one), unless ``batch`` is off; a
  tuned algorithm's grid runs are batched the same way (:func:`fedsolve.experiments.runner.tune_spec`);
* ``jobs`` > 1 spreads the runs (a batch counts as one) over that many spawned worker processes of
  ``threads // jobs`` torch threads each; every run writes its own folder, as in one process.

The data of a (data section, seed) pair is built once and shared by the runs that need it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedsolve.engine.loop import DivergenceError, RunInterrupted
from fedsolve.experiments.config import AlgorithmSpec, ConfigError, ExperimentConfig
from fedsolve.experiments.runner import (
    build_data,
    build_problem,
    check_resume,
    default_threads,
    finished_summary,
    resolved_config,
    run_spec,
    run_together,
    set_threads,
)


@dataclass(frozen=True)
class Run:
    """One algorithm (``spec``) with one ``seed`` on the experiment ``cfg``, into ``run_dir``."""

    cfg: ExperimentConfig
    spec: AlgorithmSpec
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.spec.display} seed {self.seed}"


def kept(run: Run) -> dict | None:
    """On ``--resume``: the summary of a finished run to keep as it is (its round budget done, or its algorithm's
    stopping test passed), or None to (re)run or extend it. Its config must agree with this one
    (:func:`~fedsolve.experiments.runner.check_resume`; for a tuned spec, with the value it chose)."""
    cfg, spec, run_dir = run.cfg, run.spec, run.run_dir
    done = finished_summary(run_dir)
    if done is None:
        return None
    chosen = spec
    if spec.tune is not None:
        old = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
        params = ((old or {}).get("algorithm") or {}).get("params") or {}
        if spec.tune.param not in params:
            return None
        chosen = spec.with_param(spec.tune.param, params[spec.tune.param])
    check_resume(run_dir, resolved_config(cfg, chosen, run.seed))
    rounds = int(done.get("rounds") or 0)
    if rounds > cfg.simulation.rounds:
        raise ConfigError(
            f"--resume: simulation.rounds {cfg.simulation.rounds} is below the {rounds} rounds "
            f"{run_dir} has done; allowed: {rounds} or more"
        )
    return done if rounds == cfg.simulation.rounds or done.get("finished") else None


#: fields of a resolved run config that do not keep runs out of one batch: names and notes, where and how the
#: results are written (the runs of a batch share the process and its threads)
_COSMETIC = ("name", "description", "paper", "out_dir", "threads", "seeds")


def sweep_key(run: Run) -> str | None:
    """What runs that may train together as one batch share: the resolved config but the seed, the cosmetic
    fields and the values of the algorithm's numeric hyper-parameters (step sizes, rho, mu, lambda, local steps);
    None for a tuned run (its grid is batched inside its tuning)."""
    if run.spec.tune is not None:
        return None
    raw = resolved_config(run.cfg, run.spec, run.seed)
    for k in _COSMETIC:
        raw.pop(k, None)
    algo = dict(raw["algorithm"])
    algo.pop("label", None)
    algo["params"] = {
        k: "<number>" if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        for k, v in algo["params"].items()
    }
    raw["algorithm"] = algo
    return json.dumps(raw, sort_keys=True, default=str)


def batches_of(runs: Sequence[Run], batch: bool) -> list[list[Run]]:
    """``runs`` in groups: those with one :func:`sweep_key` together (in the order their first run appears), every
    other run alone; without ``batch`` every run alone."""
    if not batch:
        return [[r] for r in runs]
    groups: dict[Any, list[Run]] = {}
    for i, r in enumerate(runs):
        key = sweep_key(r)
        groups.setdefault(key if key is not None else ("alone", i), []).append(r)
    return list(groups.values())


class _DataCache:
    """The federated data of each (data section, seed) that the runs at hand need, built once."""

    def __init__(self):
        self._data: dict[tuple[str, int], Any] = {}

    @staticmethod
    def key(run: Run) -> tuple[str, int]:
        return run.cfg.data.model_dump_json(), run.seed

    def keep(self, runs: Sequence[Run]) -> None:
        """Forget the data no run of ``runs`` needs."""
        need = {self.key(r) for r in runs}
        for k in [k for k in self._data if k not in need]:
            del self._data[k]

    def problem(self, run: Run):
        k = self.key(run)
        if k not in self._data:
            self._data[k] = build_data(run.cfg, run.seed)
        return build_problem(run.cfg, run.seed, data=self._data[k])


def _duration(sec: float) -> str:
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.1f} min"


def run_all(
    runs: Sequence[Run],
    resume: bool = False,
    progress: bool = True,
    jobs: int = 1,
    track: Sequence[str] = (),
    batch: bool = True,
    stop_on_divergence: bool = False,
) -> dict[Path, dict]:
    """Run every run of ``runs`` that ``resume`` does not keep (module docstring); returns each run folder's
    summary. A diverged run is reported and its summary kept (``stop_on_divergence``: raised instead)."""
    t0 = time.perf_counter()
    summaries: dict[Path, dict] = {}
    todo = []
    for r in runs:
        done = kept(r) if resume else None
        if done is not None:
            summaries[r.run_dir] = done
        else:
            todo.append(r)
    n_total, n_kept = len(runs), len(summaries)

    def finished(r: Run, error: DivergenceError | None) -> None:
        if error is not None:
            if stop_on_divergence:
                raise error
            print(f"[fedsolve] {r.name} diverged: {error}")
        summaries[r.run_dir] = json.loads((r.run_dir / "summary.json").read_text())

    def eta() -> str:
        """Elapsed and remaining wall time of this call, from the runs finished so far."""
        el = time.perf_counter() - t0
        ran = len(summaries) - n_kept
        left = f", about {_duration(el / ran * (len(todo) - ran))} left" if ran and ran < len(todo) else ""
        return f"{_duration(el)} elapsed{left}"

    units = batches_of(todo, batch)
    if jobs == 1 or len(units) <= 1:
        _run_here(units, n_kept, n_total, resume, progress, track, batch, finished, eta)
    else:
        _run_in_workers(
            units,
            jobs,
            resume,
            finished,
            lambda: f"{len(summaries)} of {n_total} runs finished, {eta()}",
            track=track,
            batch=batch,
        )
    return summaries


def _run_here(
    units: list[list[Run]],
    n_kept: int,
    n_total: int,
    resume: bool,
    progress: bool,
    track: Sequence[str],
    batch: bool,
    finished: Callable,
    eta: Callable[[], str],
) -> None:
    """:func:`run_all`'s units in this process, one after another."""
    data = _DataCache()
    k = n_kept
    for unit in units:
        data.keep(unit)
        set_threads(unit[0].cfg.threads)
        first, k = k + 1, k + len(unit)
        if progress:
            what = (
                f"run {k} of {n_total}: {unit[0].name}"
                if len(unit) == 1
                else f"runs {first}-{k} of {n_total} as one batch: {', '.join(r.name for r in unit)}"
            )
            print(f"[fedsolve] {what} ({eta()})", file=sys.stderr, flush=True)
        if len(unit) > 1:
            outs = run_together(
                [(r.cfg, r.spec, r.seed, r.run_dir, data.problem(r)) for r in unit], resume=resume, track=track
            )
            for r, o in zip(unit, outs):
                finished(r, o if isinstance(o, DivergenceError) else None)
            continue
        r = unit[0]
        try:
            run_spec(
                r.cfg,
                r.spec,
                r.seed,
                r.run_dir,
                resume=resume,
                progress=progress,
                problem=data.problem(r),
                write_report=False,
                desc=f"run {k}/{n_total} {r.spec.display} s{r.seed}",
                track=track,
                overwrite=True,
                batch=batch,
            )
            error = None
        except DivergenceError as e:
            error = e
        except RunInterrupted as e:
            e.where = f"run {k} of {n_total} ({r.name})"  # type: ignore[attr-defined]  # read by the CLI's message
            raise
        finished(r, error)


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it stops the workers), so no worker prints a
    traceback of its own; and a worker whose parent is gone (killed with SIGKILL, so it could not stop its
    workers) ends within a second instead of computing on for nobody (its last checkpoint stays)."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="fedsolve-parent-watch", daemon=True).start()


def _run_in_workers(
    units: list[list[Run]],
    jobs: int,
    resume: bool,
    finished: Callable,
    status: Callable[[], str] = lambda: "",
    track: Sequence[str] = (),
    batch: bool = True,
) -> None:
    """:func:`run_all`'s units in ``jobs`` spawned processes; ``finished(run, error)`` is called here as each run
    ends. A worker imports the modules outside fedsolve that registered the algorithms it runs (``fedsolve
    --import``), so user algorithms run there too. On Ctrl-C the workers are stopped at once (each run's last
    checkpoint stays: writes are atomic) and ``KeyboardInterrupt`` is raised."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from fedsolve.families import get_algorithm

    modules = {get_algorithm(r.spec.name).__module__ for u in units for r in u}
    plugins = sorted(m for m in modules if not m.startswith("fedsolve.") and m != "__main__")

    def payload(r: Run) -> tuple:
        threads = max(1, (r.cfg.threads or default_threads()) // jobs)
        return (
            r.cfg.model_copy(update={"threads": threads}).model_dump(mode="json"),
            r.spec.display,
            r.seed,
            str(r.run_dir),
        )

    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(units)), mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_sigint
    )
    try:
        running = {pool.submit(_worker, [payload(r) for r in u], resume, plugins, list(track), batch): u for u in units}
        for f in as_completed(running):
            for r, message in zip(running[f], f.result()):
                t = json.loads((r.run_dir / "summary.json").read_text()).get("wall_time_s") or 0.0
                finished(r, DivergenceError(message) if message else None)
                print(f"[fedsolve] {r.name} {'diverged' if message else 'done'} ({t:.1f} s; {status()})", flush=True)
    except BaseException:
        for p in multiprocessing.active_children():  # the pool's workers: stop them now, not after their runs
            p.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


_worker_data: dict[str, Any] = {}


def _worker(unit: list[tuple], resume: bool, plugins: list[str], track: list[str], batch: bool) -> list[str | None]:
    """One unit of :func:`run_all` (a run, or the runs of one batch) in a worker process: per run None, or the
    divergence message."""
    import importlib

    for mod in plugins:
        importlib.import_module(mod)
    runs = []
    for dump, label, seed, run_dir in unit:
        cfg = ExperimentConfig.model_validate(dump)
        runs.append(Run(cfg, next(s for s in cfg.all_algorithms() if s.display == label), seed, Path(run_dir)))
    cache = _worker_data.setdefault("cache", _DataCache())  # a worker keeps the data of its last unit
    cache.keep(runs)
    set_threads(runs[0].cfg.threads)
    if len(runs) > 1:
        outs = run_together(
            [(r.cfg, r.spec, r.seed, r.run_dir, cache.problem(r)) for r in runs], resume=resume, track=track
        )
        return [str(o) if isinstance(o, DivergenceError) else None for o in outs]
    r = runs[0]
    try:
        run_spec(
            r.cfg,
            r.spec,
            r.seed,
            r.run_dir,
            resume=resume,
            progress=False,
            overwrite=True,  # checked
            problem=cache.problem(r),
            write_report=False,
            track=track,
            batch=batch,
        )
    except DivergenceError as e:
        return [str(e)]
    return [None]
