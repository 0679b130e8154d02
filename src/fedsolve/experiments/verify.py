"""``fedsolve verify``: re-run one reported cell from its recorded config and compare with the recorded numbers.

A cell is found from the folder given:

* a **run folder** (``summary.json`` + ``config.yaml`` + ``metrics.jsonl``): that run;
* a **compare folder**: one algorithm's runs (``--cell LABEL``; default the first), each seed's run folder
  verified as above where the per-round logs are kept; where they are not (summaries only), the cell's seeds
  are re-run whole (``--full``) and their mean, SD and count compared with the summary;
* a **suite folder** (``suite.json`` + ``cells/``): one cell (``--cell KEY``, a file name in ``cells/``;
  default the first), re-run by its protocol with the suite's recorded settings, its rows compared; of a grid of
  runs (``protocol: runs``) one cell's compare folder (``--cell FOLDER[:LABEL]``), verified as above.

By default a run is re-run up to a reduced round (the first recorded evaluation at or after round 10, or
``--rounds R``) with the recorded config unchanged otherwise, so every schedule that depends on the round
budget is the recorded one; ``--full`` re-runs it to the end. A suite cell is always re-run whole. Every re-run
uses the torch thread count its record names where its config leaves threads to the machine (a float32 sum's
rounding depends on how it is split over threads; a suite's workers run one thread each). Numbers agree
when ``|now - recorded| <= atol + rtol * |recorded|`` (timings excluded). The report says whether the package
source changed since the recorded commit (:func:`fedsolve.engine.provenance.source_changed`): with the same
code, a difference is a finding; with changed code it may come from the change.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsolve.engine.provenance import source_changed, source_commit
from fedsolve.experiments.config import ConfigError, ExperimentConfig, parse_config
from fedsolve.experiments.folders import default_run_dir, read_jsonl, slug
from fedsolve.experiments.records import folder_kind, read_json, read_yaml

#: record fields that are not results (wall-clock times); so is any field named ``*_wall_s`` or ``*_time_s``
TIMING = ("time_s", "wall_s", "wall_time_s", "round_time_s_median")


def _timing(key: str) -> bool:
    """Whether record field ``key`` is a wall-clock time (not compared)."""
    return key in TIMING or key.endswith(("_wall_s", "_time_s"))


REDUCED_ROUND = 10


@dataclass
class Verdict:
    """What ``fedsolve verify`` found: ``agrees``, the lines of its report, and the comparisons made."""

    lines: list[str] = field(default_factory=list)
    compared: int = 0
    differ: list[str] = field(default_factory=list)
    worst: float = 0.0

    @property
    def agrees(self) -> bool:
        return self.compared > 0 and not self.differ

    def check(self, where: str, now: Any, recorded: Any, rtol: float, atol: float) -> None:
        """Compare two numbers (non-numbers are skipped; NaN equals NaN)."""
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (now, recorded)):
            return
        self.compared += 1
        if (math.isnan(now) and math.isnan(recorded)) or now == recorded:
            return
        rel = abs(now - recorded) / max(abs(recorded), 1e-300)
        self.worst = max(self.worst, rel if math.isfinite(rel) else math.inf)
        if not abs(now - recorded) <= atol + rtol * abs(recorded):
            self.differ.append(f"{where}: recorded {recorded:.6g}, now {now:.6g} (relative {rel:.1e})")


def verify(
    path: str | Path,
    full: bool = False,
    cell: str | None = None,
    rounds: int | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-8,
) -> Verdict:
    """Re-run the cell of ``path`` (module docstring) and compare; raises ``ConfigError`` when there is nothing
    to re-run or compare."""
    path = Path(path)
    for flag, v in (("--rtol", rtol), ("--atol", atol)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"verify {flag}: expected a finite number >= 0, got {v}")
    kind = folder_kind(path)
    if kind is None:
        raise ConfigError(
            f"verify {path}: not a fedsolve run, compare or suite folder (no run.json, summary.json "
            f"or suite.json); allowed: a folder fedsolve wrote, e.g. one under results/"
        )
    out = Verdict()
    if kind == "run":
        if cell is not None:
            raise ConfigError(
                f"verify --cell {cell}: {path} is a run folder, which holds one cell; allowed: no "
                f"--cell, or a compare or suite folder"
            )
        _verify_run(path, full, rounds, rtol, atol, out)
    elif kind == "compare":
        _verify_compare(path, full, cell, rounds, rtol, atol, out)
    else:
        _verify_suite(path, cell, rtol, atol, out, full, rounds)
    if not out.compared:
        raise ConfigError(f"verify {path}: the re-run and the record share no number to compare")
    out.lines.append(
        f"agrees: {out.compared} numbers within rtol {rtol:g}, atol {atol:g} (largest relative "
        f"difference {out.worst:.1e})"
        if out.agrees
        else f"DIFFERS: {len(out.differ)} of {out.compared} numbers outside rtol {rtol:g}, atol {atol:g}; "
        f"first: {out.differ[0]}"
    )
    return out


def code_line(recorded: dict[str, Any] | None) -> str:
    """Whether the package source changed since the commit a record names."""
    commit = (recorded or {}).get("commit")
    if not commit or commit == "unknown":
        return "code: the record names no commit, so a difference cannot be told from a change of code"
    how = (
        ""
        if (recorded or {}).get("commit_source", "recorded") == "recorded"
        else ", the commit that added the record (the run recorded none)"
    )
    changed = source_changed(commit)
    now, dirty = source_commit()
    local = "; this checkout has uncommitted changes to the package" if dirty else ""
    if changed is None:
        return f"code: recorded commit {commit[:10]}{how} cannot be compared with this checkout{local}"
    if changed:
        return (
            f"code: CHANGED since the recorded commit {commit[:10]}{how} (the package source differs from "
            f"HEAD {now[:10]}): a difference may come from that{local}"
        )
    return f"code: the package source is the recorded commit's ({commit[:10]}{how}){local}"


def _verify_grid(
    path: Path, cell: str | None, full: bool, rounds: int | None, rtol: float, atol: float, out: Verdict
) -> None:
    """A grid suite's cell (``--cell FOLDER`` or ``FOLDER:LABEL``, the folder relative to the suite's; default the
    first cell and its first algorithm): its compare folder verified as :func:`_verify_compare` does."""
    cells = sorted(
        str(p.parent.relative_to(path))
        for p in path.rglob("run.json")
        if p.parent != path and folder_kind(p.parent) == "compare"
    )
    if not cells:
        raise ConfigError(f"verify {path}: a grid suite folder with no cell (compare folder) to re-run")
    folder, _, label = (cell or cells[0]).partition(":")
    if folder not in cells:
        raise ConfigError(
            f"verify --cell: {folder!r} is not a cell of {path}; allowed: {cells[:5]}"
            + (" ..." if len(cells) > 5 else "")
            + " (optionally :LABEL)"
        )
    _verify_compare(path / folder, full, label or None, rounds, rtol, atol, out)


# ------------------------------------------------------------------ run folders
class _Enough(Exception):
    """Raised by :class:`_StopAt` to end a reduced re-run."""


class _StopAt:
    """Ends a run after its evaluation at round ``last``."""

    def __init__(self, last: int):
        self.last = last

    def on_start(self, sim) -> None:
        pass

    def on_round(self, sim, round_, info) -> None:
        pass

    def on_eval(self, sim, record) -> None:
        if record["round"] >= self.last:
            raise _Enough

    def on_end(self, sim) -> None:
        pass


def _run_config(path: Path) -> tuple[ExperimentConfig, int]:
    """The config and seed a run folder was run with: its own ``config.yaml``, or for a run folder of a compare
    that kept only the compare's (``<compare>/<label>/seed<k>/``) that config with the run's algorithm and seed."""
    if (path / "config.yaml").exists():
        raw = read_yaml(path / "config.yaml")
        if not isinstance(raw, dict):
            raise ConfigError(f"{path / 'config.yaml'}: not a run's config")
        return _parsed(raw, path / "config.yaml"), (raw.get("seeds") or [0])[0]
    up = path.parent.parent / "config.yaml"
    if up.exists() and path.name.startswith("seed") and path.name[4:].isdigit():
        cfg = _parsed(read_yaml(up), up)
        spec = next((s for s in cfg.all_algorithms() if slug(s.display) == path.parent.name), None)
        if spec is not None:
            seed = int(path.name[4:])
            return cfg.model_copy(update={"algorithms": [spec], "algorithm": None, "seeds": [seed]}), seed
    raise ConfigError(
        f"verify {path}: no recorded config (no config.yaml here, nor a compare's two folders up); "
        f"a run cannot be re-run without the config it was run with"
    )


def _parsed(raw: Any, where: Path) -> ExperimentConfig:
    """The recorded config ``raw`` of file ``where``; a config fedsolve cannot read is a ``ConfigError`` naming
    the file."""
    try:
        return parse_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{where}: not a config this fedsolve reads ({str(e).removeprefix('config: ')})") from None


def rerun(cfg: ExperimentConfig, seed: int, last: int | None) -> list[dict[str, Any]]:
    """The evaluation records of ``cfg``'s (one) algorithm with ``seed``, up to round ``last`` (None: all), run
    in memory (nothing written) on this machine's device when the recorded one is missing."""
    from fedsolve.engine.loop import DivergenceError, Simulation
    from fedsolve.experiments.runner import build_algorithm, build_problem, build_schedule, set_threads

    sim_cfg = cfg.simulation
    if sim_cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sim_cfg = sim_cfg.model_copy(update={"device": "cpu"})
    set_threads(cfg.threads)
    spec = cfg.all_algorithms()[0]
    problem = build_problem(cfg, seed, spec=spec)
    algo = build_algorithm(cfg, spec, problem)
    sim = Simulation(
        problem,
        algo,
        sim_cfg,
        seed,
        callbacks=[_StopAt(last)] if last is not None else [],
        schedule=build_schedule(cfg, spec, algo),  # e.g. asyncFPFC's virtual clock decides when it evaluates
    )
    try:
        sim.run()
    except (_Enough, DivergenceError):
        pass
    return sim.history


