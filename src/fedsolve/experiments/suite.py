"""Experiment suites: methods x data x parameters x seeds, declared in one YAML, run by one command.

A suite YAML (``fedsolve suite <yaml>``) says what a paper table needs:

* ``experiment``: the data, model, simulation settings and algorithms (a path to an experiment YAML,
  relative to the suite file, or the same fields inline), with ``set`` overrides as in ``--set``;
* ``protocol``: ``runs`` (the default), a grid of plain runs: per cell one compare folder
  (``<cell>/<label>/seed<k>``, :mod:`fedsolve.experiments.compare`), each algorithm tuned on validation where its
  spec says ``tune:``, ``references`` (other experiments, e.g. a centralized or source-only run) run on every cell
  beside it, and the runs that differ only in seed and scalar hyper-parameters trained as one batch
  (:mod:`fedsolve.experiments.runs`); or a registered function (:data:`PROTOCOLS`) that drives simulations
  for ONE cell through ``Simulation``'s public API and returns rows of metrics (``lambda_path``,
  ``newcomers``, ``attack_grid``, ``fpfc_tuning``, ``tuning``, ``oracle_gap``, ``pairwise_snapshots``,
  ``constrained_runs``, ``np_optimum``), with its typed ``args``;
* ``sweep`` and ``zip``: the grid of cells (:mod:`fedsolve.experiments.grid`): the product of the sweep's axes
  and the zip groups (axes that vary together), the ``algorithms`` (labels of the experiment's) and the
  ``seeds``. An axis named ``experiment`` picks the experiment file, ``params.<p>`` sets an algorithm
  parameter, a dotted name (``data.params.scenario``) sets an experiment field, any other name is a protocol
  input (``attack``, ``fraction``, ``strategy``);
* ``tables``: what each table reports (the metric; final, or the best or last over a field such as the
  round with ``over``; what its rows and columns are; mean +- std over the seeds, the largest value (the
  worst seed), a count of nonzero seeds, or the per-seed relative difference to a reference row with
  ``relative_to``; the paper's numbers next to ours; :mod:`fedsolve.experiments.tables`) and ``plot``: a registered
  figure.

Each finished cell of a protocol is written atomically to ``OUT/cells/`` as it comes in, and each run of a grid of
runs into its own run folder, so an interrupted suite picks up where it stopped (``--resume``, refused if the
suite's settings changed); ``--jobs N`` runs the cells (runs) in N spawned worker processes. The report is
``OUT/report.md`` (the tables, the paper's numbers, the tuning grids and picks, the figure) and
``OUT/results.json`` (every row). An experiment config given to ``fedsolve suite`` is a grid with one cell: the
same compare folder ``fedsolve compare`` writes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedsolve.engine.io import atomic_write_text
from fedsolve.engine.provenance import pin_source, provenance
from fedsolve.engine.run_folder import RunFolder, busy_above
from fedsolve.experiments.config import AlgorithmSpec, ConfigError, ExperimentConfig, apply_overrides, merged_params
from fedsolve.experiments.records import folder_kind, read_json
from fedsolve.experiments.tables import TableSpec, table_lines


# ------------------------------------------------------------------ schema
class SuiteConfig(BaseModel):
    """A suite: an experiment, a protocol, a sweep of cells and the tables to report."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="suite name (default output folder runs/<name>)")
    description: str = Field(..., min_length=1, description="what the suite reproduces (shown in the report)")
    protocol: str = Field(
        "runs",
        description="runs (a grid of plain runs, one folder each) or a registered "
        "protocol (fedsolve.experiments.suite.PROTOCOLS)",
    )
    experiment: str | dict[str, Any] | None = Field(
        None,
        description="experiment YAML (path relative to the "
        "suite file) or its fields inline; null "
        "only with an `experiment` axis",
    )
    set: list[str] = Field(default_factory=list, description="overrides of the experiment (key=value)")
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="seeds of every cell (null: a grid of runs takes each experiment's own, a protocol [0])",
    )
    algorithms: list[str] | None = Field(
        None, description="labels of the experiment's algorithms to run (null: all; ignored by protocols without them)"
    )
    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="grid axes (see the module docstring)")
    zip: list[dict[str, list[Any]]] = Field(
        default_factory=list,
        description="groups of axes that vary together (one length per group), each group one axis of the grid",
    )
    references: list[ReferenceSpec] = Field(
        default_factory=list,
        description="reference experiments run on every cell beside the experiment (protocol runs)",
    )
    folders: str | None = Field(
        None,
        description="folder of a cell (protocol runs), e.g. "
        "'{problem.params.loss}/{data.params.source}' (null: axis=value joined by _)",
    )
    metric: str | None = Field(
        None,
        description="the metric the paper reports: the default table's (protocol "
        "runs, no `tables`: rows algorithm, columns the cells)",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="the protocol's arguments")
    tables: list[TableSpec] = Field(default_factory=list, description="the report's tables")
    plot: str | None = Field(None, description="registered figure drawn from the rows (null: none)")
    paper: dict[str, Any] = Field(default_factory=dict, description="the paper's source and notes")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of each run: protocol runs, every run's `threads` (as the experiment's own, split "
        "over --jobs; null: the experiment's); other protocols, the runs in this process (null: 1; workers use 1)",
    )

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, v: str) -> str:
        if v not in builtin_protocols():
            raise ValueError(f"unknown protocol {v!r}; allowed: {sorted(PROTOCOLS)}")
        return v

    @property
    def grid(self) -> bool:
        """Whether the suite is a grid of plain runs (``protocol: runs``)."""
        return self.protocol == "runs"

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(set(v)) != len(v) or min(v) < 0):
            raise ValueError(f"seeds must be distinct non-negative integers, got {v}")
        return v

    @model_validator(mode="after")
    def _plot_args(self):
        from fedsolve.experiments.grid import axis_names, check_axes, check_folders, grid_cells

        check_axes(self.sweep, self.zip)
        if self.seeds is None and not self.grid:
            self.seeds = [0]
        axes = axis_names(self.sweep, self.zip)
        if self.experiment is None and "experiment" not in axes:
            raise ValueError("experiment: give the experiment YAML (or an `experiment` axis)")
        if not self.grid and (self.references or self.folders or self.metric):
            raise ValueError(
                f"references, folders and metric: for protocol runs only (this suite's protocol is "
                f"{self.protocol!r}); allowed: leave them unset"
            )
        if self.grid:
            check_folders(grid_cells(self.sweep, self.zip), self.folders)
        p = builtin_protocols()[self.protocol]
        try:
            p.Args(**self.args)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(
                f"args.{'.'.join(map(str, err['loc']))}: {err['msg']}; allowed: {sorted(p.Args.model_fields)}"
            ) from None
        if self.plot is not None and self.plot not in PLOTS:
            raise ValueError(f"plot: unknown {self.plot!r}; allowed: {sorted(PLOTS)} or null")
        missing = sorted(set(p.axes) - set(axes))
        if missing:
            raise ValueError(f"sweep: protocol {self.protocol!r} needs the axes {missing}")
        return self


