"""Own data the PyTorch way: map-style ``torch.utils.data.Dataset`` objects turned into federated data.

The engine trains on pooled in-memory tensors (:class:`~fedsolve.data.federated.FederatedData`), so a
Dataset is *materialized*: read once, item by item (``dataset[i]`` for ``i < len(dataset)``), into arrays.
The data must fit in memory. An item is a pair ``(x, y)`` (a tuple, list, or a mapping with those keys or
``image``/``label``); ``x`` is a tensor, an array, a number list or a PIL image (stored as ``[C, H, W]``
float in ``[0, 1]``), ``y`` a class index (classification) or a float (regression).

:func:`as_source` accepts what a data builder (``data.target``) may return:

* one Dataset: pooled samples, split over clients by ``data.partition``;
* a list of Datasets: one per client (natural clients), each split into train/test by ``test_fraction``;
* ``{"train": ..., "test": ...}`` with a Dataset or a list of per-client Datasets in each: the given test
  data is kept (``test_fraction: null``);
* a Hugging Face ``datasets.Dataset`` / ``DatasetDict`` (:mod:`fedsolve.data.hf`);
* a :class:`~fedsolve.data.datasets.PooledData` or a :class:`~fedsolve.data.federated.FederatedData`.

:func:`transform_samples` applies a per-sample transform once, when the data is built (a random
augmentation is drawn once, from torch's generator seeded by the run's seed; it is not redrawn per round).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .federated import FederatedData, Task
from .pooled import PooledData, image_to_array, seed_streams, stratified_split

__all__ = [
    "materialize",
    "pooled_from_dataset",
    "federated_from_client_datasets",
    "as_source",
    "transform_samples",
    "image_to_array",
    "is_dataset",
]


def is_dataset(obj: Any) -> bool:
    """A map-style dataset: it has ``__len__`` and ``__getitem__`` (and is not a plain sequence or mapping)."""
    return (
        hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
        and not isinstance(obj, (list, tuple, str, bytes, Mapping, np.ndarray, torch.Tensor))
    )


def _input(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if hasattr(x, "getbands") and hasattr(x, "mode"):  # a PIL image
        return image_to_array(x)
    return np.asarray(x)


def _pair(item: Any, i: int, what: str) -> tuple[Any, Any]:
    if isinstance(item, Mapping):
        for kx, ky in (("x", "y"), ("image", "label"), ("img", "label"), ("input", "target")):
            if kx in item and ky in item:
                return item[kx], item[ky]
        raise ValueError(
            f"{what}: item {i} is a mapping with keys {sorted(item)}; allowed: keys x/y, image/label or input/target"
        )
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise ValueError(
        f"{what}: item {i} is a {type(item).__name__}"
        f"{f' of length {len(item)}' if isinstance(item, (tuple, list)) else ''}; allowed: a pair "
        f"(x, y) or a mapping with x/y keys"
    )


def materialize(dataset: Any, what: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
    """Read every item of a map-style ``dataset`` once: ``(x [N, ...], y [N])`` as arrays (float32 inputs;
    int64 labels when every label is an integer, else float32 targets)."""
    if not is_dataset(dataset):
        raise ValueError(
            f"{what}: a {type(dataset).__name__} is not a map-style Dataset; allowed: an object "
            f"with __len__ and __getitem__ (torch.utils.data.Dataset)"
        )
    n = len(dataset)
    if n == 0:
        raise ValueError(f"{what}: the Dataset is empty")
    xs: list[np.ndarray] = []
    ys: list[Any] = []  # labels: numbers, or arrays for multi-output targets
    for i in range(n):
        x, y = _pair(dataset[i], i, what)
        x = _input(x)
        if xs and x.shape != xs[0].shape:
            raise ValueError(
                f"{what}: item {i} has input shape {tuple(x.shape)}, item 0 {tuple(xs[0].shape)}; "
                f"allowed: one shape for all samples (resize or pad them in the Dataset or a "
                f"transform)"
            )
        xs.append(x)
        ys.append(y.item() if isinstance(y, (torch.Tensor, np.generic, np.ndarray)) and np.size(y) == 1 else y)
    y = np.asarray(ys)
    if y.dtype == bool or np.issubdtype(y.dtype, np.integer):
        y = y.astype(np.int64)
    elif np.issubdtype(y.dtype, np.floating):
        y = y.astype(np.float32)
    else:
        raise ValueError(
            f"{what}: labels of type {y.dtype} (e.g. {ys[0]!r}); allowed: integer class indices or "
            f"float regression targets"
        )
    return np.stack(xs).astype(np.float32), y


def _task(labels: Sequence[np.ndarray], dataset: Any) -> tuple[Task, int | None]:
    """``(task, num_classes)``: classification for integer labels (the Dataset's ``classes`` count, else the
    largest label + 1), regression for float targets."""
    if all(np.issubdtype(y.dtype, np.integer) for y in labels):
        classes = getattr(dataset, "classes", None)
        top = max(int(y.max()) for y in labels if y.size) + 1
        if min(int(y.min()) for y in labels if y.size) < 0:
            raise ValueError("labels: negative class index; allowed: class indices 0, 1, ...")
        return "classification", max(top, len(classes)) if classes is not None else top
    return "regression", None


def pooled_from_dataset(dataset: Any, test: Any = None, name: str = "dataset") -> PooledData:
    """One Dataset (and optionally its own test Dataset) as :class:`PooledData`, to be partitioned."""
    x, y = materialize(dataset, name)
    xt, yt = materialize(test, f"{name} (test)") if test is not None else (None, None)
    if xt is not None and xt.shape[1:] != x.shape[1:]:
        raise ValueError(f"{name}: test inputs have shape {xt.shape[1:]}, training inputs {x.shape[1:]}")
    task, classes = _task([y] + ([yt] if yt is not None else []), dataset)
    return PooledData(
        x,
        y,
        task,
        classes,
        name,
        x_test=xt,
        y_test=yt,
        meta={"source": f"torch Dataset {type(dataset).__name__}", "materialized": True},
    )


def federated_from_client_datasets(
    train: Sequence[Any],
    test: Sequence[Any] | None = None,
    *,
    test_fraction: float | None = 0.25,
    seed: int = 0,
    name: str = "dataset",
) -> FederatedData:
    """One Dataset per client (``train[i]`` is client ``i``'s) with its test split: ``test[i]`` when ``test`` is
    given and ``test_fraction`` is None; otherwise the client's samples (with ``test[i]``'s, when given, as a
    registry dataset's own test set is pooled) split into train/test by ``test_fraction`` (stratified by
    label, drawn from ``seed``, as :func:`~fedsolve.data.datasets.build_federated` splits)."""
    if not train:
        raise ValueError(f"{name}: the list of client Datasets is empty")
    if test is not None and len(test) != len(train):
        raise ValueError(
            f"{name}: {len(train)} client training Datasets but {len(test)} test Datasets; allowed: "
            f"one test Dataset per client"
        )
    tr = [materialize(d, f"{name} client {i}") for i, d in enumerate(train)]
    te = None if test is None else [materialize(d, f"{name} client {i} (test)") for i, d in enumerate(test)]
    if test_fraction is None:
        if te is None:
            raise ValueError(
                f"{name}: test_fraction null keeps given test data, and only training Datasets were "
                f"given; allowed: a number in (0, 1), or return {{'train': [...], 'test': [...]}}"
            )
    else:
        if te is not None:  # pooled per client, then split like the rest
            tr = [(np.concatenate([x, xt]), np.concatenate([y, yt])) for (x, y), (xt, yt) in zip(tr, te)]
        rng = seed_streams(seed)[2]
        te, kept = [], []
        for x, y in tr:
            a, b = stratified_split(y, test_fraction, rng, stratify=np.issubdtype(y.dtype, np.integer))
            kept.append((x[a], y[a]))
            te.append((x[b], y[b]))
        tr = kept
    shapes = {x.shape[1:] for x, _ in tr + te}
    if len(shapes) > 1:
        raise ValueError(f"{name}: the clients' inputs have different shapes {sorted(shapes)}; allowed: one shape")
    task, classes = _task([y for _, y in tr + te], train[0])
    return FederatedData.from_client_arrays(
        tr,
        te,
        task=task,
        num_classes=classes,
        name=name,
        meta={
            "source": f"{len(train)} client Datasets ({type(train[0]).__name__})",
            "materialized": True,
            "test": "given" if test_fraction is None else {"test_fraction": test_fraction, "seed": seed},
        },
    )


def as_source(
    obj: Any, *, test_fraction: float | None, seed: int, name: str, what: str = "data.target"
) -> PooledData | FederatedData:
    """What a data builder returned (see the module docstring), as data :func:`federate` takes."""
    if isinstance(obj, (PooledData, FederatedData)):
        return obj
    if type(obj).__module__.split(".")[0] == "datasets":  # Hugging Face datasets
        from .hf import pooled_from_hf

        return pooled_from_hf(obj, name=name)
    if isinstance(obj, Mapping) and "train" in obj and set(obj) <= {"train", "test"}:
        train, test = obj["train"], obj.get("test")
        if isinstance(train, (list, tuple)):
            return federated_from_client_datasets(
                list(train), None if test is None else list(test), test_fraction=test_fraction, seed=seed, name=name
            )
        return pooled_from_dataset(train, test, name)
    if isinstance(obj, (list, tuple)) and obj and all(is_dataset(d) for d in obj):
        return federated_from_client_datasets(list(obj), test_fraction=test_fraction, seed=seed, name=name)
    if is_dataset(obj):
        return pooled_from_dataset(obj, name=name)
    raise ValueError(
        f"{what}: returned a {type(obj).__name__}; allowed: a map-style torch Dataset, a list of "
        f"Datasets (one per client), {{'train': ..., 'test': ...}}, a datasets.Dataset/DatasetDict, "
        f"PooledData or FederatedData"
    )


def _transformed(x: np.ndarray, fn: Callable, what: str) -> np.ndarray:
    out: list[np.ndarray] = []
    for i in range(x.shape[0]):
        try:
            r = fn(torch.from_numpy(np.array(x[i])))
        except Exception as e:  # noqa: BLE001  (the user's transform raised: one line naming the sample)
            raise ValueError(
                f"{what}: the transform raised {type(e).__name__} on sample {i}: {' '.join(str(e).split())}"
            ) from None
        r = r.detach().cpu().numpy() if isinstance(r, torch.Tensor) else np.asarray(r)
        if out and r.shape != out[0].shape:
            raise ValueError(
                f"{what}: sample {i} came out with shape {r.shape}, sample 0 with {out[0].shape}; "
                f"allowed: a transform giving one shape for all samples"
            )
        out.append(r)
    return np.stack(out).astype(np.float32) if out else x


def transform_samples(
    data: PooledData | FederatedData, fn: Callable, seed: int = 0, what: str = "data.sample_transform"
) -> PooledData | FederatedData:
    """``data`` with ``fn`` applied to every sample's input (a float tensor; training and test samples), once.

    Random draws of ``fn`` come from torch's generator, seeded with ``seed`` (the same seed gives the same
    data; the process's own generator is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(data, FederatedData):
            dt = data.train_x.dtype
            tx = torch.from_numpy(_transformed(data.train_x.numpy(), fn, what)).to(dt)
            sx = (
                torch.from_numpy(_transformed(data.test_x.numpy(), fn, what)).to(dt)
                if len(data.test_x)
                else data.test_x.new_zeros((0, *tx.shape[1:]))
            )
            return dataclasses.replace(data, train_x=tx, test_x=sx, meta=dict(data.meta))
        x = _transformed(np.asarray(data.x), fn, what)
        xt = None if data.x_test is None else _transformed(np.asarray(data.x_test), fn, what)
    return dataclasses.replace(data, x=x, x_test=xt, meta=dict(data.meta))
