"""Standard image sets read from torchvision's on-disk formats, with no download and no torchvision.

A folder that ``torchvision.datasets.MNIST(root, download=True)`` (or ``FashionMNIST``, ``CIFAR10``,
``CIFAR100``) filled is read as it is, by our own readers:

* MNIST / Fashion-MNIST: ``root/MNIST/raw/`` (``root/FashionMNIST/raw/``) with the four IDX files
  ``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, raw or ``.gz``;
* CIFAR-10: ``root/cifar-10-batches-py/`` with the python pickle batches ``data_batch_1`` .. ``data_batch_5``,
  ``test_batch`` and ``batches.meta``;
* CIFAR-100: ``root/cifar-100-python/`` with ``train``, ``test`` and ``meta``.

The pickles are read with an unpickler that admits only the numpy array classes they hold (a pickle can
run code; these cannot). Images are ``[C, H, W]`` float32 in ``[0, 1]``; the set's own test split is
``x_test`` (kept with ``test_fraction: null``). No package registry reachable from a machine without the
internet carries CIFAR: there the readers are tested on small files in the real format.
"""

from __future__ import annotations

import _codecs
import gzip
import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .fetch import read_idx

__all__ = ["read_torchvision_idx", "load_cifar10", "load_cifar100", "read_cifar_batch", "TORCHVISION_FOLDERS"]

#: the class folder name torchvision gives each IDX set under ``root``
TORCHVISION_FOLDERS = {"mnist": "MNIST", "fmnist": "FashionMNIST"}
_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def read_torchvision_idx(root: str | Path, name: str) -> dict[str, np.ndarray]:
    """The four IDX arrays (``x_train``, ``y_train``, ``x_test``, ``y_test``, uint8) of torchvision's folder for
    ``name`` (``mnist`` or ``fmnist``) under ``root``: ``root/<MNIST|FashionMNIST>/raw/``, or ``root`` itself
    when it is that ``raw`` folder. A raw file is preferred to its ``.gz``."""
    folder = TORCHVISION_FOLDERS[name]
    root = Path(root)
    for d in (root / folder / "raw", root / "raw", root):
        found = {}
        for key, stem in _IDX_FILES.items():
            f = next((d / (stem + s) for s in ("", ".gz") if (d / (stem + s)).is_file()), None)
            if f is not None:
                found[key] = f
        if len(found) == len(_IDX_FILES):
            return {k: read_idx(f) for k, f in found.items()}
    raise ValueError(
        f"root: no torchvision {folder} folder at {root} (looked for {folder}/raw/"
        f"{_IDX_FILES['x_train']}[.gz] and the three other IDX files); allowed: the root folder that "
        f"torchvision.datasets.{folder}(root, download=True) filled, or leave root unset to use the "
        f"registry mirror"
    )


def _restricted_unpickler(f, what: str) -> pickle.Unpickler:
    try:
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer  # type: ignore[attr-defined]  # private, not in the stubs
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]  # the same function, older path
        from numpy.core.numeric import _frombuffer  # type: ignore[no-redef]  # the same function, older path
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _codecs.encode}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = _frombuffer

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            try:
                return allowed[(module, name)]
            except KeyError:
                raise pickle.UnpicklingError(
                    f"{what}: refused global {module}.{name}; a CIFAR batch holds only numpy arrays, lists and strings"
                ) from None

    return Unpickler(f, encoding="bytes")


def read_cifar_batch(path: str | Path) -> dict[str, Any]:
    """One CIFAR python batch as a dict with ``str`` keys (the file's keys are bytes, written by Python 2)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"root: {path} is missing; allowed: a complete folder as torchvision's download leaves it")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            d = _restricted_unpickler(f, str(path)).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as e:
        raise ValueError(f"root: {path} is not a CIFAR python batch ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"root: {path} holds a {type(d).__name__}, not a CIFAR batch dict")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in d.items()}


def _images(batch: dict, path: Path) -> np.ndarray:
    data = np.asarray(batch.get("data"))
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"root: {path}: 'data' has shape {data.shape}; a CIFAR batch holds [N, 3072] uint8 rows")
    return data.reshape(-1, 3, 32, 32)


def _names(meta: dict, key: str) -> list[str]:
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in meta.get(key, [])]


def _pooled(name: str, x, y, xt, yt, classes: list[str], num_classes: int, limit, test_limit, seed, meta):
    from .pooled import pooled_images

    return pooled_images(
        name,
        x,
        np.asarray(y),
        xt,
        np.asarray(yt),
        num_classes,
        limit,
        test_limit,
        seed,
        {**meta, "class_names": classes},
    )


def _cifar_dir(root: str | Path, sub: str, cls: str) -> Path:
    root = Path(root)
    for d in (root / sub, root):
        if d.is_dir() and d.name == sub:
            return d
    raise ValueError(
        f"root: no {sub}/ folder at {root}; allowed: the root folder that torchvision.datasets."
        f"{cls}(root, download=True) filled (CIFAR is in no package registry: download it on a machine "
        f"with the internet and copy the folder)"
    )


def load_cifar10(root: str, limit: int | None = None, test_limit: int | None = None, seed: int = 0):
    """CIFAR-10 (Krizhevsky 2009) from torchvision's folder ``root/cifar-10-batches-py/``: 50k train + 10k test
    ``[3, 32, 32]`` in [0, 1], 10 classes; ``limit``/``test_limit`` take seeded random subsets."""
    d = _cifar_dir(root, "cifar-10-batches-py", "CIFAR10")
    xs, ys = [], []
    for k in range(1, 6):
        b = read_cifar_batch(d / f"data_batch_{k}")
        xs.append(_images(b, d / f"data_batch_{k}"))
        ys += list(b["labels"])
    t = read_cifar_batch(d / "test_batch")
    meta = read_cifar_batch(d / "batches.meta") if (d / "batches.meta").is_file() else {}
    return _pooled(
        "cifar10",
        np.concatenate(xs),
        ys,
        _images(t, d / "test_batch"),
        t["labels"],
        _names(meta, "label_names"),
        10,
        limit,
        test_limit,
        seed,
        {"source": f"torchvision folder {d}"},
    )


def load_cifar100(
    root: str,
    labels: Literal["fine", "coarse"] = "fine",
    limit: int | None = None,
    test_limit: int | None = None,
    seed: int = 0,
):
    """CIFAR-100 from torchvision's folder ``root/cifar-100-python/``: 50k train + 10k test ``[3, 32, 32]`` in
    [0, 1]; ``labels``: ``fine`` (100 classes) or ``coarse`` (20 superclasses)."""
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels: {labels!r}; allowed: 'fine', 'coarse'")
    d = _cifar_dir(root, "cifar-100-python", "CIFAR100")
    tr, te = read_cifar_batch(d / "train"), read_cifar_batch(d / "test")
    meta = read_cifar_batch(d / "meta") if (d / "meta").is_file() else {}
    key = f"{labels}_labels"
    return _pooled(
        "cifar100",
        _images(tr, d / "train"),
        tr[key],
        _images(te, d / "test"),
        te[key],
        _names(meta, f"{labels}_label_names"),
        100 if labels == "fine" else 20,
        limit,
        test_limit,
        seed,
        {"source": f"torchvision folder {d}", "labels": labels},
    )