class ReferenceSpec(BaseModel):
    """A reference run on every cell of a grid of runs: another experiment (a centralized bound, a source-only
    model) with the cell's axes applied where they fit (a ``params.<p>`` axis only to algorithms that have ``p``),
    into the cell's subfolder ``folder``; its rows are the table rows of its algorithms' labels."""

    model_config = ConfigDict(extra="forbid")
    experiment: str | dict[str, Any] = Field(..., description="experiment YAML (relative to the suite) or inline")
    folder: str = Field(..., min_length=1, description="subfolder of each cell, e.g. central")
    algorithms: list[str] | None = Field(None, description="labels of its algorithms to run (null: all)")
    set: list[str] = Field(default_factory=list, description="overrides of it (key=value), after the suite's set")
    skip: list[str] = Field(default_factory=list, description="axes of the grid not applied to it")
    label: str | None = Field(
        None,
        description="its rows' label (default: its algorithm's; with several "
        "algorithms '<label>: <algorithm>'), e.g. source only",
    )


SuiteConfig.model_rebuild()
SUITE_FIELDS = set(SuiteConfig.model_fields)


def load_suite(path: str | Path, overrides: list[str] | None = None) -> tuple[SuiteConfig, Path]:
    """The suite at ``path`` with ``--set`` ``overrides`` (a key under ``experiment.`` goes to the experiment's
    ``set`` list, any other to the suite); returns the suite and the folder its relative paths start from."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"suite: no file {path}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not is_suite(raw):
        raise ConfigError(
            f"{path}: not a suite (a YAML mapping with an `experiment` or a `protocol`); experiment "
            f"configs run with `fedsolve run|compare` (or `fedsolve suite`, as a grid of one cell)"
        )
    mine, theirs = [], []
    for item in overrides or []:
        key = item.split("=", 1)[0].strip()
        if key.startswith("experiment."):
            theirs.append(item[len("experiment.") :].lstrip())
        elif key.split(".")[0] in SUITE_FIELDS:
            mine.append(item)
        else:
            raise ConfigError(
                f"--set {key}: not a suite field; allowed: {sorted(SUITE_FIELDS)} or "
                f"experiment.<field> (e.g. experiment.simulation.rounds=5)"
            )
    raw = apply_overrides(raw, mine)
    raw["set"] = list(raw.get("set") or []) + theirs
    try:
        suite = SuiteConfig(**raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(map(str, err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            msg = f"unknown key; allowed keys: {sorted(SuiteConfig.model_fields)}"
        raise ConfigError(f"{path.name}: {loc + ': ' if loc else ''}{msg}") from None
    base = path.resolve().parent
    if suite.grid:
        from fedsolve.experiments.grid import grid_configs

        grid_configs(suite, base)  # every cell's experiment loads and validates now
    else:
        ctx = Context(suite, base)
        for cell in experiment_cells(suite):  # the experiment loads and validates now, not in a worker
            ctx.experiment(cell)
    return suite, base


def is_suite(raw: Any) -> bool:
    """Whether a YAML mapping is a suite (it names an ``experiment`` or a ``protocol``), not an experiment."""
    return isinstance(raw, dict) and ("protocol" in raw or "experiment" in raw)


def experiment_cells(suite: SuiteConfig) -> list[dict]:
    """One cell per experiment file of the grid (``{}`` when there is no ``experiment`` axis)."""
    from fedsolve.experiments.grid import grid_cells

    srcs = dict.fromkeys(c["experiment"] for c in grid_cells(suite.sweep, suite.zip) if "experiment" in c)
    return [{"experiment": s} for s in srcs] or [{}]


# ------------------------------------------------------------------ protocols
@dataclass(frozen=True)
class Protocol:
    """``run(ctx) -> row | [rows]`` for one cell (None: the grid of plain runs, ``protocol: runs``); ``Args``: its
    typed arguments; ``axes``: sweep axes it needs; ``algorithms``: whether cells run per algorithm;
    ``key(ctx) -> cell``: the cell whose run serves this one (a run shared by several cells, e.g. no attack at
    fraction 0); ``check(ctx)``: raises ValueError for a cell its ``args`` cannot serve (an unknown label or field),
    called for every cell before any runs, so a bad argument is one config error, not a traceback mid-suite."""

    run: Callable[[Context], dict | list[dict]] | None
    Args: type[BaseModel]
    axes: tuple[str, ...] = ()
    algorithms: bool = True
    key: Callable[[Context], dict] | None = None
    check: Callable[[Context], None] | None = None

    @property
    def description(self) -> str:
        """What it runs per cell, in a clause (``fedsolve list protocols``): its function's docstring up to the
        first ``;`` or full stop outside parentheses."""
        if self.run is None:
            return "a grid of plain runs: per cell a compare folder of algorithms x seeds (the default)"
        doc = " ".join((self.run.__doc__ or "").split()).replace("``", "")
        depth = 0
        for i, ch in enumerate(doc):
            depth += (ch == "(") - (ch == ")")
            if (
                depth == 0
                and doc[i : i + 2] in ("; ", ". ")
                and not doc[max(0, i - 4) : i].endswith(("Sec", "Eq", "Fig"))
            ):
                return doc[:i]
        return doc.rstrip(".")


class RunsArgs(BaseModel):
    """``protocol: runs`` takes no arguments: its runs are the experiment's (algorithms, tuning, schedules)."""

    model_config = ConfigDict(extra="forbid")


