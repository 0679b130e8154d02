"""A folder's own record: what kind of folder it is, the config it was run with, and whether a new call may
write there.

A run folder records its resolved config in ``config.yaml`` and its state in ``run.json``
(:mod:`fedsolve.engine.run_folder`); a compare folder records the experiment config in ``config.yaml`` (every
algorithm run into it so far); a suite folder its settings in ``suite.json``. A new call is judged by that
record, never by the presence of one file:

* a run into a folder that holds a run is refused unless it resumes it (``--resume``, the config checked by
  ``check_resume``) or starts it over (``--overwrite``); a folder of another kind is always refused;
* a compare into a compare folder must agree with its record in everything that changes the numbers (seeds,
  data, model, simulation, ``defaults``; each algorithm it shares with the record in its name, parameters and
  tuning), may add algorithms (``--only``) whose folder names do not clash with the recorded ones, and may
  not write a run the folder already holds unless it resumes or overwrites.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fedsolve.engine.run_folder import MARKER, read_marker
from fedsolve.experiments.folders import slug

#: fields of a run's resolved config that may change on ``--resume``: names and notes, the evaluation and
#: checkpoint cadence and the extra metrics (what is recorded, not what is trained: from the resume point on
#: the metrics file follows the new cadence), where the state is kept (``state_memory_mb``), and the thread
#: count and device (``compare --jobs`` changes the threads; both can move float rounding in the last bits,
#: as ``--jobs`` does). ``simulation.rounds`` may grow. Anything else changes the numbers and is refused.
RESUME_FREE = (
    "name",
    "description",
    "paper",
    "out_dir",
    "threads",
    "simulation.eval_every",
    "simulation.checkpoint_every",
    "simulation.metrics",
    "simulation.state_memory_mb",
    "simulation.device",
    "algorithm.label",
)
#: the files fedsolve writes into a run folder (removed when a run there starts over with ``--overwrite``)
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "timings.jsonl",
    "summary.json",
    "per_client.json",
    "checkpoint.pt",
    "report.md",
    MARKER,
)
_ABSENT = object()


def _error(msg: str):
    from fedsolve.experiments.errors import ConfigError

    return ConfigError(msg)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The dotted fields where two resolved run configs differ in a way that changes the numbers (every field
    except :data:`RESUME_FREE` and ``simulation.rounds``); a field the old config lacks (written by an older
    fedsolve) counts only when the new value is not empty or a default-like null."""
    a, b = _flat(old), _flat(new)
    free = lambda k: k == "simulation.rounds" or any(k == f or k.startswith(f + ".") for f in RESUME_FREE)
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, _ABSENT), b.get(k, _ABSENT)
        if free(k) or va == vb:
            continue
        if va is _ABSENT and vb in (None, {}, [], False, "float32"):
            continue
        out.append(f"{k} ({'-' if va is _ABSENT else va!r} -> {'-' if vb is _ABSENT else vb!r})")
    return out


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``; a broken file is a ``ConfigError`` (a ValueError) naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise _error(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); allowed: the "
            f"file as fedsolve wrote it"
        ) from None
    except UnicodeDecodeError:
        raise _error(f"{path}: not valid JSON (not UTF-8 text); allowed: the file as fedsolve wrote it") from None


