"""Compare folders: every algorithm x every seed of one experiment config, their summary and report.

A compare folder holds one run folder per algorithm and seed (``<label>/seed<k>``), its record
(``config.yaml``: every algorithm run into it so far), ``summary.json`` (per algorithm and metric the mean,
sample SD and count over the seeds) and ``report.md`` with the table and plots. ``fedsolve compare CONFIG`` makes
one (:func:`compare`); a grid suite makes one per cell of its grid (:func:`run_compares`), so that the runs of all
its cells go to one executor (:func:`fedsolve.experiments.runs.run_all`: resume, worker processes, sweeps as one
batch) -- a compare is a grid with one cell.

A folder is judged by its own record (:func:`~fedsolve.experiments.records.compare_record`: the same seeds, data,
model, settings and, for the algorithms it already holds, the same parameters; it may add algorithms), locked
while the call is live, and marked ``running`` in its ``run.json`` until it ends.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from fedsolve.engine.io import atomic_write_text
from fedsolve.engine.loop import DivergenceError
from fedsolve.engine.provenance import provenance
from fedsolve.engine.run_folder import FolderBusy, RunFolder, holder
from fedsolve.experiments.config import ConfigError, ExperimentConfig
from fedsolve.experiments.folders import default_run_dir
from fedsolve.experiments.records import compare_record, folder_kind
from fedsolve.experiments.report import run_history, write_compare_report
from fedsolve.experiments.runner import check_resume, resolved_config, run_device
from fedsolve.experiments.runs import Run, run_all


def compare(
    cfg: ExperimentConfig,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_on_divergence: bool = False,
    jobs: int = 1,
    overwrite: bool = False,
    track: Sequence[str] = (),
    batch: bool = True,
) -> dict[str, Any]:
    """Every algorithm x every seed of ``cfg`` on the same problem (the data of a seed is shared by all) into
    ``out`` (default ``<out_dir>/<name>``); returns the folder's summary.

    A folder that already holds runs is refused unless ``resume`` (keep finished runs whose config agrees,
    continue the others from their checkpoints) or ``overwrite`` (start every run over). ``jobs`` > 1 runs the
    runs in that many worker processes; ``batch`` trains runs that differ only in seed and scalar
    hyper-parameters as one batch where the executor allows (:mod:`fedsolve.experiments.runs`); ``track`` names
    the tracking writers of every run. The summary's ``wall_time_s`` is this call's wall-clock time;
    ``run_time_s`` the sum of the runs' times."""
    base = Path(out) if out is not None else Path(cfg.out_dir) / cfg.name
    return run_compares(
        [(cfg, base)],
        resume=resume,
        progress=progress,
        stop_on_divergence=stop_on_divergence,
        jobs=jobs,
        overwrite=overwrite,
        track=track,
        batch=batch,
    )[0]


def run_compares(
    cells: Sequence[tuple[ExperimentConfig, Path]],
    resume: bool = False,
    progress: bool = True,
    stop_on_divergence: bool = False,
    jobs: int = 1,
    overwrite: bool = False,
    track: Sequence[str] = (),
    batch: bool = True,
) -> list[dict[str, Any]]:
    """One compare folder per ``(cfg, folder)`` of ``cells`` (module docstring), their runs all given to one
    :func:`~fedsolve.experiments.runs.run_all`; returns each folder's summary, in order."""
    if jobs < 1:
        raise ValueError(f"jobs: expected a whole number >= 1 (worker processes), got {jobs}")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; give one")
    with ExitStack() as stack:
        folders = []
        for cfg, base in cells:
            folder = stack.enter_context(RunFolder(base, "compare"))
            record = _check_compare(cfg, base, resume, overwrite)
            folder.start(provenance(run_device(cfg), cfg.model_dump(mode="json")))
            (base / "summary.json").unlink(missing_ok=True)  # rebuilt at the end: no stale summary beside new runs
            atomic_write_text(base / "config.yaml", yaml.safe_dump(record, sort_keys=False))
            folders.append(folder)
        runs = [
            Run(cfg, spec, seed, default_run_dir(cfg, spec, seed, base))
            for cfg, base in cells
            for seed in cfg.seeds
            for spec in cfg.all_algorithms()
        ]
        t0 = time.perf_counter()
        try:
            summaries = run_all(
                runs,
                resume=resume,
                progress=progress,
                jobs=jobs,
                track=track,
                batch=batch,
                stop_on_divergence=stop_on_divergence,
            )
        except DivergenceError as e:
            for folder in folders:
                folder.finish("diverged", str(e))
            raise
        out = []
        for (cfg, base), folder in zip(cells, folders):
            out.append(_write_summary(cfg, base, summaries, time.perf_counter() - t0))
            folder.finish("completed")
        return out


