"""A run folder is a unit: one live writer at a time, a marker that says whether it finished, no stray
temporary files.

* **Lock** (``.fedsolve.lock``): held with ``flock(2)`` while a run, a compare or a suite writes into the
  folder (on a system without ``fcntl`` folders are not locked). The kernel drops it when the holder ends,
  however it ends (``kill -9`` included), so a lock file left by a dead process is simply taken over by the next
  run; the file names the holder's pid for the message a second writer gets (:class:`FolderBusy`).
* **Marker** (``run.json``): ``{"kind", "status", "pid", "started", "ended", "message", "provenance"}``.
  ``status`` is ``running`` from the start until the run ends, then ``completed``, ``diverged``,
  ``interrupted`` (Ctrl-C) or ``failed`` (e.g. a full disk). A folder whose marker still says ``running``
  while no process holds its lock was killed, or its disk filled before it could say so: it is
  **incomplete** (:func:`folder_status`), never a finished result.
* **Temporary files** of atomic writes (``.<name>.<random>.tmp``, and ``.<name>.<random>`` of earlier
  versions) that a killed writer left are removed when the folder is next opened (:func:`clean_temps`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: folders are not locked
    fcntl = None  # type: ignore[assignment]  # no fcntl here: folders are not locked

from fedsolve.engine.io import atomic_write_text

LOCK, MARKER = ".fedsolve.lock", "run.json"
FINAL = ("completed", "diverged", "interrupted", "failed")
# files that fedsolve writes with atomic_write_bytes; their temporary files are ".<name>.<8 random chars>[.tmp]"
_WRITTEN = (
    "checkpoint.pt",
    "metrics.jsonl",
    "timings.jsonl",
    "summary.json",
    "per_client.json",
    "config.yaml",
    "report.md",
    "run.json",
    "suite.json",
    "results.json",
)
_TEMP = re.compile(r"^\.(.+)\.[A-Za-z0-9_]{8}(\.tmp)?$")


class FolderBusy(RuntimeError):
    """Another live process holds the folder's lock (its pid is in the message)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _pid_in(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "unknown"


class FolderLock:
    """The lock of one folder (see the module docstring). ``acquire`` raises :class:`FolderBusy` naming the
    lock file and the holder's pid; ``release`` removes the file."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.fd: int | None = None

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        while fcntl is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _pid_in(fd)
                os.close(fd)
                raise FolderBusy(
                    f"{self.folder} is in use by a live run (lock {self.path}, held by pid {pid}); "
                    f"allowed: wait for it to end or stop it, or use another --out"
                ) from None
            try:  # its last holder may have removed the file between our open and flock: lock the new one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self.fd = fd
                break
            os.close(fd)
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if os.fstat(self.fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder(folder: str | Path) -> str | None:
    """The pid (as written in the lock) of the live process that holds ``folder``'s lock, or None when none does.
    (A lock this process holds through another open file counts as held.)"""
    path = Path(folder) / LOCK
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid_in(fd)
    finally:
        os.close(fd)  # also drops the shared lock taken to probe
    return None


def busy_above(path: str | Path) -> FolderBusy | None:
    """A :class:`FolderBusy` for the nearest folder enclosing ``path`` (``path`` itself included) that a live
    process holds, or None. (A run must not write inside a compare or suite that is running.)"""
    p = Path(path).resolve()
    for folder in (p, *p.parents):
        pid = holder(folder)
        if pid is not None:
            return FolderBusy(
                f"{folder} is in use by a live run (lock {folder / LOCK}, held by pid {pid}); "
                f"allowed: wait for it to end or stop it, or use another --out"
            )
    return None


def clean_temps(folder: str | Path) -> list[Path]:
    """Remove the temporary files of interrupted atomic writes in ``folder``, its ``plots/``, a suite's
    ``cells/`` and a compare's run folders ``<label>/seed<k>`` (and their ``plots/``) that no live process holds
    (a finished run there is not reopened by a resume); see the module docstring. Returns what was removed."""
    gone = []
    root = Path(folder)
    runs = [r for r in root.glob("*/seed*") if r.is_dir() and (r / MARKER).is_file() and holder(r) is None]
    for d in (root, root / "plots", root / "cells", *runs, *(r / "plots" for r in runs)):
        if not d.is_dir():
            continue
        for f in d.iterdir():
            m = _TEMP.match(f.name)
            if m and f.is_file() and (m.group(2) or m.group(1) in _WRITTEN or m.group(1).endswith(".png")):
                f.unlink(missing_ok=True)
                gone.append(f)
    return gone


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """``run.json`` of ``folder``, or None when there is none (a folder of an older fedsolve) or it is unreadable."""
    f = Path(folder) / MARKER
    try:
        out = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def folder_status(folder: str | Path) -> str | None:
    """``running`` (a live process holds the folder), ``incomplete`` (its marker says running, or failed, but
    nobody holds it), the marker's final status, or None when the folder has no marker."""
    m = read_marker(folder)
    if m is None:
        return None
    st = m.get("status")
    if st == "running":
        return "running" if holder(folder) is not None else "incomplete"
    return "incomplete" if st == "failed" else st