def _verify_run(path: Path, full: bool, rounds: int | None, rtol: float, atol: float, out: Verdict) -> None:
    recorded = read_jsonl(path / "metrics.jsonl")
    if not recorded:
        raise ConfigError(f"verify {path}: no per-round log (metrics.jsonl) to compare with")
    summary = read_json(path / "summary.json") if (path / "summary.json").exists() else {}
    named, seed = _run_config(path)
    cfg = _recorded_threads(named, summary.get("provenance"))
    done = [r["round"] for r in recorded]
    last = None if full else _reduced(done, rounds)
    out.lines.append(code_line(summary.get("provenance")))
    now = rerun(cfg, seed, last)
    upto = done[-1] if last is None else last
    out.lines.append(
        f"{path}: re-ran {summary.get('label', cfg.all_algorithms()[0].display)} seed {seed} to round "
        f"{upto} of {done[-1]}"
        + ("" if last is None else " (reduced; --full for all)")
        + (f", {cfg.threads} torch thread(s) as recorded" if cfg is not named else "")
    )
    mine = {r["round"]: r for r in now}
    for rec in recorded:
        if rec["round"] > upto:
            break
        got = mine.get(rec["round"])
        if got is None:
            out.differ.append(f"round {rec['round']}: recorded, but the re-run did not evaluate it")
            continue
        for k, v in rec.items():
            if not _timing(k) and k != "round":
                out.check(f"round {rec['round']} {k}", got.get(k), v, rtol, atol)