def read_yaml(path: str | Path) -> Any:
    """The YAML in ``path``; a broken file is a ``ConfigError`` (a ValueError) naming it."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise _error(
            f"{path}: not valid YAML ({getattr(e, 'problem', None) or e}); allowed: the file as fedsolve wrote it"
        ) from None


def folder_kind(path: str | Path) -> str | None:
    """``run``, ``compare`` or ``suite`` when ``path`` holds fedsolve's record of one (its ``run.json``, or for a
    folder of an older fedsolve the files it holds), else None."""
    path = Path(path)
    marker = read_marker(path)
    if marker and marker.get("kind"):
        return marker["kind"]
    if (path / "suite.json").exists():
        return "suite"
    if (path / "summary.json").exists():
        try:
            return "compare" if "algorithms" in read_json(path / "summary.json") else "run"
        except ValueError:
            return "run"
    if any((path / f).exists() for f in ("checkpoint.pt", "metrics.jsonl")):
        return "run"
    if (path / "config.yaml").exists():
        try:
            raw = read_yaml(path / "config.yaml")
        except ValueError:
            return "run"
        return "compare" if isinstance(raw, dict) and raw.get("algorithms") else "run"
    return None


def check_run_folder(path: str | Path, resume: bool, overwrite: bool) -> None:
    """Refuse a run into ``path`` when the folder holds another kind of record, or holds a run and the call
    neither resumes nor overwrites it (see the module docstring)."""
    kind = folder_kind(path)
    if kind is None:
        return
    if kind != "run":
        raise _error(f"--out {path}: holds a {kind} folder, not a run; allowed: a new or empty folder, or a run folder")
    if not resume and not overwrite:
        raise _error(f"{path} already holds a run; pass --resume to continue it or --overwrite to start over")


def clear_run_files(path: str | Path) -> None:
    """Remove what a run wrote into ``path`` (:data:`RUN_FILES` and ``plots/*.png``), so that a run started
    over leaves nothing of the one before (other files stay)."""
    path = Path(path)
    for name in RUN_FILES:
        (path / name).unlink(missing_ok=True)
    if (path / "plots").is_dir():
        for f in (path / "plots").glob("*.png"):
            f.unlink()


def label_clash(labels: list[str]) -> tuple[str, str] | None:
    """Two labels that share a folder name (:func:`~fedsolve.experiments.folders.slug`), or None."""
    seen: dict[str, str] = {}
    for lab in labels:
        other = seen.setdefault(slug(lab), lab)
        if other != lab:
            return other, lab
    return None


def compare_record(base: str | Path, cfg, resume: bool, overwrite: bool) -> dict[str, Any]:
    """Check a compare of ``cfg`` into ``base`` against the folder's record (module docstring) and return the
    record to keep: the recorded config with this call's algorithms added (``cfg``'s own dump when the folder
    has no record, or with ``overwrite`` when the record disagrees)."""
    base = Path(base)
    new = cfg.model_dump(mode="json")
    kind = folder_kind(base)
    if kind is None:
        return new
    if kind != "compare":
        raise _error(f"--out {base}: holds a {kind} folder, not a compare; allowed: a new folder or a compare folder")
    try:
        old = read_yaml(base / "config.yaml") if (base / "config.yaml").exists() else None
    except ValueError as e:
        if overwrite:
            return new
        raise _error(f"{e}; start over with --overwrite") from None
    if not isinstance(old, dict):
        return new
    problems = _record_differences(old, new, resume)
    if problems:
        if overwrite:
            return new
        raise _error(
            f"{base} was run with another config ({'; '.join(problems)}); a compare into it must agree "
            f"with its record (it may add algorithms); use another --out, or --overwrite to start over"
        )
    mine = _algorithms(old)
    added = {k: a for k, a in _algorithms(new).items() if k not in mine}
    clash = label_clash(list(mine) + list(added))
    if clash:
        raise _error(
            f"algorithms: labels {clash[0]!r} (in {base}) and {clash[1]!r} share the folder name "
            f"{slug(clash[0])!r}; allowed: labels that differ in letters, digits or -_."
        )
    return {**new, "algorithm": None, "algorithms": [*mine.values(), *added.values()]}


def _algorithms(raw: dict) -> dict[str, dict]:
    """label -> algorithm spec of a config dump (its ``algorithms``, or its one ``algorithm``)."""
    specs = raw.get("algorithms") or ([raw["algorithm"]] if isinstance(raw.get("algorithm"), dict) else [])
    return {a.get("label") or a["name"]: a for a in specs}


def _record_differences(old: dict, new: dict, resume: bool) -> list[str]:
    """What differs between a compare folder's recorded config and a new one: the settings (all but the
    algorithms and the cosmetic fields; the round budget unless resuming, where it may grow), and each
    algorithm both list (its name, parameters and tuning)."""
    strip = lambda d: {k: v for k, v in d.items() if k not in ("algorithms", "algorithm")}
    out = config_differences(strip(old), strip(new))
    r_old, r_new = (old.get("simulation") or {}).get("rounds"), (new.get("simulation") or {}).get("rounds")
    if r_old is not None and r_old != r_new and not (resume and r_new > r_old):
        out.append(f"simulation.rounds ({r_old!r} -> {r_new!r})")
    theirs = _algorithms(old)
    for label, a in _algorithms(new).items():
        if label in theirs:
            out += [
                f"algorithms[{label}].{d}"
                for d in config_differences(
                    {k: v for k, v in theirs[label].items() if k != "label"},
                    {k: v for k, v in a.items() if k != "label"},
                )
            ]
    return out