class RunFolder:
    """A folder opened for writing: locked (:class:`FolderLock`), its stray temporary files removed, a marker
    that says ``running`` (:meth:`start`) until :meth:`finish` gives the outcome. Leaving the ``with`` block by
    an exception before :meth:`finish` records ``interrupted`` (Ctrl-C) or ``failed`` (anything else, e.g. a
    full disk) where the marker can still be written; the lock is released in every case."""

    def __init__(self, folder: str | Path, kind: str):
        self.folder, self.kind = Path(folder), kind
        self.lock = FolderLock(self.folder)
        self.marker: dict[str, Any] | None = None

    def __enter__(self) -> RunFolder:
        self.lock.acquire()
        clean_temps(self.folder)
        return self

    def start(self, provenance: dict[str, Any] | None = None) -> None:
        self.marker = {
            "kind": self.kind,
            "status": "running",
            "pid": os.getpid(),
            "started": _now(),
            "ended": None,
            "message": "",
            "provenance": provenance or {},
        }
        atomic_write_text(self.folder / MARKER, json.dumps(self.marker, indent=2))

    def starter(self, config: dict[str, Any] | None, remove: tuple[str, ...] = ()) -> _Start:
        """A simulation callback that, when the run starts (after every check has passed), removes the files
        ``remove`` of an earlier run (so a folder never holds the last run's summary beside a new run's partial
        logs) and writes the ``running`` marker with the run's provenance (``config``: its resolved config)."""
        return _Start(self, config, remove)

    def finish(self, status: str, message: str = "") -> None:
        if self.marker is None:
            return
        self.marker.update(status=status, ended=_now(), message=message)
        atomic_write_text(self.folder / MARKER, json.dumps(self.marker, indent=2))

    def __exit__(self, typ, exc, tb) -> None:
        try:
            if typ is not None and self.marker is not None and self.marker["status"] == "running":
                from fedsolve.engine.loop import DivergenceError

                status = (
                    "interrupted"
                    if issubclass(typ, KeyboardInterrupt)
                    else "diverged"
                    if issubclass(typ, DivergenceError)
                    else "failed"
                )
                try:
                    self.finish(status, f"{typ.__name__}: {exc}"[:300])
                except OSError:  # e.g. the disk is full: the marker keeps "running", read as incomplete
                    pass
        finally:
            self.lock.release()


class _Start:
    """:meth:`RunFolder.starter`'s callback."""

    def __init__(self, folder: RunFolder, config: dict[str, Any] | None, remove: tuple[str, ...]):
        self.folder, self.config, self.remove = folder, config, remove

    def on_start(self, sim) -> None:
        from fedsolve.engine.provenance import provenance

        for name in self.remove:
            (self.folder.folder / name).unlink(missing_ok=True)
        self.folder.start(provenance(sim.device, self.config))

    def on_round(self, sim, round_, info) -> None:
        pass

    def on_eval(self, sim, record) -> None:
        pass

    def on_end(self, sim) -> None:
        pass


__all__ = [
    "FINAL",
    "LOCK",
    "MARKER",
    "FolderBusy",
    "FolderLock",
    "RunFolder",
    "busy_above",
    "clean_temps",
    "folder_status",
    "holder",
    "read_marker",
]
