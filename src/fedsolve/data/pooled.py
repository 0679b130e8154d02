"""Samples before they are split over clients (:class:`PooledData`) and what every loader shares: subsampling,
image arrays (``[C, H, W]`` float32 in ``[0, 1]``), the stratified train/test split and a build's random streams.
The registry and the federated builder are in ``datasets.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .federated import Task


@dataclass
class PooledData:
    """A dataset before partitioning.

    ``x``/``y`` are all samples (or the training part when ``x_test`` is given: the dataset's own test
    set, used when :func:`build_federated` is called with ``test_fraction=None``). ``groups`` are
    natural client ids (e.g. HAPT user), used by the ``natural`` partition.
    """

    x: np.ndarray
    y: np.ndarray
    task: Task = "classification"
    num_classes: int | None = None
    name: str = "data"
    groups: np.ndarray | None = None
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _subsample(x: np.ndarray, y: np.ndarray, limit: int | None, rng: np.random.Generator, name: str):
    if limit is None or limit >= len(y):
        return x, y
    if limit < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {limit!r}")
    idx = np.sort(rng.choice(len(y), size=int(limit), replace=False))
    return x[idx], y[idx]


# ----------------------------------------------------------------------------- sklearn sets


def pooled_images(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    limit: int | None,
    test_limit: int | None,
    seed: int,
    meta: dict[str, Any],
) -> PooledData:
    """uint8 images (``[N, H, W]`` grey or ``[N, C, H, W]``) with their own test set as :class:`PooledData`
    ``[C, H, W]`` in [0, 1]; ``limit``/``test_limit`` take random subsets drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    xtr, ytr = _subsample(x, y, limit, rng, "limit")
    xte, yte = _subsample(x_test, y_test, test_limit, rng, "test_limit")
    f = lambda a: (a.astype(np.float32) / 255.0)[:, None, :, :] if a.ndim == 3 else a.astype(np.float32) / 255.0
    return PooledData(
        f(xtr),
        np.asarray(ytr).astype(np.int64),
        "classification",
        num_classes,
        name,
        x_test=f(xte),
        y_test=np.asarray(yte).astype(np.int64),
        meta={**meta, "limit": limit, "test_limit": test_limit},
    )


def stratified_split(
    y: np.ndarray, test_fraction: float, rng: np.random.Generator, stratify: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's indices into (train, test), ``round(test_fraction * n)`` test samples.

    Stratified: shuffle, sort stably by label, and take evenly spaced positions as the test set, so
    every label is represented in proportion (up to rounding). At least one sample stays in train.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1) or None, got {test_fraction!r}")
    n = len(y)
    perm = rng.permutation(n)
    if stratify:
        perm = perm[np.argsort(np.asarray(y)[perm], kind="stable")]
    nt = min(round(test_fraction * n), max(n - 1, 0))
    mask = np.zeros(n, dtype=bool)
    if nt > 0:
        mask[np.floor((np.arange(nt) + 0.5) * n / nt).astype(np.int64)] = True
    return np.sort(perm[~mask]), np.sort(perm[mask])


def seed_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """The three independent random streams a federated build draws from ``seed``: the partition, the second
    partition of a dataset's own test set, and the per-client train/test splits."""
    part, test_part, split = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    return part, test_part, split


def image_to_array(img: Any, mode: str | None = None) -> np.ndarray:
    """A PIL image as a ``[C, H, W]`` float32 array in ``[0, 1]`` (``mode``: convert first, e.g. ``"RGB"``,
    ``"L"``)."""
    if mode is not None and img.mode != mode:
        img = img.convert(mode)
    elif img.mode not in ("L", "RGB"):
        img = img.convert("RGB" if img.mode in ("RGBA", "P", "CMYK", "YCbCr", "LA") else "L")
    a = np.asarray(img)
    a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return a.astype(np.float32) / (255.0 if a.dtype == np.uint8 else 65535.0 if a.dtype == np.uint16 else 1.0)