def _recorded_threads(cfg: ExperimentConfig, recorded: dict[str, Any] | None) -> ExperimentConfig:
    """``cfg`` with the torch thread count the record ran with where the config leaves it to the machine (a
    suite's workers run one thread each): a float32 product's rounding depends on how it is split over threads."""
    n = _threads_of(recorded)
    return cfg if cfg.threads is not None or n is None else cfg.model_copy(update={"threads": n})


def _threads_of(recorded: dict[str, Any] | None) -> int | None:
    """The torch thread count a record's provenance names (None when it names none)."""
    n = (recorded or {}).get("torch_threads")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _reduced(done: list[int], rounds: int | None) -> int:
    """The recorded evaluation round a reduced re-run stops at (``rounds``: at or after it)."""
    want = min(REDUCED_ROUND if rounds is None else rounds, done[-1])
    return next(r for r in done if r >= want and r > 0) if done[-1] > 0 else 0


# ------------------------------------------------------------------ compare folders
def _verify_compare(
    path: Path, full: bool, cell: str | None, rounds: int | None, rtol: float, atol: float, out: Verdict
) -> None:
    summary = read_json(path / "summary.json")
    if not (path / "config.yaml").is_file():
        raise ConfigError(
            f"verify {path}: no recorded config (config.yaml) beside its summary.json; a compare cannot be re-run "
            f"without the config it was run with"
        )
    cfg = _parsed(read_yaml(path / "config.yaml"), path / "config.yaml")
    labels = list(summary.get("algorithms") or {})
    label = cell or (labels[0] if labels else None)
    if label not in labels:
        raise ConfigError(f"verify --cell: {label!r} is not in {path / 'summary.json'}; allowed: {labels}")
    spec = next((s for s in cfg.all_algorithms() if s.display == label), None)
    if spec is None:
        raise ConfigError(f"verify --cell: {label!r} is not in {path / 'config.yaml'}")
    seeds = list(summary.get("seeds") or cfg.seeds)
    dirs = [default_run_dir(cfg, spec, s, path) for s in seeds]
    if all(read_jsonl(d / "metrics.jsonl") for d in dirs):  # kept plain or gzipped
        for d in dirs if full else dirs[:1]:
            _verify_run(d, full, rounds, rtol, atol, out)
        return
    if not full:
        raise ConfigError(
            f"verify {path}: keeps no per-round logs for {label!r}, so a reduced re-run has nothing "
            f"to compare with; allowed: --full (re-runs {len(seeds)} seed(s) x "
            f"{cfg.simulation.rounds} rounds)"
        )
    out.lines.append(code_line(summary.get("provenance")))
    named = cfg.model_copy(update={"algorithms": [spec], "algorithm": None})
    one = _recorded_threads(named, summary.get("provenance"))
    finals = [(rerun(one.model_copy(update={"seeds": [s]}), s, None) or [{}])[-1] for s in seeds]
    out.lines.append(
        f"{path}: re-ran {label} for seeds {seeds}, {cfg.simulation.rounds} rounds each (full)"
        + (f", {one.threads} torch thread(s) as recorded" if one is not named else "")
    )
    sd = statistics.stdev if summary.get("spread") == "sample SD" else statistics.pstdev
    for k, st in (summary["algorithms"][label].get("final") or {}).items():
        vals = [f[k] for f in finals if isinstance(f.get(k), (int, float)) and f[k] == f[k]]
        if _timing(k) or not vals:
            continue
        out.check(f"{label} final {k} mean", statistics.fmean(vals), st.get("mean"), rtol, atol)
        out.check(f"{label} final {k} sd", sd(vals) if len(vals) > 1 else 0.0, st.get("std"), rtol, max(atol, 1e-12))
        out.check(f"{label} final {k} n", len(vals), st.get("n"), 0.0, 0.0)


