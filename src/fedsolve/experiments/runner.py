"""Run and compare experiments; write run folders a person can read.

Run folder: ``config.yaml`` (fully resolved), ``metrics.jsonl``, ``summary.json``,
``checkpoint.pt`` (atomic; ``--resume`` continues bit-identically), ``plots/*.png``, ``report.md``.
Compare folder: one run folder per algorithm and seed, plus a ``summary.json`` with each
metric's mean and std over seeds and a ``report.md`` with the table and plots.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from fedsolve.algorithms import get_algorithm
from fedsolve.experiments.config import AlgorithmSpec, ExperimentConfig, merged_params
from fedsolve.problems import FederatedProblem
from fedsolve.simulation.loop import (DivergenceError, JsonlLogger, ProgressBar, RunResult, Simulation,
                                      atomic_write_text)

LOWER_IS_BETTER = ("loss", "rmse", "deviation", "residual", "time", "bytes")


# metrics with no better direction: a cluster count is good when it is the true one, which a run does not
# know, so it has no "best" over rounds and is never marked best in a report
NO_DIRECTION = frozenset({"num_clusters"})


def has_direction(metric: str) -> bool:
    return metric not in NO_DIRECTION


def lower_is_better(metric: str) -> bool:
    """Loss-like metrics, spreads (``_std``), costs: lower is better; accuracy-like: higher."""
    return metric.endswith("_std") or any(k in metric for k in LOWER_IS_BETTER)


def set_threads(n: int | None) -> None:
    n = n or min(2, os.cpu_count() or 1)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


# ------------------------------------------------------------------ building
def build_data(cfg: ExperimentConfig, seed: int):
    from fedsolve.data.datasets import build_federated

    from fedsolve.experiments.config import ConfigError

    d = cfg.data
    try:
        return _build_federated(build_federated, d, seed)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"data: {e}") from None


def _build_federated(build_federated, d, seed: int):
    return build_federated(d.dataset, num_clients=d.num_clients, partition=d.partition,
                           partition_params=dict(d.partition_params), seed=seed, test_fraction=d.test_fraction,
                           dataset_params=dict(d.params), cluster_transform=d.cluster_transform,
                           transform_params=dict(d.transform_params))


def model_factory(cfg: ExperimentConfig, data):
    from fedsolve.models import MODELS, build_model_fn

    out_dim = data.num_classes if data.task == "classification" else (
        1 if data.train_y.dim() == 1 else data.train_y.shape[1])
    if cfg.model.name in MODELS:
        return build_model_fn(cfg.model.name, data.input_shape, out_dim, **cfg.model.params)
    from fedsolve.models import multimodal

    return multimodal.build_model_fn(cfg.model.name, data.input_shape, out_dim, **cfg.model.params)


def build_problem(cfg: ExperimentConfig, seed: int, data=None) -> FederatedProblem:
    data = data if data is not None else build_data(cfg, seed)
    model_fn = model_factory(cfg, data)
    blocks = {k: list(v) for k, v in cfg.model.blocks.items()}
    if cfg.model.personalization:
        from fedsolve.personalization import personal_patterns

        blocks["personal"] = personal_patterns(model_fn(), cfg.model.personalization)
    loss = "cross_entropy" if data.task == "classification" else "squared_error"
    problem = FederatedProblem(data=data, model_fn=model_fn, loss=loss, blocks=blocks, name=cfg.name)
    if cfg.problem is not None:
        from fedsolve.experiments.config import ConfigError
        from fedsolve.problems import get_problem_kind

        try:
            problem = get_problem_kind(cfg.problem.kind)(problem, dict(cfg.problem.params), seed)
        except ValueError as e:
            raise ConfigError(f"problem.params: {e}") from None
    return problem


def build_algorithm(cfg: ExperimentConfig, spec: AlgorithmSpec, problem: FederatedProblem):
    cls = get_algorithm(spec.name)
    return cls(cls.Config(**merged_params(cls, cfg.defaults, spec.params)), problem)


# ------------------------------------------------------------------ one run
def resolved_config(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int) -> dict[str, Any]:
    cls = get_algorithm(spec.name)
    algo_cfg = cls.Config(**merged_params(cls, cfg.defaults, spec.params))
    raw = cfg.model_dump(mode="json", exclude={"algorithms"})
    raw["algorithm"] = {"name": spec.name, "label": spec.display, "params": algo_cfg.model_dump(mode="json")}
    raw["seeds"] = [seed]
    return raw


def best_metrics(history: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for r in history for k in r if isinstance(r.get(k), (int, float)) and k not in ("round", "time_s")
            and not k.endswith("_bytes") and has_direction(k)}
    best: dict[str, float] = {}
    for k in sorted(keys):
        vals = [r[k] for r in history if k in r and r[k] == r[k]]
        if vals:
            best[k] = float(min(vals) if lower_is_better(k) else max(vals))
    return best


def write_summary(run_dir: Path, cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, res: RunResult | None,
                  history: list[dict], status: str, message: str = "", wall: float = 0.0,
                  round_times: list[float] | None = None, extras: dict | None = None,
                  executor: str | None = None) -> dict[str, Any]:
    """``executor``: the executor that ran (``simulation.executor: auto`` resolved)."""
    final = {k: v for k, v in (history[-1] if history else {}).items() if k not in ("round", "time_s")}
    ledger = res.ledger if res is not None else None
    summary = {
        "algorithm": spec.name, "label": spec.display, "dataset": cfg.data.dataset, "experiment": cfg.name,
        "seed": seed, "rounds": history[-1]["round"] if history else 0, "status": status, "message": message,
        "metrics": {"final": final, "best": best_metrics(history)},
        "communication": {"uplink_bytes": ledger.uplink_bytes if ledger else final.get("uplink_bytes", 0),
                          "downlink_bytes": ledger.downlink_bytes if ledger else final.get("downlink_bytes", 0)},
        "wall_time_s": wall,
        "round_time_s_median": statistics.median(round_times) if round_times else None,
        "executor": executor,
        "extras": extras or {},
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=_json_default))
    return summary


def _json_default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def run_one(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, run_dir: str | Path, resume: bool = False,
            progress: bool = True, problem: FederatedProblem | None = None, write_report: bool = True,
            extras: dict | None = None) -> dict:
    """Run one algorithm with one seed into ``run_dir``; returns the summary dict (``extras`` are added to
    its ``extras``). A spec with ``tune`` is tuned first (:func:`run_spec`)."""
    if spec.tune is not None:
        return run_spec(cfg, spec, seed, run_dir, resume=resume, progress=progress, problem=problem,
                        write_report=write_report)
    from fedsolve.experiments.report import write_run_report

    set_threads(cfg.threads)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    problem = problem if problem is not None else build_problem(cfg, seed)
    algo = build_algorithm(cfg, spec, problem)
    atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(resolved_config(cfg, spec, seed), sort_keys=False))
    sim = Simulation(problem, algo, cfg.simulation, seed, out_dir=run_dir,
                     callbacks=[JsonlLogger(run_dir / "metrics.jsonl"),
                                ProgressBar(f"{spec.display} s{seed}", disable=not progress)])
    t0 = time.perf_counter()
    try:
        res = sim.run(resume=resume)
    except DivergenceError as e:
        summary = write_summary(run_dir, cfg, spec, seed, None, sim.history, "diverged", str(e),
                                wall=time.perf_counter() - t0, round_times=sim.round_times, executor=sim.executor.name)
        if write_report:
            write_run_report(run_dir, summary, sim.history)
        raise
    summary = write_summary(run_dir, cfg, spec, seed, res, res.history, "completed", wall=res.wall_time_s,
                            round_times=res.round_times, extras={**res.extras, **(extras or {})},
                            executor=sim.executor.name)
    atomic_write_text(run_dir / "per_client.json", json.dumps(res.per_client))
    if write_report:
        write_run_report(run_dir, summary, res.history)
    return summary


# ------------------------------------------------------------------ tuning on validation
def _completed(run_dir: Path) -> dict | None:
    f = run_dir / "summary.json"
    if f.exists():
        done = json.loads(f.read_text())
        if done.get("status") == "completed":
            return done
    return None


def tune_spec(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, data, tune_dir: str | Path,
              resume: bool = False, progress: bool = True) -> tuple[AlgorithmSpec, dict[str, Any]]:
    """Choose ``spec.tune.param`` from its grid on validation data (:class:`TuneSpec`).

    One run per grid value in ``tune_dir/<param>=<value>`` on ``data.split_validation``; the value with the
    best final validation metric wins (ties and order: the first in the grid). Runs that diverge score
    nothing. Returns the spec with the chosen value (and no ``tune``) and a record of the choice.
    """
    t = spec.tune
    metric = t.metric or ("test_accuracy" if data.task == "classification" else "test_rmse")
    val_data = data.split_validation(t.val_fraction, seed)
    rounds = cfg.simulation.rounds if t.rounds is None else min(t.rounds, cfg.simulation.rounds)
    tcfg = cfg.model_copy(update={"simulation": cfg.simulation.model_copy(update={"rounds": rounds})})
    scores: list[float | None] = []
    wall = 0.0
    for v in t.grid:
        rd = Path(tune_dir) / _slug(f"{t.param}={v}")
        summary = _completed(rd) if resume else None
        if summary is None:
            try:
                summary = run_one(tcfg, spec.with_param(t.param, v), seed, rd, progress=progress,
                                  resume=resume and (rd / "checkpoint.pt").exists(),
                                  problem=build_problem(tcfg, seed, data=val_data), write_report=False)
            except DivergenceError as e:
                print(f"[fedsolve] tuning {spec.display} {t.param}={v} seed {seed} diverged: {e}")
                summary = {"status": "diverged", "metrics": {"final": {}}}
        wall += summary.get("wall_time_s") or 0.0
        final = summary["metrics"]["final"]
        if summary.get("status") == "completed" and metric not in final:
            from fedsolve.experiments.config import ConfigError

            raise ConfigError(f"algorithm {spec.name!r} tune.metric: {metric!r} is not reported by this run; "
                              f"allowed: {sorted(k for k, x in final.items() if isinstance(x, (int, float)))}")
        val = final.get(metric) if summary.get("status") == "completed" else None
        scores.append(float(val) if isinstance(val, (int, float)) and val == val else None)
    ok = [i for i, sc in enumerate(scores) if sc is not None]
    if not ok:
        raise DivergenceError(f"{spec.display} seed {seed}: no tuning run of {t.param} over {t.grid} gave a "
                              f"validation {metric} (every run diverged); "
                              f"the tuning runs are in {tune_dir}")
    sign = 1.0 if lower_is_better(metric) else -1.0
    best = min(ok, key=lambda i: (sign * scores[i], i))
    info = {"param": t.param, "value": t.grid[best], "metric": metric, "grid": list(t.grid), "scores": scores,
            "val_fraction": t.val_fraction, "rounds": tcfg.simulation.rounds, "wall_time_s": wall}
    return spec.with_param(t.param, t.grid[best]), info


def run_spec(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, run_dir: str | Path, resume: bool = False,
             progress: bool = True, problem: FederatedProblem | None = None, write_report: bool = True) -> dict:
    """:func:`run_one`, after choosing the tuned hyper-parameter on validation (``run_dir/tune``) when
    ``spec.tune`` is set; the choice is recorded in the summary's ``extras["tuned"]``."""
    if spec.tune is None:
        return run_one(cfg, spec, seed, run_dir, resume=resume and (Path(run_dir) / "checkpoint.pt").exists(),
                       progress=progress, problem=problem, write_report=write_report)
    problem = problem if problem is not None else build_problem(cfg, seed)
    run_dir = Path(run_dir)
    try:
        chosen, info = tune_spec(cfg, spec, seed, problem.data, run_dir / "tune", resume=resume, progress=progress)
    except DivergenceError as e:
        write_summary(run_dir, cfg, spec, seed, None, [], "diverged", str(e))
        raise
    return run_one(cfg, chosen, seed, run_dir, resume=resume and (run_dir / "checkpoint.pt").exists(),
                   progress=progress, problem=problem, write_report=write_report, extras={"tuned": info})


