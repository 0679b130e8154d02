"""The grid of a suite: its cells, the experiment config of a cell, and the folder a cell writes.

A suite's cells are the product of its axes: each ``sweep`` axis is a list of values, each ``zip`` group a mapping
of axes whose lists have one length and vary together (FedMM's eta3 with the loss, a source with its target), one
group counting as one axis of the product. An axis name says what it sets:

* ``experiment``: the experiment YAML of the cell (a path relative to the suite file);
* ``params.<p>``: the algorithm hyper-parameter ``p`` -- of the cell's algorithm under a protocol, of every
  algorithm of the cell that has it in a grid of runs (``protocol: runs``);
* another dotted name (``data.params.p``, ``problem.params.loss``, ``simulation.rounds``,
  ``algorithms.0.params.eta3``): an experiment field, set as ``--set`` sets it;
* any other name: a protocol's input (``attack``, ``fraction``, ``strategy``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedsolve.experiments.config import ConfigError, ExperimentConfig, apply_overrides, parse_config
from fedsolve.experiments.folders import slug

RESERVED = ("seed", "algorithm")


def check_axes(sweep: dict[str, list[Any]], zips: list[dict[str, list[Any]]]) -> None:
    """Refuse an empty axis, a reserved name (``seed``, ``algorithm``: the suite's ``seeds`` and ``algorithms``),
    an axis given twice, and a ``zip`` group whose lists differ in length (a ValueError naming the field)."""
    seen: set[str] = set()
    for where, axes in [("sweep", sweep)] + [(f"zip.{i}", g) for i, g in enumerate(zips)]:
        if where.startswith("zip") and not axes:
            raise ValueError(f"{where}: give at least one axis")
        for k, vals in axes.items():
            if not isinstance(vals, list) or not vals:
                raise ValueError(f"{where}.{k}: give a list of at least one value")
            if k in RESERVED:
                raise ValueError(f"{where}.{k}: use the suite's `{k}s` field")
            if k in seen:
                raise ValueError(
                    f"{where}.{k}: the axis is given twice; allowed: each axis once, in sweep or in one zip group"
                )
            seen.add(k)
        lengths = {k: len(v) for k, v in axes.items()}
        if where.startswith("zip") and len(set(lengths.values())) > 1:
            raise ValueError(
                f"{where}: the axes of a zip group vary together, so their lists need one length; got {lengths}"
            )


def axis_names(sweep: dict[str, list[Any]], zips: list[dict[str, list[Any]]]) -> list[str]:
    return list(sweep) + [k for g in zips for k in g]


def grid_cells(sweep: dict[str, list[Any]], zips: list[dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the axes (module docstring), the sweep's axes first, then the zip groups, each in
    declaration order; ``[{}]`` when there is none."""
    groups = [[{k: v} for v in vals] for k, vals in sweep.items()]
    groups += [[dict(zip(g, vals)) for vals in zip(*g.values())] for g in zips]
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*groups)]


def experiment_sets(cell: dict[str, Any]) -> list[str]:
    """The ``--set`` strings of a cell's experiment fields (its dotted axes other than ``params.<p>``)."""
    return [f"{k}={json.dumps(v)}" for k, v in cell.items() if "." in k and not k.startswith("params.")]