PROTOCOLS: dict[str, Protocol] = {}
PLOTS: dict[str, Callable[[list[dict], SuiteConfig, Path], None]] = {}


def builtin_protocols() -> dict[str, Protocol]:
    """The registry, with the built-in protocols (``fedsolve.families.clustered.protocols.tables``,
    ``fedsolve.families.constrained.runs``) and figures
    (``fedsolve.families.clustered.figures``) registered on first use."""
    if "attack_grid" not in PROTOCOLS:
        register_protocol("runs", Protocol(None, RunsArgs, algorithms=False))
        from fedsolve.families.clustered import figures as f
        from fedsolve.families.clustered.protocols import tables as t

        register_protocol("lambda_path", Protocol(t.lambda_path, t.LambdaPathArgs))
        register_protocol(
            "attack_grid",
            Protocol(
                t.attack_grid, t.AttackGridArgs, axes=("attack", "fraction"), key=t.attack_grid_key, check=t.picks_check
            ),
        )
        register_protocol("newcomers", Protocol(t.newcomers, t.NewcomersArgs, check=t.picks_check))
        register_protocol("fpfc_tuning", Protocol(t.fpfc_tuning, t.FPFCTuningArgs, axes=("strategy",)))
        register_protocol("tuning", Protocol(t.tuning, t.TuningArgs, check=t.tuning_check))
        register_protocol("oracle_gap", Protocol(t.oracle_gap, t.OracleGapArgs, algorithms=False))
        from fedsolve.families.constrained import runs as c

        register_protocol(
            "constrained_runs", Protocol(c.constrained_run, c.ConstrainedRunsArgs, key=c.constrained_run_key)
        )
        from fedsolve.families.constrained import optimum as o

        register_protocol("np_optimum", Protocol(o.np_optimum_cell, o.NpOptimumArgs, algorithms=False))
        from fedsolve.families.clustered.protocols import snapshots as sn

        register_protocol("pairwise_snapshots", Protocol(sn.pairwise_snapshots, sn.SnapshotArgs))
        register_plot("attack_grid", f.attack_grid_figure)
        register_plot("lambda_path", f.lambda_path_figure)
        register_plot("pairwise_snapshots", f.pairwise_snapshots_figure)
    return PROTOCOLS


