"""Own data from files: an image folder, a CSV table, an ``.npz`` archive.

Each loader reads its files once into memory and returns :class:`~fedsolve.data.datasets.PooledData`, which
a config then partitions like any pooled dataset (``data.partition``); an optional client column/key gives
the natural clients (``partition: natural``, ``num_clients: null``), and an optional second folder/file
(``test_root``, ``test_path``, the ``x_test``/``y_test`` keys) the test set kept with ``test_fraction: null``.
Relative paths are taken from the current folder.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .pooled import PooledData
from .torch_data import image_to_array, materialize

__all__ = ["ImageFolder", "IMAGE_EXTENSIONS", "load_image_folder", "load_csv", "load_npz_file"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def _existing(path: str | Path, what: str, folder: bool) -> Path:
    p = Path(path)
    if not (p.is_dir() if folder else p.is_file()):
        raise ValueError(
            f"{what}: no {'folder' if folder else 'file'} {p} (relative paths start in the current folder)"
        )
    return p


class ImageFolder:
    """A map-style Dataset over ``root/<class>/**/<image>`` (torchvision's ``ImageFolder`` layout): classes
    are the sorted subfolder names, files with an image extension (:data:`IMAGE_EXTENSIONS`) are taken in
    sorted order, and item ``i`` is ``(image [C, H, W] float32 in [0, 1], class index)``.

    ``mode``: Pillow mode every image is converted to (``RGB``, as torchvision's loader, or ``L`` for grey);
    ``size``: ``[height, width]`` every image is resized to (bilinear), needed when sizes differ;
    ``classes``: the class names to use (their order gives the indices), e.g. the training folder's for a test
    folder; default the subfolders found."""

    def __init__(
        self,
        root: str | Path,
        mode: Literal["RGB", "L"] = "RGB",
        size: Sequence[int] | None = None,
        classes: Sequence[str] | None = None,
        what: str = "root",
    ):
        if mode not in ("RGB", "L"):
            raise ValueError(f"mode: {mode!r}; allowed: 'RGB', 'L'")
        if size is not None and (len(size) != 2 or any(int(s) < 1 for s in size)):
            raise ValueError(f"size: {size!r}; allowed: [height, width], positive")
        self.root, self.mode, self.size = _existing(root, what, folder=True), mode, size
        found = sorted(d.name for d in self.root.iterdir() if d.is_dir())
        self.classes = list(classes) if classes is not None else found
        unknown = sorted(set(found) - set(self.classes))
        if unknown:
            raise ValueError(
                f"{what}: class folder(s) {unknown} in {self.root} are not among the classes {self.classes}"
            )
        if not self.classes:
            raise ValueError(f"{what}: {self.root} has no class subfolders; allowed: root/<class>/<image files>")
        self.samples: list[tuple[Path, int]] = []
        for k, c in enumerate(self.classes):
            files = (
                sorted(p for p in (self.root / c).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
                if (self.root / c).is_dir()
                else []
            )
            if not files and classes is None:
                raise ValueError(
                    f"{what}: class folder {self.root / c} holds no image file ({', '.join(IMAGE_EXTENSIONS)})"
                )
            self.samples += [(p, k) for p in files]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from PIL import Image, UnidentifiedImageError

        path, label = self.samples[i]
        try:
            with Image.open(path) as opened:
                img: Image.Image = opened
                if self.size is not None:
                    img = img.convert(self.mode).resize(
                        (int(self.size[1]), int(self.size[0])), Image.Resampling.BILINEAR
                    )
                return image_to_array(img, self.mode), label
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f"root: {path} cannot be read as an image ({e})") from None


def load_image_folder(
    root: str, test_root: str | None = None, mode: Literal["RGB", "L"] = "RGB", size: list[int] | None = None
) -> PooledData:
    """Images in class subfolders (:class:`ImageFolder`), read once; ``test_root``: a second folder of the same
    classes kept as the test set."""
    train = ImageFolder(root, mode, size)
    x, y = _read_images(train, "root")
    xt = yt = None
    if test_root is not None:
        xt, yt = _read_images(ImageFolder(test_root, mode, size, classes=train.classes, what="test_root"), "test_root")
    return PooledData(
        x,
        y,
        "classification",
        len(train.classes),
        "image_folder",
        x_test=xt,
        y_test=yt,
        meta={"source": f"image folder {root}", "class_names": train.classes, "mode": mode, "size": size},
    )


def _read_images(folder: ImageFolder, what: str):
    try:
        return materialize(folder, what)
    except ValueError as e:
        if "input shape" in str(e):
            raise ValueError(
                f"{what}: the images have different sizes ({e}); allowed: set size: [height, width]"
            ) from None
        raise


def _groups(ids: np.ndarray, ref: np.ndarray | None, what: str) -> np.ndarray:
    """Client ids (any values) as indices of ``ref``'s sorted distinct ids (``ref``: the training ids)."""
    names = np.unique(ids if ref is None else ref)
    if ref is not None and set(np.unique(ids).tolist()) != set(names.tolist()):
        raise ValueError(
            f"{what}: the test clients {sorted(np.unique(ids).tolist())[:10]} differ from the "
            f"training clients {sorted(names.tolist())[:10]}; allowed: the same client ids in both"
        )
    return np.searchsorted(names, ids).astype(np.int64)


def _labels(raw: list[str], task: str | None, what: str, classes: list[str] | None = None):
    """``(y, task, num_classes, class_names)`` of a label column's strings: non-negative integers are class
    indices (no names); other integers and strings are classes in sorted order (``classes``: the training
    file's); other numbers are regression targets (or with ``task: regression``, every number)."""
    if task not in (None, "classification", "regression"):
        raise ValueError(f"task: {task!r}; allowed: 'classification', 'regression' or null (from the labels)")

    def numbers(kind):
        try:
            return np.array([kind(v) for v in raw])
        except ValueError:
            return None

    ints, floats = numbers(int), numbers(float)
    if task == "regression" or (task is None and ints is None and floats is not None):
        if floats is None:
            raise ValueError(f"{what}: a regression target must be numeric")
        return floats.astype(np.float32), "regression", None, None
    if classes is None and ints is not None and ints.min(initial=0) >= 0:
        return ints.astype(np.int64), "classification", int(ints.max(initial=-1)) + 1, None
    if classes is None:
        classes = [str(v) for v in sorted(set(ints.tolist()))] if ints is not None else sorted(set(raw))
    keys = [str(v) for v in ints.tolist()] if ints is not None else raw
    index = {c: k for k, c in enumerate(classes)}
    bad = sorted(set(keys) - set(index))
    if bad:
        raise ValueError(f"{what}: label(s) {bad[:5]} not among the training labels {classes[:20]}")
    return np.array([index[v] for v in keys], dtype=np.int64), "classification", len(classes), classes


def _read_csv(
    path: Path, label: str, features: list[str] | None, client: str | None, delimiter: str, what: str
) -> tuple[np.ndarray, list[str], np.ndarray | None, list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter=delimiter))
    if not rows:
        raise ValueError(f"{what}: {path} has no data rows (a header line, then one line per sample)")
    cols = list(rows[0].keys())
    for name, col in (("label", label), ("client", client)):
        if col is not None and col not in cols:
            raise ValueError(f"{name}: no column {col!r} in {path}; allowed: {cols}")
    feats = list(features) if features is not None else [c for c in cols if c not in (label, client)]
    missing = [c for c in feats if c not in cols]
    if missing or not feats:
        raise ValueError(f"features: {missing or 'none'} not columns of {path}; allowed: {cols}")
    x = np.empty((len(rows), len(feats)), dtype=np.float32)
    for r, row in enumerate(rows):
        for j, c in enumerate(feats):
            try:
                x[r, j] = float(row[c])
            except (TypeError, ValueError):
                raise ValueError(
                    f"{what}: {path} line {r + 2}, column {c!r}: {row[c]!r} is not a number; "
                    f"allowed: numeric feature columns (drop others with features: [...])"
                ) from None
    groups = np.array([row[client] for row in rows]) if client is not None else None
    return x, [row[label] for row in rows], groups, feats


def load_csv(
    path: str,
    label: str,
    features: list[str] | None = None,
    client: str | None = None,
    test_path: str | None = None,
    task: Literal["classification", "regression"] | None = None,
    delimiter: str = ",",
) -> PooledData:
    """A table with a header line: feature columns (numbers), a ``label`` column, and optionally a ``client``
    column naming each row's client (the natural partition). Labels that are non-negative integers are class
    indices; other strings are classes in sorted order (names in ``meta["class_names"]``); with
    ``task: regression`` (or non-integer numbers) they are float targets. ``features``: the columns to use
    (default every other column); ``test_path``: a second file with the same columns, kept as the test set."""
    p = _existing(path, "path", folder=False)
    x, raw, groups, feats = _read_csv(p, label, features, client, delimiter, "path")
    y, task_, k, names = _labels(raw, task, "label")
    xt = yt = gt = None
    if test_path is not None:
        xt, raw_t, gt, _ = _read_csv(
            _existing(test_path, "test_path", folder=False), label, feats, client, delimiter, "test_path"
        )
        if names is not None:
            yt = _labels(raw_t, task_, "test_path", classes=names)[0]
        else:
            yt = _labels(raw_t, task_, "test_path")[0]
            if task_ == "classification":
                k = max(k, int(yt.max(initial=-1)) + 1)
    g = None if groups is None else _groups(groups, None, "client")
    gt = None if gt is None else _groups(gt, groups, "test_path")
    return PooledData(
        x,
        y,
        task_,
        k,
        "csv",
        groups=g,
        x_test=xt,
        y_test=yt,
        groups_test=gt,
        meta={
            "source": f"csv {path}",
            "features": feats,
            "label": label,
            "class_names": names,
            "client_ids": None if groups is None else np.unique(groups).tolist(),
        },
    )


def load_npz_file(path: str, keys: dict[str, str] | None = None, scale: float | None = None) -> PooledData:
    """Arrays from an ``.npz`` file (read without pickle): ``x`` (inputs, ``[N, ...]``: ``[N, C, H, W]`` for
    convolutional models) and ``y`` (integer class indices, or float targets for regression); optional
    ``client`` (``[N]`` client ids, the natural partition) and ``x_test``/``y_test`` (/``client_test``), the
    test set. ``keys`` renames them (e.g. ``{x: images, y: labels}``). ``scale`` divides the inputs (default
    255 for uint8 inputs, so images are in [0, 1]; 1 otherwise)."""
    p = _existing(path, "path", folder=False)
    names = {
        "x": "x",
        "y": "y",
        "client": "client",
        "x_test": "x_test",
        "y_test": "y_test",
        "client_test": "client_test",
    }
    bad = sorted(set(keys or {}) - set(names))
    if bad:
        raise ValueError(f"keys: unknown {bad}; allowed: {sorted(names)}")
    names.update(keys or {})
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[v] for k, v in names.items() if v in z.files}
            stored = list(z.files)
    except (OSError, ValueError) as e:
        raise ValueError(f"path: {p} is not a readable .npz file ({e})") from None
    for k in ("x", "y"):
        if k not in arrays:
            raise ValueError(
                f"keys: {p} has no array {names[k]!r} (the {k} key); allowed: one of {stored}, named "
                f"with keys: {{{k}: <name>}}"
            )
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ValueError(f"path: {p} has only one of {names['x_test']!r}/{names['y_test']!r}; give both or neither")
    if "client" in arrays and "x_test" in arrays and "client_test" not in arrays:
        raise ValueError(
            f"path: {p} has client ids {names['client']!r} and test rows {names['x_test']!r} but no "
            f"{names['client_test']!r}; allowed: client ids for the test rows too, or no client key"
        )
    for k in ("x", "y", "x_test", "y_test"):
        a = arrays.get(k)
        if a is not None and not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            raise ValueError(f"path: {p}: array {names[k]!r} holds {a.dtype} values; allowed: numbers")
        if a is not None and k.startswith("y") and np.issubdtype(a.dtype, np.integer) and a.size and a.min() < 0:
            raise ValueError(
                f"path: {p}: array {names[k]!r} holds the negative class label {int(a.min())}; "
                f"allowed: class indices 0, 1, ... (or float targets for regression)"
            )
    s = float(scale) if scale is not None else (255.0 if arrays["x"].dtype == np.uint8 else 1.0)
    xs = {k: arrays[k].astype(np.float32) / s for k in ("x", "x_test") if k in arrays}
    ys = {}
    for k, xk in (("y", "x"), ("y_test", "x_test")):
        if k in arrays:
            y = arrays[k]
            if y.shape[0] != arrays[xk].shape[0]:
                raise ValueError(f"path: {p}: {names[k]!r} has {y.shape[0]} rows, {names[xk]!r} {arrays[xk].shape[0]}")
            ys[k] = y.astype(np.int64) if np.issubdtype(y.dtype, np.integer) else y.astype(np.float32)
    task: Any = "classification" if all(np.issubdtype(v.dtype, np.integer) for v in ys.values()) else "regression"
    classes = int(max(int(v.max(initial=-1)) for v in ys.values())) + 1 if task == "classification" else None
    g = _groups(arrays["client"], None, "client") if "client" in arrays else None
    gt = (
        _groups(arrays["client_test"], arrays["client"], "client_test")
        if "client_test" in arrays and "client" in arrays
        else None
    )
    return PooledData(
        xs["x"],
        ys["y"],
        task,
        classes,
        "npz",
        groups=g,
        x_test=xs.get("x_test"),
        y_test=ys.get("y_test"),
        groups_test=gt,
        meta={"source": f"npz {path}", "keys": names, "scale": s},
    )