def cell_params(cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's ``params.<p>`` axes as ``{p: value}``."""
    return {k[len("params.") :]: v for k, v in cell.items() if k.startswith("params.")}


def load_experiment(
    src: str | dict[str, Any], base: Path, sets: list[str], name: str, keep_seeds: bool = False
) -> ExperimentConfig:
    """The experiment ``src`` (a YAML path relative to ``base``, or its fields inline) with ``sets`` applied;
    ``name`` where it gives none; its own ``seeds`` dropped (a suite's seeds rule) unless ``keep_seeds``. A
    ConfigError names the file and the field."""
    if isinstance(src, str):
        p = base / src
        if not p.is_file():
            raise ConfigError(f"experiment: no file {src} next to the suite")
        raw = yaml.safe_load(p.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"experiment: {src} is not a YAML mapping")
    else:
        raw = dict(src)
    raw.setdefault("name", name)
    if not keep_seeds:
        raw.pop("seeds", None)
    try:
        return parse_config(apply_overrides(raw, sets))
    except (ValueError, ConfigError) as e:
        raise ConfigError(f"experiment: {e}") from None


def with_params(cfg: ExperimentConfig, params: dict[str, Any], where: str = "params") -> ExperimentConfig:
    """``cfg`` with each of ``params`` set on every algorithm whose config has that field (a grid's ``params.<p>``
    axes); a parameter no algorithm of ``cfg`` has is refused, naming the axis."""
    from fedsolve.families import get_algorithm

    if not params:
        return cfg
    specs = cfg.all_algorithms()
    for p in params:
        if not any(p in get_algorithm(s.name).Config.model_fields for s in specs):
            raise ConfigError(
                f"{where}.{p}: no algorithm of the experiment has the hyper-parameter {p!r}; allowed: "
                f"{sorted({f for s in specs for f in get_algorithm(s.name).Config.model_fields})}"
            )
    new = [
        s.model_copy(
            update={
                "params": {
                    **s.params,
                    **{p: v for p, v in params.items() if p in get_algorithm(s.name).Config.model_fields},
                }
            }
        )
        for s in specs
    ]
    raw = cfg.model_dump(mode="json", exclude_none=False)
    if cfg.algorithms:
        raw["algorithms"] = [s.model_dump(mode="json") for s in new]
    else:
        raw["algorithm"] = new[0].model_dump(mode="json")
    return parse_config(raw)


def only_algorithms(cfg: ExperimentConfig, labels: list[str] | None, where: str = "algorithms") -> ExperimentConfig:
    """``cfg`` with only the algorithms ``labels`` (labels or names, in that order); None: all of them."""
    if labels is None:
        return cfg
    specs = cfg.all_algorithms()
    by = {s.name: s for s in specs} | {s.display: s for s in specs}
    unknown = [a for a in labels if a not in by]
    if unknown:
        raise ConfigError(f"{where}: {unknown} not in the experiment; allowed: {[s.display for s in specs]}")
    return cfg.model_copy(update={"algorithms": [by[a] for a in labels], "algorithm": None})


def relabel(cfg: ExperimentConfig, label: str | None) -> ExperimentConfig:
    """``cfg`` with its algorithms' labels ``label`` (one algorithm) or ``<label>: <its label>`` (several)."""
    if label is None:
        return cfg
    specs = cfg.all_algorithms()
    new = [s.model_copy(update={"label": label if len(specs) == 1 else f"{label}: {s.display}"}) for s in specs]
    return cfg.model_copy(update={"algorithms": new, "algorithm": None})


def cell_folder(cell: dict[str, Any], pattern: str | None = None) -> str:
    """The folder (relative to the suite's) of a cell: ``pattern`` with each ``{axis}`` replaced by the cell's value
    (``{problem.params.regime}/{data.params.source}_{data.params.target}``), else ``<axis>=<value>`` joined by
    ``_`` (each axis by its last dotted part where that is unique), ``all`` for a grid without axes."""
    if pattern is not None:
        out = pattern
        for k, v in cell.items():
            out = out.replace("{" + k + "}", slug(str(v)))
        return out
    short = {k: k.rsplit(".", 1)[-1] for k in cell}
    names = {k: s if list(short.values()).count(s) == 1 else k for k, s in short.items()}
    return "_".join(f"{slug(names[k])}={slug(str(v))}" for k, v in cell.items()) or "all"


def check_folders(cells: list[dict[str, Any]], pattern: str | None) -> None:
    """Refuse a ``folders`` pattern that names an axis the grid lacks or gives two cells one folder."""
    if pattern is not None:
        import re

        unknown = sorted(set(re.findall(r"\{([^{}]+)\}", pattern)) - set(cells[0]))
        if unknown:
            raise ValueError(f"folders: {unknown} are not axes of the grid; allowed: {sorted(cells[0])}")
        if ".." in Path(pattern).parts or Path(pattern).is_absolute():
            raise ValueError(f"folders: {pattern!r} leaves the suite's folder; allowed: a relative path")
    seen: dict[str, dict] = {}
    for c in cells:
        other = seen.setdefault(cell_folder(c, pattern), c)
        if other is not c:
            raise ValueError(
                f"folders: the cells {other} and {c} share the folder {cell_folder(c, pattern)!r}; "
                f"allowed: a pattern that names every axis that varies"
            )


# ------------------------------------------------------------------ a grid of runs
@dataclass(frozen=True)
class GridCell:
    """One compare folder of a grid of runs: the cell's axes, its experiment config (algorithms and seeds as the
    suite says), its folder relative to the suite's, and the reference it runs (None: the experiment itself)."""

    cell: dict[str, Any]
    cfg: ExperimentConfig
    folder: str
    reference: str | None = None


def grid_configs(suite, base: Path) -> list[GridCell]:
    """Every compare folder of a grid suite (``protocol: runs``): per cell the experiment, then each reference,
    with the suite's ``set``, the cell's axes (a reference's ``skip`` left out; ``params.<p>`` only on algorithms
    that have ``p``), the suite's algorithms and seeds. Every config is built and checked here."""
    from fedsolve.families import get_algorithm

    out = []
    own = suite.seeds is None  # each experiment's own seeds
    for cell in grid_cells(suite.sweep, suite.zip):
        folder = cell_folder(cell, suite.folders)
        cfg = load_experiment(
            cell.get("experiment", suite.experiment),
            base,
            list(suite.set) + experiment_sets(cell),
            suite.name,
            keep_seeds=own,
        )
        cfg = only_algorithms(with_params(cfg, cell_params(cell)), suite.algorithms)
        update: dict[str, Any] = {"seeds": cfg.seeds if own else list(suite.seeds)}
        if suite.threads is not None:  # the suite's `threads` is every run's (null: the experiment's own)
            update["threads"] = suite.threads
        out.append(GridCell(cell, cfg.model_copy(update=update), folder))
        for i, ref in enumerate(suite.references):
            mine = {k: v for k, v in cell.items() if k not in ref.skip and k != "experiment"}
            rcfg = load_experiment(
                ref.experiment, base, list(suite.set) + list(ref.set) + experiment_sets(mine), suite.name
            )
            fields = {f for s in rcfg.all_algorithms() for f in get_algorithm(s.name).Config.model_fields}
            rcfg = with_params(rcfg, {p: v for p, v in cell_params(mine).items() if p in fields})
            rcfg = relabel(only_algorithms(rcfg, ref.algorithms, f"references.{i}.algorithms"), ref.label)
            out.append(GridCell(cell, rcfg.model_copy(update=update), f"{folder}/{ref.folder}", ref.folder))
    return out


def run_grid(
    suite,
    base: Path,
    out: Path,
    jobs: int = 1,
    resume: bool = False,
    progress: bool = True,
    batch: bool = True,
    track=(),
) -> list[dict[str, Any]]:
    """Every run of a grid suite into its compare folder under ``out`` (:func:`grid_configs`), all of them through
    one :func:`~fedsolve.experiments.compare.run_compares` (resume per run folder, ``jobs`` worker processes,
    sweeps as one batch); returns one row per run (:func:`run_row`)."""
    from fedsolve.experiments.compare import run_compares

    cells = grid_configs(suite, base)
    run_compares(
        [(c.cfg, out / c.folder) for c in cells], resume=resume, progress=progress, jobs=jobs, track=track, batch=batch
    )
    return [
        run_row(c, spec.display, seed, out) for c in cells for seed in c.cfg.seeds for spec in c.cfg.all_algorithms()
    ]


def run_row(c: GridCell, label: str, seed: int, out: Path) -> dict[str, Any]:
    """The table row of one run: the cell's axes, ``cell`` (the cell's folder), ``algorithm``, ``seed``, ``reference``
    (for a reference's run), every final metric, ``best_<metric>`` (the best over the evaluated rounds),
    ``rounds``, ``wall_s``, ``diverged`` (the message of a run that did not complete) and ``tuned`` (the
    tuning record: grid, validation scores, pick, edge)."""
    from fedsolve.experiments.folders import default_run_dir
    from fedsolve.experiments.records import read_json

    spec = next(s for s in c.cfg.all_algorithms() if s.display == label)
    s = read_json(default_run_dir(c.cfg, spec, seed, out / c.folder) / "summary.json")
    cell = c.folder if c.reference is None else c.folder.rsplit("/", 1)[0]  # a reference sits in its cell
    row: dict[str, Any] = {**c.cell, "cell": cell, "algorithm": label, "seed": seed}
    if c.reference is not None:
        row["reference"] = c.reference
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    row.update({k: v for k, v in s["metrics"]["final"].items() if num(v)})
    row.update({f"best_{k}": v for k, v in s["metrics"]["best"].items() if num(v)})
    row.update(rounds=s.get("rounds"), wall_s=s.get("wall_time_s"))
    if s.get("status") != "completed":
        row["diverged"] = (s.get("message") or s.get("status") or "").split(":")[0]
    tuned = (s.get("extras") or {}).get("tuned")
    if tuned:
        row["tuned"] = {
            k: tuned.get(k) for k in ("param", "value", "grid", "scores", "metric", "edge", "val_fraction", "rounds")
        }
    return row


def tuning_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section on tuning: per tuned run its grid, the validation score of each value and the pick,
    and whether the pick is at the grid's edge (then the grid may not bracket the best value)."""
    tuned = [r for r in rows if r.get("tuned")]
    if not tuned:
        return []
    at_edge = [r for r in tuned if r["tuned"].get("edge")]
    out = [
        "## Tuned on validation",
        "",
        "Each tuned algorithm ran once per grid value on its clients' training data less a held-out validation "
        "share and was scored there at the last tuning round; the best value then trained on the whole training "
        "split (the rows above). "
        + (
            f"**{len(at_edge)} of {len(tuned)} picks are at the grid's edge**: the grid does not bracket them, "
            "so a value beyond it may be better (`tune: {widen: 1}` tunes again beyond the edge)."
            if at_edge
            else f"Every pick ({len(tuned)}) is inside its grid."
        ),
        "",
        "| algorithm | cell | seed | parameter | grid | validation score per value | pick | at the edge |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in tuned:
        t = r["tuned"]
        scores = ", ".join(f"{g}: {'diverged' if v is None else f'{v:.4g}'}" for g, v in zip(t["grid"], t["scores"]))
        edge = {"lowest": "lowest value", "highest": "highest value", "first": "first value", "last": "last value"}.get(
            t.get("edge") or "", "no"
        )
        out.append(
            f"| {r['algorithm']} | {r.get('cell', '')} | {r['seed']} | {t['param']} | {t['grid']} | "
            f"{t['metric']}: {scores} | {t['value']} | {edge} |"
        )
    return [*out, ""]