def register_protocol(name: str, protocol: Protocol) -> None:
    PROTOCOLS[name] = protocol


def register_plot(name: str, fn: Callable) -> None:
    PLOTS[name] = fn


class Context:
    """What a protocol sees for one cell: the suite, its ``args``, the ``cell`` (axes, ``algorithm``, ``seed``),
    the cell's experiment and algorithm spec, and builders for data, problems, algorithms and simulation
    settings (the same ones ``fedsolve compare`` uses)."""

    def __init__(self, suite: SuiteConfig, base: Path, cell: dict | None = None):
        self.suite, self.base, self.cell = suite, base, dict(cell or {})
        self.args = PROTOCOLS[suite.protocol].Args(**suite.args)

    def for_cell(self, cell: dict) -> Context:
        ctx = Context.__new__(Context)
        ctx.suite, ctx.base, ctx.args, ctx.cell = self.suite, self.base, self.args, dict(cell)
        ctx._cache = self._caches()
        return ctx

    def _caches(self) -> dict:
        if "_cache" not in vars(self):
            self._cache: dict[Any, Any] = {}
        return self._cache

    @property
    def seed(self) -> int:
        return int(self.cell["seed"])

    # -------------------------------------------------------------- experiment
    def experiment(self, cell: dict | None = None) -> ExperimentConfig:
        """The cell's experiment: its file (the ``experiment`` axis, else the suite's) with the suite's ``set`` and
        the cell's dotted axes applied (:func:`fedsolve.experiments.grid.load_experiment`)."""
        from fedsolve.experiments.grid import experiment_sets, load_experiment

        cell = self.cell if cell is None else cell
        src = cell.get("experiment", self.suite.experiment)
        if src is None:  # the suite's validator asks for one of them
            raise ConfigError("experiment: give the experiment YAML (or an `experiment` axis)")
        sets = list(self.suite.set) + experiment_sets(cell)
        key = ("experiment", json.dumps(src, sort_keys=True, default=str), tuple(sets))
        cache = self._caches()
        if key not in cache:
            cache[key] = load_experiment(src, self.base, sets, self.suite.name)
        return cache[key]

    def specs(self) -> list[AlgorithmSpec]:
        """The experiment's algorithm specs the suite runs (``algorithms``: labels, in the suite's order)."""
        specs = self.experiment({}).all_algorithms()
        if self.suite.algorithms is None:
            return specs
        by = {s.display: s for s in specs} | {s.name: s for s in specs}
        unknown = [a for a in self.suite.algorithms if a not in by]
        if unknown:
            raise ConfigError(f"algorithms: {unknown} not in the experiment; allowed: {[s.display for s in specs]}")
        return [by[a] for a in self.suite.algorithms]

    @property
    def spec(self) -> AlgorithmSpec:
        label = self.cell["algorithm"]
        spec = next(s for s in self.experiment().all_algorithms() if label in (s.display, s.name))
        extra = {k[len("params.") :]: v for k, v in self.cell.items() if k.startswith("params.")}
        return spec.model_copy(update={"params": {**spec.params, **extra}}) if extra else spec

    def params(self, name: str | None = None, extra: dict | None = None) -> dict:
        """The cell's algorithm parameters (the experiment's ``defaults`` merged with its spec and ``extra``)."""
        from fedsolve.families import get_algorithm

        spec = self.spec
        return merged_params(
            get_algorithm(name or spec.name), self.experiment().defaults, {**spec.params, **(extra or {})}
        )

    def algorithm(self, problem, extra: dict | None = None, name: str | None = None):
        from fedsolve.families import get_algorithm

        return get_algorithm(name or self.spec.name)(self.params(name, extra), problem)

    # -------------------------------------------------------------- data and runs
    def data(self, seed: int | None = None):
        """The experiment's data for ``seed`` (default: the cell's), built once per process and seed."""
        from fedsolve.experiments.runner import build_data

        cfg = self.experiment()
        seed = self.seed if seed is None else seed
        key = ("data", cfg.model_dump_json(include={"data"}), seed)
        cache = self._caches()
        if key not in cache:
            for k in [k for k in cache if k[0] == "data"][:-1]:  # keep at most two data sets
                del cache[k]
            cache[key] = build_data(cfg, seed)
        return cache[key]

    def problem(self, data=None, clients=None, name: str | None = None):
        """The experiment's problem (model, blocks, loss) on ``data`` (default: the cell's), restricted to
        ``clients`` if given."""
        from fedsolve.experiments.runner import build_problem

        data = self.data() if data is None else data
        prob = build_problem(self.experiment(), 0, data=data.subset(list(clients)) if clients is not None else data)
        if name:
            prob.name = name
        return prob

    def sim_config(self, rounds: int | None = None, eval_every: int | None = None, **update):
        """The experiment's simulation settings with ``rounds`` (default: its own) evaluated only at the end
        (or every ``eval_every``), no extra metrics."""
        sc = self.experiment().simulation
        rounds = sc.rounds if rounds is None else rounds
        return sc.model_copy(update={"rounds": rounds, "eval_every": eval_every or rounds, "metrics": [], **update})

    def run(self, problem, algo, rounds: int | None = None, eval_every: int | None = None, callbacks=()):
        """Run ``algo`` on ``problem`` for the cell's seed; returns (simulation, result)."""
        from fedsolve.engine import Simulation

        sim = Simulation(problem, algo, self.sim_config(rounds, eval_every), seed=self.seed, callbacks=list(callbacks))
        return sim, sim.run()


