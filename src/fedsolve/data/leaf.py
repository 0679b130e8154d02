"""LEAF benchmarks (Caldas et al. 2018) from LEAF's JSON files: FEMNIST and Shakespeare, natural clients.

A LEAF file is ``{"users": [u, ...], "num_samples": [...], "user_data": {u: {"x": [...], "y": [...]}}}``.
``root`` is what LEAF's preprocessing leaves: a folder with ``train/`` and ``test/`` subfolders of such files
(its per-user train/test split, kept with ``test_fraction: null``), or a folder of them (``all_data/``, to be
split by ``test_fraction``), or one file. Users are the natural clients, in the order the files (sorted by
name) list them: ``partition: natural`` with ``num_clients: null`` gives one client per user, and ``users: k``
keeps the first ``k``.

* FEMNIST: ``x`` is a 28x28 image flattened to 784 floats, ``y`` one of 62 classes (digits, upper- and
  lower-case letters); stored as ``[1, 28, 28]``; users are writers.
* Shakespeare: ``x`` a string of 80 characters, ``y`` the next character; both become indices into LEAF's
  80-character alphabet (:data:`LEAF_CHARS`), ``x`` stored as ``[80]`` numbers (a float type holds these
  integers exactly; ``char_lstm`` embeds them); users are speaking roles.

Neither set is carried by a package registry reachable from a machine without the internet; their readers
are tested on small files in this format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .pooled import PooledData

__all__ = ["LEAF_CHARS", "read_leaf", "load_femnist", "load_shakespeare"]

#: LEAF's Shakespeare alphabet: a character's index is its class
LEAF_CHARS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def _files(path: Path, what: str) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.json")) if path.is_dir() else []
    if not files:
        raise ValueError(
            f"{what}: no LEAF .json file at {path} (relative paths start in the current folder); "
            f"allowed: a folder with train/ and test/ of LEAF files, a folder of them, or one file"
        )
    return files


def _read_files(files: list[Path], what: str) -> dict[str, tuple[list, list]]:
    users: dict[str, tuple[list, list]] = {}
    for f in files:
        try:
            d = json.loads(f.read_text())
            order, data = d["users"], d["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{what}: {f} is not a LEAF file ({type(e).__name__}: {e}); allowed: JSON with "
                f"'users' and 'user_data' {{user: {{'x': [...], 'y': [...]}}}}"
            ) from None
        for u in order:
            if u not in data or len(data[u].get("x", [])) != len(data[u].get("y", [])):
                raise ValueError(f"{what}: {f}: user {u!r} has no user_data entry with as many 'x' as 'y'")
            xs, ys = users.setdefault(u, ([], []))
            xs += data[u]["x"]
            ys += data[u]["y"]
    return users


def read_leaf(
    root: str | Path, what: str = "root"
) -> tuple[dict[str, tuple[list, list]], dict[str, tuple[list, list]] | None]:
    """``(train, test)``: per user (in file order) its ``(x list, y list)``; ``test`` is None unless ``root``
    has ``train/`` and ``test/`` subfolders."""
    root = Path(root)
    if (root / "train").is_dir() and (root / "test").is_dir():
        train = _read_files(_files(root / "train", what), what)
        test = _read_files(_files(root / "test", what), what)
        if set(train) != set(test):
            only = sorted(set(train) ^ set(test))[:5]
            raise ValueError(
                f"{what}: {root}: train/ and test/ list different users (e.g. {only}); allowed: "
                f"LEAF's sample split (every user in both)"
            )
        return train, test
    return _read_files(_files(root, what), what), None


def _pooled(root: str, users: int | None, convert, name: str, num_classes: int, meta: dict) -> PooledData:
    train, test = read_leaf(root)
    names = list(train)
    if users is not None:
        if users < 1:
            raise ValueError(f"users: a positive number of users or null (all), got {users}")
        names = names[:users]

    def arrays(split):
        xs, ys, gs = [], [], []
        for g, u in enumerate(names):
            x, y = convert(*split[u], u)
            xs.append(x)
            ys.append(y)
            gs.append(np.full(len(y), g, dtype=np.int64))
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)

    x, y, g = arrays(train)
    xt, yt, gt = arrays(test) if test is not None else (None, None, None)
    return PooledData(
        x,
        y,
        "classification",
        num_classes,
        name,
        groups=g,
        x_test=xt,
        y_test=yt,
        groups_test=gt,
        meta={
            **meta,
            "source": f"LEAF JSON {root}",
            "users": names if len(names) <= 50 else len(names),
            "split": "LEAF train/test" if test is not None else "none (test_fraction)",
        },
    )


def load_femnist(root: str, users: int | None = None) -> PooledData:
    """FEMNIST from LEAF's JSON (module docstring): ``[1, 28, 28]`` images as stored, 62 classes, one group per
    writer."""

    def convert(xs, ys, u):
        x = np.asarray(xs, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(
                f"root: FEMNIST user {u!r}: 'x' rows have shape {x.shape[1:]}; allowed: 784 pixels (28x28)"
            )
        y = np.asarray(ys, dtype=np.int64)
        if y.size and (y.min() < 0 or y.max() >= 62):
            raise ValueError(f"root: FEMNIST user {u!r}: labels outside 0..61")
        return x.reshape(-1, 1, 28, 28), y

    return _pooled(root, users, convert, "femnist", 62, {"dataset": "femnist"})


def load_shakespeare(root: str, users: int | None = None, vocab: str = LEAF_CHARS) -> PooledData:
    """Shakespeare from LEAF's JSON (module docstring): ``x`` the indices of an 80-character string in
    ``vocab`` (LEAF's alphabet), ``y`` the next character's index; one group per speaking role."""
    index = {c: k for k, c in enumerate(vocab)}

    def encode(s: str, u: str) -> list[int]:
        try:
            return [index[c] for c in s]
        except KeyError as e:
            raise ValueError(
                f"root: Shakespeare user {u!r}: character {e.args[0]!r} is not in the alphabet; "
                f"allowed: LEAF's 80 characters, or give the alphabet as vocab"
            ) from None

    def convert(xs, ys, u):
        lengths = {len(s) for s in xs}
        if len(lengths) > 1:
            raise ValueError(
                f"root: Shakespeare user {u!r}: sequences of lengths {sorted(lengths)}; allowed: one length (LEAF: 80)"
            )
        if any(len(c) != 1 for c in ys):
            raise ValueError(f"root: Shakespeare user {u!r}: a 'y' entry is not one character")
        x = np.asarray([encode(s, u) for s in xs], dtype=np.float32).reshape(len(xs), -1)
        return x, np.asarray([index[c] if c in index else encode(c, u)[0] for c in ys], dtype=np.int64)

    return _pooled(root, users, convert, "shakespeare", len(vocab), {"dataset": "shakespeare", "vocab": vocab})
