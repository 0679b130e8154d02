"""Provenance: what made a result (code commit, config, versions, machine, device).

:func:`provenance` is the record every run, compare and suite folder keeps in its ``run.json`` and
``summary.json``:

* ``commit``: the git commit of the fedsolve source that ran, when it ran from a git checkout, else
  ``"unknown"`` (an installed wheel); ``dirty``: whether the package's tracked files differed from that commit
  (``null`` when unknown); both read once per process (:func:`pin_source`: at the CLI's start, before any run),
  so a record names the code the process loaded even when HEAD moves during a long suite;
  ``commit_source``: ``"recorded"`` (this record was written by the run itself);
* ``config_hash``: SHA-256 of the resolved config (:func:`config_hash`);
* ``versions``: fedsolve, torch, numpy, python, and flwr where it is installed;
* ``machine``: platform, processor architecture, CPU count, the CPU's model name (``cpu``) and widest SIMD
  extension (``simd``: two CPUs sold under one name can round a float32 product differently); ``device``: where
  the run computed (with the GPU's name for CUDA) and torch's thread count;
* ``command``: the ``fedsolve`` command line, when the run was started by it (:data:`COMMAND`).

:func:`source_changed` tells whether the package source differs between two commits (the ``stale`` rule of
the claims ledger and ``fedsolve verify``).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: the ``fedsolve`` command line that started this process's runs (set by the CLI, read into provenance)
COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("fedsolve_command", default=None)

_PACKAGE = Path(__file__).resolve().parents[1]  # .../fedsolve (the package directory)


def config_hash(config: dict[str, Any]) -> str:
    """``sha256:<hex>`` of ``config`` as canonical JSON (sorted keys, no spaces): equal configs, equal hashes."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _git(*args: str, cwd: Path = _PACKAGE) -> str | None:
    """``git args`` in ``cwd``; its stripped stdout, or None when git is missing or the command fails."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.cache
def source_checkout() -> tuple[Path, str] | None:
    """(the git work tree, the package's path in it) when the package runs from a git checkout that tracks
    it; None for an installed wheel (or when git is not installed)."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or _git("ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    return Path(top), _PACKAGE.relative_to(Path(top).resolve()).as_posix()


def source_commit() -> tuple[str, bool | None]:
    """(HEAD's commit, whether the package's tracked files differ from it), or ("unknown", None)."""
    where = source_checkout()
    head = _git("rev-parse", "HEAD") if where else None
    if head is None:
        return "unknown", None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return head, None if status is None else bool(status)


_PINNED: list[tuple[str, bool | None]] = []  # the (commit, dirty) of the code this process runs, once known


def pin_source(value: tuple[str, bool | None] | None = None) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the code this process runs: the checkout's at the first call (or ``value``, the
    parent's pin handed to a worker process), the same for every later record although HEAD may move while a
    long run lasts (the CLI pins it at start-up, a suite hands it to its worker processes)."""
    if not _PINNED:
        _PINNED.append(value if value is not None else source_commit())
    return _PINNED[0]


def source_changed(commit: str, other: str = "HEAD", checkout: tuple[Path, str] | None = None) -> bool | None:
    """Whether the package source (its folder's git tree) differs between ``commit`` and ``other``; None when
    that cannot be told (no checkout, an unknown commit). ``checkout``: (a work tree, the package's path in it)
    to look in instead of the one this package runs from (:func:`source_checkout`)."""
    where = checkout or source_checkout()
    if where is None or not commit or commit == "unknown":
        return None
    top, pkg = where
    a, b = _git("rev-parse", f"{commit}:{pkg}", cwd=top), _git("rev-parse", f"{other}:{pkg}", cwd=top)
    return None if a is None or b is None else a != b


def head_of(path: str | Path) -> str | None:
    """The HEAD commit of the git work tree that holds ``path``, or None."""
    return _git("rev-parse", "HEAD", cwd=Path(path).resolve())


def added_in(folder: str | Path) -> dict[Path, str]:
    """For every file under ``folder`` that git tracks: the commit that added it (a file moved since keeps the
    commit that added it under its first name), from one ``git log``; {} outside a checkout."""
    folder = Path(folder).resolve()
    top = _git("rev-parse", "--show-toplevel", cwd=folder)
    out = _git("log", "--reverse", "-M", "--diff-filter=AR", "--format=%x00%H", "--name-status", "--", ".", cwd=folder)
    if top is None or not out:
        return {}
    first: dict[str, str] = {}
    for block in out.split("\x00")[1:]:  # oldest commit first
        commit, *changes = block.strip().splitlines()
        for change in changes:
            status, *names = change.split("\t")
            if status == "A":
                first.setdefault(names[0], commit)
            elif status.startswith("R") and len(names) == 2:
                first[names[1]] = first.get(names[0], commit)
    return {Path(top) / name: commit for name, commit in first.items()}


def versions() -> dict[str, str]:
    """Versions of fedsolve, torch, numpy, python, and flwr where installed (read without importing flwr)."""
    from importlib import metadata

    import numpy
    import torch

    from fedsolve._version import __version__

    out = {
        "fedsolve": __version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }
    try:
        out["flwr"] = metadata.version("flwr")
    except metadata.PackageNotFoundError:
        pass
    return out


def device_info(device: Any = None) -> dict[str, Any]:
    """The device a run computed on (``cpu``, ``cuda:0`` with the GPU's name) and torch's thread count."""
    import torch

    name = str(device) if device is not None else "cpu"
    out: dict[str, Any] = {"device": name, "torch_threads": torch.get_num_threads()}
    if name.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(name))
    return out


def provenance(device: Any = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record described in the module docstring (``config``: the resolved config to hash)."""
    commit, dirty = pin_source()
    return {
        "commit": commit,
        "dirty": dirty,
        "commit_source": "recorded",
        "config_hash": config_hash(config) if config is not None else None,
        "versions": versions(),
        "machine": {"platform": platform.platform(), "arch": platform.machine(), "cpu_count": os.cpu_count(), **_cpu()},
        **device_info(device),
        "command": COMMAND.get(),
    }


@functools.cache
def _cpu() -> dict[str, str | None]:
    """The CPU's model name and widest SIMD extension (``cpu``, ``simd``), read once per process."""
    from fedsolve.core.cpus import cpu_description

    d = cpu_description()
    return {"cpu": d["model"], "simd": d["simd"]}


def command_line(argv: list[str] | None) -> str:
    """``fedsolve ...`` as typed (``argv``: the arguments after the program name; None: ``sys.argv[1:]``)."""
    import shlex

    return shlex.join(["fedsolve", *(sys.argv[1:] if argv is None else argv)])


__all__ = [
    "COMMAND",
    "added_in",
    "command_line",
    "config_hash",
    "device_info",
    "head_of",
    "pin_source",
    "provenance",
    "source_changed",
    "source_commit",
    "versions",
]