# ------------------------------------------------------------------ cells, resume, workers
def cells(suite: SuiteConfig, base: Path) -> list[dict]:
    """Every cell of the suite: the product of the sweep axes and zip groups (:func:`~fedsolve.experiments.grid.
    grid_cells`), the algorithms (if the protocol runs per algorithm) and the seeds, in that order. A grid of
    runs has one cell per grid point (its algorithms x seeds are the runs of its compare folder)."""
    from fedsolve.experiments.grid import grid_cells

    grid = grid_cells(suite.sweep, suite.zip)
    if suite.grid:
        return grid
    proto = PROTOCOLS[suite.protocol]
    axes: dict[str, list] = {}
    if proto.algorithms:
        axes["algorithm"] = [s.display for s in Context(suite, base).specs()]
    axes["seed"] = list(suite.seeds or [0])  # set by the validator for every protocol but runs
    return [{**g, **dict(zip(axes, vals))} for g in grid for vals in itertools.product(*axes.values())]


def cell_key(cell: dict) -> str:
    text = json.dumps(cell, sort_keys=True, default=str)
    slug = "_".join(str(v) for v in cell.values()).replace("/", "-").replace(" ", "-")[:60]
    return f"{slug}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def _run_key(ctx: Context) -> dict:
    key = PROTOCOLS[ctx.suite.protocol].key
    return key(ctx) if key is not None else ctx.cell


