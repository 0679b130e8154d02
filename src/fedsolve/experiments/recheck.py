"""``fedsolve ledger DIR --recheck``: re-run a cell of every claim's evidence with the current code.

A ledger entry is ``stale`` when the package source changed since the commits that made its evidence: the numbers
may no longer be what the code gives. A re-check answers that question for a sample of each claim's evidence:
for every evidence folder it finds the cells that :func:`fedsolve.experiments.verify.verify` can re-run
(:func:`cells_of`) and re-runs each up to its first recorded evaluation after round 0 (a whole cell of a suite
protocol that has no rounds), comparing every recorded number there with the recorded one (rtol 1e-5).

Why the first evaluation only: it exercises the whole path (data, model, solver, aggregation, metrics) while a
float32 network's training amplifies rounding differences (another executor's summation order, another machine's
BLAS) within tens of rounds, so a later round can differ with unchanged code. A difference at the first
evaluation is a finding; an agreement there is evidence, not proof, that the rest of the run would repeat.

The outcome of each cell is one of :data:`OUTCOMES`, kept in the entry's ``rechecked`` field
(``{"at": commit, "cells": [{"path", "cell", "outcome", "detail"}, ...]}``) and shown in the ledger table.
Evidence that is a file (a table, a plot, a text) or a folder this fedsolve cannot re-run (no recorded config,
summaries without per-round logs) is listed as ``not re-checked`` with the reason. A claim whose command runs the
repository's tests (``python -m pytest tests/... -k ...``: the theorem checks, whose evidence is the tests' saved
output) is re-checked by running those tests with the current code (:func:`recheck_tests`): ``agrees`` when every
selected test passes, ``differs`` when one fails, ``error`` when none ran.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedsolve.experiments.config import ConfigError
from fedsolve.experiments.records import folder_kind, read_json
from fedsolve.experiments.verify import Verdict, verify

OUTCOMES = ("agrees", "close", "differs", "not re-checked", "error")
#: ``agrees``: every number within this relative tolerance of the recorded one (verify's default)
RTOL = 1e-5
#: ``close``: every number within this relative tolerance, not within :data:`RTOL`: the size of the rounding
#: drift a float32 network accumulates over tens of rounds on another CPU or executor with unchanged code
#: (e.g. SimFBO's round-20 training loss on MNIST: 2e-4 between two machines, at the recording commit)
CLOSE_RTOL = 1e-3
#: the most cells re-run per evidence folder (one per method of a compare, up to this many)
PER_FOLDER = 4
#: a suite cell that took longer than this when it was recorded is not re-run whole (seconds)
MAX_WHOLE_CELL_S = 120.0
#: the longest a claim's tests may run when re-checked (seconds)
TESTS_TIMEOUT_S = 1800


def cells_of(path: Path) -> list[tuple[Path, str | None]]:
    """The (folder, cell) pairs of evidence ``path`` to re-run: a run folder itself; a compare folder's methods
    (up to :data:`PER_FOLDER`); a suite's first cell (a grid suite's first compare folder's methods); a folder
    of folders: those of the first run, compare or suite folder under it. [] when there is none."""
    kind = folder_kind(path) if path.is_dir() else None
    if kind == "run":
        return [(path, None)]
    if kind == "compare":
        labels = list(_json(path / "summary.json").get("algorithms") or {})
        return [(path, label) for label in labels[:PER_FOLDER]] or [(path, None)]
    if kind == "suite":
        if _json(path / "suite.json").get("protocol") == "runs":
            grid = sorted(p.parent for p in path.rglob("run.json") if folder_kind(p.parent) == "compare")
            if grid:
                sub = grid[0].relative_to(path)
                return [(path, f"{sub}:{label}") for _, label in cells_of(grid[0]) if label] or [(path, str(sub))]
        return [(path, None)]
    if not path.is_dir():
        return []
    inner = sorted(
        (q.parent for q in path.rglob("*.json") if q.name in ("run.json", "summary.json", "suite.json")),
        key=lambda q: (len(q.parts), str(q)),
    )
    for q in inner:
        if folder_kind(q) is not None and q != path:
            return cells_of(q)
    return []


def _json(f: Path) -> dict[str, Any]:
    try:
        data = read_json(f)
    except (ConfigError, ValueError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def _slow_suite_cell(path: Path) -> float | None:
    """The recorded wall time of a (non-grid) suite's first cell when it exceeds :data:`MAX_WHOLE_CELL_S`."""
    files = sorted((path / "cells").glob("*.json"))
    rows = _json(files[0]).get("rows") if files else None
    took = sum(r.get("wall_s", 0.0) for r in rows or [] if isinstance(r, dict) and isinstance(r.get("wall_s"), float))
    return took if took > MAX_WHOLE_CELL_S else None


def recheck_path(root: Path, rel: str) -> list[dict[str, Any]]:
    """Re-check evidence ``rel`` (a path under ``root``, the repository): one record per cell (module docstring)."""
    path = root / rel
    if path.is_file():
        return [_record(root, rel, None, "not re-checked", "a file (table, plot or text): rebuilt by its command")]
    cells = cells_of(path)
    if not cells:
        return [_record(root, rel, None, "not re-checked", "no fedsolve run, compare or suite folder under it")]
    out = []
    for folder, cell in cells:
        where = str(folder.relative_to(root))
        if folder_kind(folder) == "suite" and cell is None and (took := _slow_suite_cell(folder)) is not None:
            out.append(_record(root, where, cell, "not re-checked", f"a whole cell took {took:.0f} s when recorded"))
            continue
        try:
            found = verify(folder, cell=cell, rounds=1, rtol=RTOL)
        except ConfigError as e:
            out.append(_record(root, where, cell, "not re-checked", str(e)))
            continue
        except Exception as e:  # noqa: BLE001 - a re-check reports what failed and goes on with the next cell
            out.append(_record(root, where, cell, "error", f"{type(e).__name__}: {e}"))
            continue
        out.append(_record(root, where, cell, _outcome(found), _detail(found.lines)))
    return out