# ------------------------------------------------------------------ suite folders
def _verify_suite(
    path: Path, cell: str | None, rtol: float, atol: float, out: Verdict, full: bool = False, rounds: int | None = None
) -> None:
    import torch

    from fedsolve.experiments.suite import Context, SuiteConfig, run_cell

    settings = read_json(path / "suite.json")
    if settings.get("protocol") == "runs":
        _verify_grid(path, cell, full, rounds, rtol, atol, out)
        return
    files = sorted((path / "cells").glob("*.json"))
    if not files:
        raise ConfigError(f"verify {path}: no cells/*.json to re-run")
    names = [f.stem for f in files]
    key = cell or names[0]
    if key not in names:
        raise ConfigError(
            f"verify --cell: {key!r} is not a cell of {path}; allowed: {names[:5]}" + (" ..." if len(names) > 5 else "")
        )
    saved = read_json(path / "cells" / f"{key}.json")
    raw = {k: v for k, v in settings.items() if k != "resolved_experiment"}
    suite = SuiteConfig(
        name=path.name,
        description="re-run by fedsolve verify",
        **{**raw, "experiment": settings["resolved_experiment"]},
    )
    out.lines.append(code_line(saved.get("provenance")))
    threads = _threads_of(saved.get("provenance"))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or before)
        rows = run_cell(Context(suite, path).for_cell(saved["cell"]))
    finally:
        torch.set_num_threads(before)
    out.lines.append(
        f"{path}: re-ran cell {key} ({saved['cell']}) of protocol {suite.protocol}"
        + (f", {threads} torch thread(s) as recorded" if threads else "")
    )
    if len(rows) != len(saved["rows"]):
        out.differ.append(f"cell {key}: {len(saved['rows'])} rows recorded, {len(rows)} now")
    for i, (got, rec) in enumerate(zip(rows, saved["rows"])):
        for k, v in rec.items():
            if not _timing(k):
                out.check(f"row {i} {k}", got.get(k), v, rtol, atol)