_WORKER: dict[str, Context] = {}


def run_cell(ctx: Context) -> list[dict]:
    """The protocol on one cell; rows tagged with the cell's fields. A diverged run is a row with
    ``diverged`` (a finding, not a crash)."""
    from fedsolve.engine.loop import DivergenceError

    t0 = time.perf_counter()
    run = PROTOCOLS[ctx.suite.protocol].run
    assert run is not None, "a grid of plain runs has no cells of its own"
    try:
        out = run(ctx)
    except DivergenceError as e:
        out = {"diverged": str(e).split(":")[0]}
    rows = out if isinstance(out, list) else [out]
    wall = time.perf_counter() - t0
    return [{**r, "wall_s": wall} for r in rows]


def _worker_cell(dump: dict, base: str, cell: dict) -> list[dict]:
    key = json.dumps(dump, sort_keys=True)
    if key not in _WORKER:
        _WORKER.clear()
        _WORKER[key] = Context(SuiteConfig(**dump), Path(base))
    return run_cell(_WORKER[key].for_cell(cell))


def _set_threads(n: int, source: tuple[str, bool | None] | None = None) -> None:
    """A worker's start: its torch threads, and the parent's pinned source commit (:func:`pin_source`)."""
    import torch

    torch.set_num_threads(n)
    if source is not None:
        pin_source(source)


# settings that do not change a cell's numbers: a report may be redrawn with other tables on --resume
REPORT_ONLY = ("name", "description", "tables", "plot", "paper", "threads", "metric")


def _settings(suite: SuiteConfig, base: Path) -> dict:
    """What decides a cell's numbers: the suite's fields but the report's (the grid's fields only where set, as
    a suite folder written before them records them), and each experiment as resolved (so a changed experiment
    file is seen too)."""
    out = json.loads(suite.model_dump_json(exclude=set(REPORT_ONLY)))
    for k in ("zip", "references", "folders"):
        if not out.get(k):
            out.pop(k, None)
    ctx = Context(suite, base)
    resolved = {
        c.get("experiment", ""): json.loads(
            ctx.experiment(c).model_dump_json(exclude={"name", "description", "paper", "out_dir", "threads"})
        )
        for c in experiment_cells(suite)
    }
    out["resolved_experiment"] = resolved.pop("") if "" in resolved else resolved
    return out