def _check_compare(cfg: ExperimentConfig, base: Path, resume: bool, overwrite: bool) -> dict[str, Any]:
    """Refuse a compare that would mix configs in ``base`` or write where another live run writes; return the
    folder's new record (:func:`~fedsolve.experiments.records.compare_record`). Without ``resume`` or
    ``overwrite`` no run of this call may exist yet (``--only`` may add runs); with ``resume`` every run folder
    that holds a run must agree with this config (:func:`~fedsolve.experiments.runner.check_resume`)."""
    record = compare_record(base, cfg, resume, overwrite)
    order = [
        (seed, spec, default_run_dir(cfg, spec, seed, base)) for seed in cfg.seeds for spec in cfg.all_algorithms()
    ]
    for _, _, d in order:
        pid = holder(d)
        if pid is not None:
            raise FolderBusy(
                f"{d} is in use by a live run (lock {d / '.fedsolve.lock'}, held by pid {pid}); "
                f"allowed: wait for it to end or stop it, or use another --out"
            )
    held = [d for _, _, d in order if folder_kind(d) is not None]
    if held and not resume and not overwrite:
        raise ConfigError(
            f"{base} already holds {len(held)} of these runs ({held[0].relative_to(base)} first); "
            f"pass --resume to continue them or --overwrite to start over"
        )
    if resume:
        for seed, spec, d in order:
            if spec.tune is None and d in held:
                check_resume(d, resolved_config(cfg, spec, seed))
    return record


def _write_summary(cfg: ExperimentConfig, base: Path, summaries: dict[Path, dict], wall: float) -> dict[str, Any]:
    """The folder's ``summary.json`` and ``report.md`` from its runs' summaries; returns the summary."""
    runs: dict[str, list[dict]] = {}
    histories: dict[str, list[list[dict]]] = {}
    for seed in cfg.seeds:
        for spec in cfg.all_algorithms():
            d = default_run_dir(cfg, spec, seed, base)
            runs.setdefault(spec.display, []).append(summaries[d])
            histories.setdefault(spec.display, []).append(run_history(d))
    agg = aggregate_runs(cfg, runs)
    # total compute of all runs (also right after --resume, where this call only did part of it)
    agg["run_time_s"] = sum(
        (s.get("wall_time_s") or 0.0) + ((s.get("extras") or {}).get("tuned") or {}).get("wall_time_s", 0.0)
        for lst in runs.values()
        for s in lst
    )
    agg["wall_time_s"] = wall  # this call, as a clock on the wall shows it
    agg["provenance"] = provenance(run_device(cfg), cfg.model_dump(mode="json"))
    atomic_write_text(base / "summary.json", json.dumps(agg, indent=2, default=str))
    write_compare_report(base, cfg, agg, histories)
    return agg


def aggregate_runs(cfg: ExperimentConfig, runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Per algorithm label and metric (final and best over rounds): the mean, the sample SD (n - 1 in the
    denominator; 0 for one run) and the number n of runs with a finite value (``"spread": "sample SD"``)."""
    names = {s.get("dataset") for lst in runs.values() for s in lst} - {None}
    out: dict[str, Any] = {
        "experiment": cfg.name,
        "dataset": names.pop() if len(names) == 1 else cfg.data.label,
        "seeds": cfg.seeds,
        "spread": "sample SD",
        "algorithms": {},
    }
    for label, lst in runs.items():
        entry: dict[str, Any] = {
            "algorithm": lst[0]["algorithm"],
            "runs": len(lst),
            "diverged": sum(1 for s in lst if s.get("status") != "completed"),
        }
        for which in ("final", "best"):
            keys = sorted({k for s in lst for k in s["metrics"][which]})
            stats = {}
            for k in keys:
                vals = [s["metrics"][which][k] for s in lst if k in s["metrics"][which]]
                vals = [v for v in vals if isinstance(v, (int, float)) and not math.isnan(v)]
                if vals:
                    stats[k] = {
                        "mean": statistics.fmean(vals),
                        "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                        "n": len(vals),
                    }
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