def _outcome(found: Verdict) -> str:
    """``agrees`` within :data:`RTOL`; ``close`` when every difference is a number within :data:`CLOSE_RTOL`."""
    if found.agrees:
        return "agrees"
    numeric = all("(relative" in d for d in found.differ)  # not e.g. a round the re-run did not evaluate
    return "close" if numeric and found.worst <= CLOSE_RTOL else "differs"


def _detail(lines: list[str]) -> str:
    """What the re-run did and found (the verdict's lines but the code line, which the ledger's stale flag says)."""
    return " ".join(line for line in lines if not line.startswith("code:"))


def _record(root: Path, path: str, cell: str | None, outcome: str, detail: str) -> dict[str, Any]:
    """One cell's outcome; paths in the detail relative to the repository (no machine path in a ledger)."""
    for prefix in {str(root.resolve()) + "/", str(root) + "/"}:
        detail = detail.replace(prefix, "")
    return {"path": path, "cell": cell, "outcome": outcome, "detail": detail}


def pytest_args(command: str | None) -> list[str] | None:
    """The pytest arguments of ``command`` when it only runs the repository's tests (``[path/]python -m pytest
    [options] tests/... [-k EXPR]``), without the options that change what is printed (``-v``, ``-s``); None for any
    other command (a shell pipeline, a script, a suite)."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        return None
    if len(argv) < 4 or not re.fullmatch(r"python3?", Path(argv[0]).name) or argv[1:3] != ["-m", "pytest"]:
        return None
    rest = argv[3:]
    if any(a in ("&&", "||", ";", "|", ">", "<") for a in rest) or not any(a.startswith("tests/") for a in rest):
        return None
    return [a for a in rest if a not in ("-v", "-s", "-q")]


def recheck_tests(root: Path, args: list[str]) -> dict[str, Any]:
    """Run the tests ``args`` (:func:`pytest_args`) with this interpreter in ``root`` and record the outcome."""
    where = " ".join(a for a in args if a.startswith("tests/"))
    cell = args[args.index("-k") + 1] if "-k" in args[:-1] else None
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=TESTS_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return _record(root, where, cell, "error", f"the claim's tests ran past {TESTS_TIMEOUT_S} s")
    tail = (p.stdout.strip().splitlines() or [""])[-1].strip("= ")
    tail = re.sub(r"(, \d+ warnings?)? in [\d.]+s.*$", "", tail)  # the counts, not the time or the warnings
    passed = re.search(r"(\d+) passed", tail)
    if p.returncode == 0 and passed:
        return _record(root, where, cell, "agrees", f"re-ran the claim's tests: {tail}")
    if p.returncode == 1:
        failed = re.findall(r"^FAILED (\S+)", p.stdout, re.M)
        return _record(root, where, cell, "differs", f"re-ran the claim's tests: {tail}; failed: {', '.join(failed)}")
    return _record(root, where, cell, "error", f"the claim's tests did not run (pytest exit {p.returncode}): {tail}")


def recheck_entries(root: Path, entries: list[dict[str, Any]], head: str, only: list[str] | None = None) -> None:
    """Set ``rechecked`` of ``entries`` (those whose id is in ``only``, default all with evidence), re-running each
    evidence path once even when several claims cite it, and the tests of a claim whose command runs tests."""
    done: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        if only is not None and e["id"] not in only:
            continue
        cells = []
        for rel in e["evidence"]:
            if rel not in done:
                done[rel] = recheck_path(root, rel)
            cells += done[rel]
        if (args := pytest_args(e.get("command"))) is not None:
            cells.append(recheck_tests(root, args))
        if cells:
            e["rechecked"] = {"at": head, "cells": cells}


def _counts(rechecked: dict[str, Any]) -> dict[str, int]:
    """How many cells of a ``rechecked`` field have each outcome, and ``re-run``: those that were re-run."""
    cells = rechecked.get("cells") or []
    count = {o: sum(c.get("outcome") == o for c in cells) for o in OUTCOMES}
    return {**count, "re-run": len(cells) - count["not re-checked"]}


def holds(rechecked: dict[str, Any]) -> bool:
    """Whether a current re-check re-ran at least one cell and every re-run cell agreed or was close."""
    count = _counts(rechecked)
    return rechecked.get("current", True) and 0 < count["re-run"] == count["agrees"] + count["close"]


def status_phrase(rechecked: dict[str, Any]) -> str:
    """One phrase for the ledger's status column, e.g. ``re-checked at 1a2b3c4: 3 of 4 re-run cells agree``."""
    count = _counts(rechecked)
    runnable = count["re-run"]
    if not runnable:
        return f"re-checked at {rechecked.get('at', '?')[:7]}: no cell re-run"
    text = f"re-checked at {rechecked.get('at', '?')[:7]}: {count['agrees']} of {runnable} re-run cells agree"
    if count["close"]:
        text += f", {count['close']} within {CLOSE_RTOL:g}"
    if count["differs"]:
        text += f", {count['differs']} differ"
    if count["error"]:
        text += f", {count['error']} failed"
    return text