def run_suite(
    suite: SuiteConfig,
    base: Path,
    out: str | Path,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = True,
    batch: bool = True,
    track: list[str] | tuple = (),
) -> list[dict]:
    """Run every missing cell of ``suite`` into ``out`` (a protocol's: one file per cell in ``out/cells/``, written
    atomically as it ends, with the provenance of the code that ran it; a grid of runs: one compare folder per
    cell, :func:`fedsolve.experiments.grid.run_grid`, with ``batch`` and ``track``), then write the report.
    Returns every row, tagged with its cell. The folder is locked while the suite is live and marked ``running``
    in its ``run.json`` until it ends (:class:`~fedsolve.engine.run_folder.RunFolder`)."""
    out = Path(out)
    settings = _settings(suite, base)
    with RunFolder(out, "suite") as folder:
        _check_folder(out, settings, resume)
        folder.start(provenance(None, settings))
        for derived in ("report.md", "results.json"):  # rebuilt at the end
            (out / derived).unlink(missing_ok=True)
        if suite.grid:
            from fedsolve.experiments.grid import run_grid

            atomic_write_text(out / "suite.json", json.dumps(settings, indent=1, sort_keys=True))
            t0 = time.perf_counter()
            rows = run_grid(suite, base, out, jobs=jobs, resume=resume, progress=progress, batch=batch, track=track)
            write_report(suite, rows, out, time.perf_counter() - t0)
        else:
            rows = _run_cells(suite, base, out, settings, jobs, progress)
        folder.finish("completed")
        return rows


def _check_folder(out: Path, settings: dict, resume: bool) -> None:
    """Refuse ``out`` when it holds another kind of folder, or a suite run without ``resume``, or one run with
    other settings (:func:`_settings`)."""
    kind = folder_kind(out)
    if kind not in (None, "suite"):
        raise ConfigError(f"--out {out}: holds a {kind} folder, not a suite; allowed: a new folder or a suite folder")
    settings_file = out / "suite.json"
    if settings_file.exists():
        old = read_json(settings_file)
        if not resume:
            raise ConfigError(f"--out {out}: already holds a suite run; use --resume to continue it or another --out")
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise ConfigError(
                f"--resume: {out} was run with other settings ({', '.join(diff)} differ); use another --out"
            )


def _run_cells(suite: SuiteConfig, base: Path, out: Path, settings: dict, jobs: int, progress: bool) -> list[dict]:
    """:func:`run_suite` in its locked folder."""
    ctx = Context(suite, base)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "suite.json", json.dumps(settings, indent=1, sort_keys=True))
    _set_threads(suite.threads or 1)
    t0 = time.perf_counter()
    all_cells = cells(suite, base)
    check = PROTOCOLS[suite.protocol].check
    runs: dict[str, dict] = {}  # run key -> the cell that runs it
    serves: list[tuple[dict, str]] = []
    for cell in all_cells:
        if check is not None:
            try:
                check(ctx.for_cell(cell))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        rk = _run_key(ctx.for_cell(cell))
        k = cell_key(rk)
        runs.setdefault(k, rk)
        serves.append((cell, k))
    done = {k for k in runs if (out / "cells" / f"{k}.json").exists()}
    todo = {k: c for k, c in runs.items() if k not in done}

    def store(k: str, rows: list[dict]) -> None:
        record = {
            "cell": runs[k],
            "rows": rows,
            "provenance": provenance(None, {"settings": settings, "cell": runs[k]}),
        }
        atomic_write_text(out / "cells" / f"{k}.json", json.dumps(record, default=float))
        if progress:
            print(
                f"[{len(runs) - len(todo) + stored[0]}/{len(runs)}] {runs[k]}: "
                + "; ".join(_brief(r) for r in rows[:3]),
                flush=True,
            )

    stored = [0]
    if jobs <= 1 or len(todo) <= 1:
        for k, cell in todo.items():
            stored[0] += 1
            store(k, run_cell(ctx.for_cell(cell)))
    else:
        dump = json.loads(suite.model_dump_json())
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(todo)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_set_threads,
            initargs=(1, pin_source()),
        ) as pool:
            futs = {pool.submit(_worker_cell, dump, str(base), cell): k for k, cell in todo.items()}
            error = None
            for f in as_completed(futs):
                try:
                    rows = f.result()
                except Exception as e:  # noqa: BLE001  (keep what the other workers finish, start nothing new, then raise)
                    error = error or e
                    for other in futs:
                        other.cancel()
                    continue
                stored[0] += 1
                store(futs[f], rows)
            if error is not None:
                raise error
    rows = []
    for cell, k in serves:
        saved = read_json(out / "cells" / f"{k}.json")["rows"]
        rows += [{**r, **cell} for r in saved]
    write_report(suite, rows, out, time.perf_counter() - t0, kept=len(done))
    return rows