def default_run_dir(cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, out: str | Path | None = None) -> Path:
    base = Path(out) if out is not None else Path(cfg.out_dir) / cfg.name
    return base / _slug(spec.display) / f"seed{seed}"


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


# ------------------------------------------------------------------ compare
def compare(cfg: ExperimentConfig, out: str | Path | None = None, resume: bool = False, progress: bool = True,
            stop_on_divergence: bool = False, jobs: int = 1) -> dict[str, Any]:
    """Every algorithm x every seed on the same problem (the data of a seed is shared by all).

    ``jobs`` > 1 runs the (algorithm, seed) runs in that many worker processes at once, each with
    ``threads // jobs`` torch threads (at least 1); every run writes its own folder, as in one process.
    """
    from fedsolve.experiments.report import write_compare_report

    if jobs < 1:
        raise ValueError(f"jobs: expected a whole number >= 1 (worker processes), got {jobs}")
    base = Path(out) if out is not None else Path(cfg.out_dir) / cfg.name
    base.mkdir(parents=True, exist_ok=True)
    atomic_write_text(base / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    t0 = time.perf_counter()
    order = [(seed, spec) for seed in cfg.seeds for spec in cfg.all_algorithms()]
    summaries: dict[tuple[int, str], dict] = {}
    todo = []
    for seed, spec in order:
        run_dir = default_run_dir(cfg, spec, seed, base)
        done = _completed(run_dir) if resume else None
        if done is not None:
            summaries[seed, spec.display] = done
        else:
            todo.append((seed, spec, run_dir))

    def finished(seed: int, spec: AlgorithmSpec, run_dir: Path, error: DivergenceError | None) -> None:
        if error is not None:
            if stop_on_divergence:
                raise error
            print(f"[fedsolve] {spec.display} seed {seed} diverged: {error}")
        summaries[seed, spec.display] = json.loads((run_dir / "summary.json").read_text())

    if jobs == 1 or len(todo) <= 1:
        data_seed, data = None, None
        for seed, spec, run_dir in todo:
            set_threads(cfg.threads)
            if seed != data_seed:
                data_seed, data = seed, build_data(cfg, seed)
            try:
                run_spec(cfg, spec, seed, run_dir, resume=resume, progress=progress,
                         problem=build_problem(cfg, seed, data=data), write_report=False)
                error = None
            except DivergenceError as e:
                error = e
            finished(seed, spec, run_dir, error)
    else:
        _compare_in_workers(cfg, todo, jobs, resume, finished)
    runs: dict[str, list[dict]] = {}
    histories: dict[str, list[list[dict]]] = {}
    for seed, spec in order:
        runs.setdefault(spec.display, []).append(summaries[seed, spec.display])
        histories.setdefault(spec.display, []).append(
            _read_jsonl(default_run_dir(cfg, spec, seed, base) / "metrics.jsonl"))
    agg = aggregate_runs(cfg, runs)
    # total compute of all runs (also right after --resume, where this call only did part of it)
    agg["wall_time_s"] = sum((s.get("wall_time_s") or 0.0) + ((s.get("extras") or {}).get("tuned") or {}).get(
        "wall_time_s", 0.0) for lst in runs.values() for s in lst)
    agg["invocation_time_s"] = time.perf_counter() - t0
    atomic_write_text(base / "summary.json", json.dumps(agg, indent=2, default=_json_default))
    write_compare_report(base, cfg, agg, histories)
    return agg


def _compare_in_workers(cfg: ExperimentConfig, todo: list, jobs: int, resume: bool, finished) -> None:
    """The runs of :func:`compare` in ``jobs`` spawned processes; ``finished(seed, spec, run_dir, error)`` is
    called here as each one ends. A worker imports the modules outside fedsolve that registered the algorithms
    it runs (``fedsolve --import``), so user algorithms run there too."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (cfg.threads or min(2, os.cpu_count() or 1)) // jobs)
    dump = cfg.model_copy(update={"threads": threads}).model_dump(mode="json")
    modules = {get_algorithm(spec.name).__module__ for _, spec, _ in todo}
    plugins = sorted(m for m in modules if not m.startswith("fedsolve.") and m != "__main__")
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
        running = {pool.submit(_compare_worker, dump, spec.display, seed, str(run_dir), resume, plugins):
                   (seed, spec, run_dir) for seed, spec, run_dir in todo}
        for f in as_completed(running):
            seed, spec, run_dir = running[f]
            message = f.result()
            t = json.loads((run_dir / "summary.json").read_text()).get("wall_time_s") or 0.0
            print(f"[fedsolve] {spec.display} seed {seed} {'diverged' if message else 'done'} ({t:.1f} s)",
                  flush=True)
            finished(seed, spec, run_dir, DivergenceError(message) if message else None)


_worker_data: dict[str, Any] = {}


def _compare_worker(dump: dict, label: str, seed: int, run_dir: str, resume: bool, plugins: list[str]) -> str | None:
    """One (algorithm, seed) run of :func:`compare` in a worker process: None, or the divergence message."""
    import importlib

    for mod in plugins:
        importlib.import_module(mod)
    cfg = ExperimentConfig.model_validate(dump)
    key = json.dumps([dump["data"], seed], sort_keys=True)
    if key not in _worker_data:               # a worker keeps the data of its last seed
        _worker_data.clear()
        _worker_data[key] = build_data(cfg, seed)
    spec = next(s for s in cfg.all_algorithms() if s.display == label)
    try:
        run_spec(cfg, spec, seed, run_dir, resume=resume, progress=False,
                 problem=build_problem(cfg, seed, data=_worker_data[key]), write_report=False)
    except DivergenceError as e:
        return str(e)
    return None


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def aggregate_runs(cfg: ExperimentConfig, runs: dict[str, list[dict]]) -> dict[str, Any]:
    out: dict[str, Any] = {"experiment": cfg.name, "dataset": cfg.data.dataset, "seeds": cfg.seeds,
                           "algorithms": {}}
    for label, lst in runs.items():
        entry: dict[str, Any] = {"algorithm": lst[0]["algorithm"], "runs": len(lst),
                                 "diverged": sum(1 for s in lst if s.get("status") != "completed")}
        for which in ("final", "best"):
            keys = sorted({k for s in lst for k in s["metrics"][which]})
            stats = {}
            for k in keys:
                vals = [s["metrics"][which][k] for s in lst if k in s["metrics"][which]]
                vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
                if vals:
                    stats[k] = {"mean": statistics.fmean(vals), "std": statistics.pstdev(vals) if len(vals) > 1
                                else 0.0, "n": len(vals)}
            entry[which] = stats
        for k in ("wall_time_s", "round_time_s_median"):
            vals = [s[k] for s in lst if s.get(k) is not None]
            entry[k] = statistics.fmean(vals) if vals else None
        entry["uplink_bytes"] = statistics.fmean([s["communication"]["uplink_bytes"] for s in lst])
        tuned = [dict(s["extras"]["tuned"], seed=s.get("seed")) for s in lst if (s.get("extras") or {}).get("tuned")]
        if tuned:
            entry["tuned"] = tuned
        entry["downlink_bytes"] = statistics.fmean([s["communication"]["downlink_bytes"] for s in lst])
        out["algorithms"][label] = entry
    return out
