"""Hugging Face ``datasets`` and flwr-datasets' partitioners (optional: ``pip install 'fedsolve[hf]'``).

* :func:`pooled_from_hf` turns a ``datasets.Dataset`` (or a ``DatasetDict`` with a ``train`` and maybe a
  ``test`` split) into :class:`~fedsolve.data.datasets.PooledData`: one input column and one label column,
  read once into memory (images as ``[C, H, W]`` float in ``[0, 1]``).
* :func:`load_hf` (dataset ``hf``) loads a dataset folder written by ``save_to_disk`` (``path``), or a dataset
  by name from the Hugging Face hub (``name``; this downloads, with the package's own cache).
* :func:`flwr_partition` (partition ``flwr``) runs any flwr-datasets partitioner (``DirichletPartitioner``,
  ``ShardPartitioner``, ``IidPartitioner``, ...) on the labels of any pooled dataset.

Neither package is imported before one of these functions is called.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .federated import Task
from .pooled import PooledData, image_to_array

__all__ = ["pooled_from_hf", "load_hf", "flwr_partition"]

_EXTRA = "install the optional extra: pip install 'fedsolve[hf]'"


def _require(module: str, what: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{what}: needs the package {module.replace('_', '-')!r}; {_EXTRA}") from None


def _column(ds, col: str) -> np.ndarray:
    values = list(ds[col])
    if values and hasattr(values[0], "getbands"):  # PIL images (a datasets.Image feature)
        arrays = [image_to_array(v) for v in values]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(
                f"input: the images of column {col!r} have different sizes {sorted(shapes)[:3]}; "
                f"allowed: one size (resize them with ds.map first)"
            )
        return np.stack(arrays)
    return np.asarray(values)


def _split(ds, input: str | None, label: str) -> tuple[np.ndarray, np.ndarray, str]:
    cols = list(ds.column_names)
    if label not in cols:
        raise ValueError(f"label: no column {label!r}; allowed: {cols}")
    if input is None:
        rest = [c for c in cols if c != label]
        if len(rest) != 1:
            raise ValueError(f"input: the dataset has columns {cols}; name the input column (input: <column>)")
        input = rest[0]
    elif input not in cols:
        raise ValueError(f"input: no column {input!r}; allowed: {cols}")
    x, y = _column(ds, input), np.asarray(list(ds[label]))
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise ValueError(f"input: column {input!r} holds {x.dtype} values; allowed: numbers, arrays or images")
    return x.astype(np.float32), y, input


def pooled_from_hf(obj: Any, input: str | None = None, label: str = "label", name: str = "hf") -> PooledData:
    """A Hugging Face ``Dataset`` (pooled samples) or ``DatasetDict`` (its ``train`` split, and its ``test``
    split as the test set) as :class:`PooledData`. ``input``: the input column (default: the only column
    besides ``label``). Integer labels are classes (a ``ClassLabel`` feature gives their number and names),
    float labels regression targets."""
    datasets = _require("datasets", "a Hugging Face dataset")
    if isinstance(obj, (datasets.DatasetDict, dict)):
        splits = dict(obj)
    elif isinstance(obj, datasets.Dataset):
        splits = {"train": obj}
    else:
        raise ValueError(
            f"a {type(obj).__name__} is not a datasets.Dataset or DatasetDict; allowed: a map-style "
            f"dataset held locally (an iterable/streaming dataset cannot be read into memory once)"
        )
    if "train" not in splits:
        raise ValueError(
            f"split: the DatasetDict has splits {sorted(splits)}; allowed: one named 'train' (and "
            f"'test'), or pass one split"
        )
    x, y, col = _split(splits["train"], input, label)
    xt, yt = _split(splits["test"], col, label)[:2] if "test" in splits else (None, None)
    feature = splits["train"].features.get(label)
    classes = list(getattr(feature, "names", None) or []) or None
    task: Task
    if np.issubdtype(y.dtype, np.integer) and (yt is None or np.issubdtype(yt.dtype, np.integer)):
        k = max(int(y.max(initial=-1)), int(yt.max(initial=-1)) if yt is not None else -1) + 1
        task, k = "classification", max(k, len(classes or []))
        y, yt = y.astype(np.int64), None if yt is None else yt.astype(np.int64)
    else:
        task, k = "regression", None
        y, yt = y.astype(np.float32), None if yt is None else yt.astype(np.float32)
    return PooledData(
        x,
        y,
        task,
        k,
        name,
        x_test=xt,
        y_test=yt,
        meta={
            "source": "Hugging Face datasets",
            "input": col,
            "label": label,
            "class_names": classes,
            "splits": sorted(splits),
        },
    )


def load_hf(
    path: str | None = None,
    name: str | None = None,
    config: str | None = None,
    input: str | None = None,
    label: str = "label",
) -> PooledData:
    """Dataset ``hf``: a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``path``),
    or ``datasets.load_dataset(name, config)`` from the hub (downloads); then :func:`pooled_from_hf`."""
    datasets = _require("datasets", "dataset 'hf'")
    if (path is None) == (name is None):
        raise ValueError("params: give exactly one of path (a saved dataset folder) and name (a hub dataset)")
    if path is not None:
        try:
            obj = datasets.load_from_disk(path)
        except FileNotFoundError as e:
            raise ValueError(f"path: {path} is not a dataset folder written by save_to_disk ({e})") from None
    else:
        obj = datasets.load_dataset(name, config)
    return pooled_from_hf(obj, input=input, label=label, name=name or "hf")


def flwr_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    partitioner: str = "DirichletPartitioner",
    **params: Any,
) -> list[np.ndarray]:
    """Partition ``flwr``: the flwr-datasets class ``partitioner`` with ``params`` (e.g. ``alpha``,
    ``min_partition_size``) over a table of the labels (column ``label``); ``num_partitions`` is
    ``num_clients``, ``partition_by`` defaults to ``label`` and ``seed`` to a draw from ``rng``. Some
    partitioners leave samples out (e.g. ``ShardPartitioner``); each sample is in at most one client."""
    datasets = _require("datasets", "partition 'flwr'")
    module = _require("flwr_datasets.partitioner", "partition 'flwr'")
    names = sorted(n for n in dir(module) if n.endswith("Partitioner") and n != "Partitioner")
    cls = getattr(module, partitioner, None) if partitioner in names else None
    if cls is None:
        raise ValueError(f"partition_params.partitioner: {partitioner!r}; allowed: {names}")
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    bad = sorted(set(params) - set(accepted))
    if bad or "num_partitions" in params:
        raise ValueError(
            f"partition_params: {partitioner} takes no {bad or ['num_partitions']} here; allowed: "
            f"{[p for p in accepted if p != 'num_partitions']} (num_partitions is num_clients)"
        )
    kw = dict(params)
    if "num_partitions" in accepted:
        kw["num_partitions"] = num_clients
    if "partition_by" in accepted:
        kw.setdefault("partition_by", "label")
    if "seed" in accepted:
        kw.setdefault("seed", int(rng.integers(2**31 - 1)))
    labels = np.asarray(labels)
    table = datasets.Dataset.from_dict({"label": labels.tolist(), "row": np.arange(labels.size).tolist()})
    p = cls(**kw)
    p.dataset = table
    n = getattr(p, "num_partitions", num_clients)
    if n != num_clients:
        raise ValueError(f"partition_params: {partitioner} made {n} partitions, num_clients is {num_clients}")
    return [np.sort(np.asarray(p.load_partition(i)["row"], dtype=np.int64)) for i in range(num_clients)]