def _brief(r: dict) -> str:
    return ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in r.items()
        if isinstance(v, (int, float, str)) and k != "wall_s"
    )


# ------------------------------------------------------------------ report
def write_report(suite: SuiteConfig, rows: list[dict], out: Path, wall: float, kept: int = 0) -> None:
    """``out/report.md``: what ran, each table with the paper's numbers, the figure; ``out/results.json``."""
    what = (
        "a grid of runs (one compare folder per cell)"
        if suite.grid
        else f"Protocol `{suite.protocol}` with {json.dumps(suite.args, default=str)}"
    )
    zipped = f"; zipped {json.dumps(suite.zip, default=str)}" if suite.zip else ""
    refs = f"; references {[r.folder for r in suite.references]}" if suite.references else ""
    lines = [
        f"# {suite.name}",
        "",
        suite.description.strip(),
        "",
        f"{what}; sweep {json.dumps(suite.sweep, default=str)}{zipped}; algorithms "
        f"{suite.algorithms or 'all of the experiment'}{refs}; seeds {suite.seeds or 'of each experiment'}; "
        f"experiment "
        f"{_experiment_name(suite)}"
        + (f" with {suite.set}" if suite.set else "")
        + ". Values: mean +- sample SD over the seeds (n = "
        f"{len({r.get('seed') for r in rows})} unless a cell says otherwise).",
        "",
    ]
    if suite.paper:
        lines += (
            [f"Paper: {suite.paper.get('source', '')}"]
            + ([str(suite.paper["note"]).strip()] if suite.paper.get("note") else [])
            + [""]
        )
    tables = suite.tables
    if suite.grid and not tables:  # the metric the paper reports, per algorithm and cell
        metric = suite.metric or next(
            (m for m in ("test_accuracy", "test_rmse", "train_loss") if any(m in r for r in rows)), "test_accuracy"
        )
        tables = [
            TableSpec(metric=metric, columns="cell" if len({r.get("cell") for r in rows}) > 1 else None, digits=4)
        ]
    for t in tables:
        lines += table_lines(t, rows)
    if suite.grid:
        from fedsolve.experiments.grid import tuning_lines

        lines += tuning_lines(rows)
    if suite.plot is not None:
        PLOTS[suite.plot](rows, suite, out / f"{suite.plot}.png")
        lines += [f"![{suite.plot}]({suite.plot}.png)", ""]
    lines.append(f"Wall time {wall:.0f} s" + (f" ({kept} runs kept by --resume)" if kept else "") + ".")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "results.json", json.dumps(rows, indent=1, default=float))


def _experiment_name(suite: SuiteConfig) -> str:
    if suite.experiment is None:
        return "per cell (the experiment axis)"
    return suite.experiment if isinstance(suite.experiment, str) else "inline"


def main(
    path: str,
    out: str | None = None,
    jobs: int = 1,
    resume: bool = False,
    sets: list[str] | None = None,
    progress: bool = True,
    batch: bool = True,
    track: list[str] | tuple = (),
) -> list[dict]:
    """``fedsolve suite``: load, run every missing cell, write the report (default folder ``runs/<name>``).
    ``batch``: runs that differ only in seed and scalar hyper-parameters train as one batch (``--no-batch-sweeps``
    turns it off); ``track``: the tracking writers of a grid's runs."""
    if jobs < 1:
        raise ConfigError(f"--jobs: expected a whole number >= 1 (worker processes), got {jobs}")
    suite, base = load_suite(path, sets)
    folder = Path(out) if out else Path("runs") / suite.name
    busy = busy_above(folder)  # a live run in it or in a folder around it
    if busy is not None:
        raise busy
    rows = run_suite(suite, base, folder, jobs=jobs, resume=resume, progress=progress, batch=batch, track=track)
    if progress:
        print(f"report: {folder / 'report.md'}")
    return rows
