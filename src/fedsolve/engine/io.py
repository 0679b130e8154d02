"""Atomic file writes: a reader (or a crash, or Ctrl-C) never sees a half-written file.

Every file fedsolve writes into a run folder goes through :func:`atomic_write_bytes`: the bytes go to
a temporary file in the same folder, are flushed to disk, and the temporary file is renamed over the
target (``os.replace``, atomic on POSIX). A writer killed before the rename leaves its temporary file
(``.<name>.<random>.tmp``); :func:`fedsolve.engine.run_folder.clean_temps` removes it when the folder is next
opened for a run. A file keeps the permission bits it had; a new file gets the
mode ``open()`` would give it (the umask), not the temporary file's private 0600.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from pathlib import Path
from typing import Any


@functools.cache
def _new_file_mode() -> int:
    """What ``open()`` would give a new file under the umask (read once, at the first write)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # e.g. a full disk: name the file it happened to
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)``, atomically."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_torch_save"]


def new_figure(*args, **kwargs):
    """``(fig, axes)`` like ``pyplot.subplots(*args, **kwargs)``, on a plain ``Figure`` (no pyplot, no
    backend); write it with :func:`save_figure`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(*args, **kwargs)


def save_figure(fig, path: Path) -> None:
    """Write a matplotlib figure as PNG atomically (no half-written file) and close it."""
    import io
    import sys

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    if "matplotlib.pyplot" in sys.modules:  # a pyplot figure of the caller's: free it
        sys.modules["matplotlib.pyplot"].close(fig)
    atomic_write_bytes(path, buf.getvalue())
