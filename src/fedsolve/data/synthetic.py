"""Synthetic federated data with known clusters.

* :func:`fpfc_synthetic` -- FPFC's clustered multinomial-logistic data (Yu et al., FPFC, Sec. 6.1 and
  App. E.1; code ``generate_synthetic_dataset.py``), scenarios S1..S5.
* :func:`toy1d` -- the 1-D two-cluster regression of FPFC Fig. 1 (after Ma & Huang 2017).
* :func:`clustered_regression` -- a linear-regression population with known clusters (closed-form tests).
* :func:`fedprox_synthetic` -- FedProx's Synthetic(alpha, beta) heterogeneous logistic data (Li et al. 2020),
  used by FedAPM's code for theory checks (FedAPM spec sec. 7).

All return :class:`~fedsolve.data.federated.FederatedData` (with ``clusters`` set, except
``fedprox_synthetic``, which has no cluster structure); the same seed gives
identical data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from .federated import FederatedData

__all__ = [
    "FPFC_SCENARIOS",
    "fpfc_sizes",
    "fpfc_synthetic",
    "toy1d",
    "clustered_regression",
    "fedprox_synthetic",
    "split_clients",
]

#: cluster sizes (devices per cluster) of FPFC's scenarios (App. E.1).
FPFC_SCENARIOS: dict[str, tuple[int, ...]] = {
    "S1": (25, 25, 25, 25),  # balanced, L = 4, m = 100 (main)
    "S2": (10, 40, 10, 40),  # unbalanced, L = 4, m = 100
    "S3": (50, 50),  # balanced, L = 2, m = 100
    "S4": (50,),  # unstructured, L = 1, m = 50
    "S5": (1,) * 50,  # personalized, L = m = 50
}


def split_clients(
    xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], rng: np.random.Generator, test_fraction: float
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]]]:
    """Random per-client train/test split; the test part has ``round(test_fraction * n_i)`` samples."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    train, test = [], []
    for x, y in zip(xs, ys):
        n = len(y)
        perm = rng.permutation(n)
        nt = round(test_fraction * n)
        te, tr = perm[:nt], perm[nt:]
        train.append((x[tr], y[tr]))
        test.append((x[te], y[te]))
    return train, test


def _scenario_sizes(scenario: str | Sequence[int]) -> tuple[int, ...]:
    if isinstance(scenario, str):
        key = scenario.upper()
        if key not in FPFC_SCENARIOS:
            raise ValueError(
                f"scenario must be one of {sorted(FPFC_SCENARIOS)} or a list of cluster sizes, got {scenario!r}"
            )
        return FPFC_SCENARIOS[key]
    sizes = tuple(int(s) for s in scenario)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"scenario cluster sizes must be positive integers, got {scenario!r}")
    return sizes


def fpfc_sizes(
    num_clients: int,
    rng: np.random.Generator,
    *,
    size_scale: float = 1.0,
    max_size: int | None = None,
    min_size: int = 2,
) -> np.ndarray:
    """Device sample counts ``n_i = 5 * (int(LogNormal(4, 2)) + 50)`` (FPFC code; range [250, ~25810]).

    ``size_scale`` multiplies the counts (e.g. 0.05 for fast tests) and ``max_size`` caps them; the
    result is at least ``min_size``.
    """
    if not size_scale > 0:
        raise ValueError(f"size_scale must be > 0, got {size_scale!r}")
    n = 5 * (rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + 50)
    n = np.rint(n * float(size_scale)).astype(np.int64)
    if max_size is not None:
        n = np.minimum(n, int(max_size))
    return np.maximum(n, int(min_size))


def fpfc_synthetic(
    scenario: str | Sequence[int] = "S1",
    *,
    seed: int = 0,
    dim: int = 60,
    num_classes: int = 10,
    features: Literal["normal", "uniform"] = "normal",
    noise_std: float = 0.5,
    size_scale: float = 1.0,
    max_size: int | None = None,
    test_fraction: float = 0.2,
) -> FederatedData:
    """FPFC synthetic multinomial-logistic clusters (FPFC Sec. 6.1 / App. E.1).

    Devices form contiguous blocks of the scenario's cluster sizes (S1: 4 x 25). Device counts follow
    :func:`fpfc_sizes`. Per cluster ``l``: ``mu_l ~ N(0, 1)``; ``W_l`` (``C x d``) and ``b_l`` (``C``)
    have i.i.d. ``N(mu_l, 1)`` entries (the code's shared ``mu_l``). Features are ``N(0, I_d)`` (paper;
    ``features="uniform"`` gives the code's ``U[0, 1)^d``). Labels are
    ``argmax(W_l x + b_l + tau)``, ``tau ~ N(0, noise_std^2 I_C)``. Each device is split 80/20 at random.
    """
    if features not in ("normal", "uniform"):
        raise ValueError(f"features must be one of ['normal', 'uniform'], got {features!r}")
    sizes = _scenario_sizes(scenario)
    rng = np.random.default_rng(seed)
    clusters = np.repeat(np.arange(len(sizes)), sizes)
    m = clusters.size
    n_i = fpfc_sizes(m, rng, size_scale=size_scale, max_size=max_size)
    mus = rng.normal(0.0, 1.0, size=len(sizes))
    Ws = [rng.normal(mu, 1.0, size=(num_classes, dim)) for mu in mus]
    bs = [rng.normal(mu, 1.0, size=num_classes) for mu in mus]
    xs, ys = [], []
    for i in range(m):
        l = clusters[i]
        if features == "normal":
            x = rng.normal(0.0, 1.0, size=(n_i[i], dim))
        else:
            x = rng.random(size=(n_i[i], dim))
        tau = rng.normal(0.0, noise_std, size=(n_i[i], num_classes))
        y = np.argmax(x @ Ws[l].T + bs[l] + tau, axis=1)
        xs.append(x.astype(np.float32))
        ys.append(y.astype(np.int64))
    train, test = split_clients(xs, ys, rng, test_fraction)
    name = scenario.upper() if isinstance(scenario, str) else "custom"
    return FederatedData.from_client_arrays(
        train,
        test,
        task="classification",
        num_classes=num_classes,
        clusters=clusters.tolist(),
        name=f"synthetic_fpfc_{name}",
        meta={
            "dataset": "synthetic_fpfc",
            "scenario": name,
            "cluster_sizes": list(sizes),
            "seed": seed,
            "features": features,
            "size_scale": size_scale,
            "max_size": max_size,
            "true_W": np.stack(Ws).tolist() if dim * num_classes * len(sizes) <= 20000 else None,
            "true_b": np.stack(bs).tolist(),
        },
    )


def toy1d(
    *,
    seed: int = 0,
    num_clients: int = 50,
    samples_per_client: int = 20,
    betas: Sequence[float] = (-1.0, 1.0),
    noise_std: float = 0.5,
    intercept_only: bool = False,
    test_fraction: float = 0.2,
) -> FederatedData:
    """FPFC Fig. 1 toy: 1-D regression, ``num_clients`` devices in contiguous blocks over ``betas``.

    ``y = beta_i x + N(0, noise_std^2)`` with ``x ~ N(0, 1)`` and ``x`` of shape ``[n, 1]``
    (the spec's suggestion; the paper gives no generation details). With ``intercept_only`` the
    feature is the constant 1, so ``y = beta_i + noise``.
    """
    if num_clients < len(betas):
        raise ValueError(f"num_clients must be >= len(betas) ({len(betas)}), got {num_clients}")
    rng = np.random.default_rng(seed)
    L = len(betas)
    clusters = (np.arange(num_clients) * L) // num_clients
    xs, ys = [], []
    for i in range(num_clients):
        x = np.ones((samples_per_client, 1)) if intercept_only else rng.normal(size=(samples_per_client, 1))
        y = betas[clusters[i]] * x[:, 0] + rng.normal(0.0, noise_std, size=samples_per_client)
        xs.append(x.astype(np.float32))
        ys.append(y.astype(np.float32))
    train, test = split_clients(xs, ys, rng, test_fraction)
    return FederatedData.from_client_arrays(
        train,
        test,
        task="regression",
        clusters=clusters.tolist(),
        name="toy1d",
        meta={
            "dataset": "toy1d",
            "betas": list(betas),
            "noise_std": noise_std,
            "seed": seed,
            "intercept_only": intercept_only,
        },
    )


def clustered_regression(
    *,
    seed: int = 0,
    cluster_sizes: Sequence[int] = (5, 5),
    dim: int = 10,
    samples_per_client: int | Sequence[int] = 50,
    noise_std: float = 0.1,
    center_scale: float = 1.0,
    within_std: float = 0.0,
    test_fraction: float = 0.2,
) -> FederatedData:
    """Linear regression population with known clusters: ``y = x^T w_i + eps``.

    Cluster ``l`` has ``w_l ~ N(0, center_scale^2 I)``; client weights are ``w_i = w_l + N(0, within_std^2)``
    (``within_std = 0`` gives exact cluster structure). ``x ~ N(0, I_dim)``; ``eps ~ N(0, noise_std^2)``.
    The true ``w_i`` are in ``meta["true_w"]``.
    """
    sizes = _scenario_sizes(list(cluster_sizes))
    rng = np.random.default_rng(seed)
    clusters = np.repeat(np.arange(len(sizes)), sizes)
    m = clusters.size
    n = np.broadcast_to(np.asarray(samples_per_client, dtype=np.int64), (m,))
    centers = rng.normal(0.0, center_scale, size=(len(sizes), dim))
    ws = centers[clusters] + rng.normal(0.0, within_std, size=(m, dim)) * (within_std > 0)
    xs, ys = [], []
    for i in range(m):
        x = rng.normal(size=(int(n[i]), dim))
        y = x @ ws[i] + rng.normal(0.0, noise_std, size=int(n[i]))
        xs.append(x.astype(np.float32))
        ys.append(y.astype(np.float32))
    train, test = split_clients(xs, ys, rng, test_fraction)
    return FederatedData.from_client_arrays(
        train,
        test,
        task="regression",
        clusters=clusters.tolist(),
        name="clustered_regression",
        meta={
            "dataset": "clustered_regression",
            "cluster_sizes": list(sizes),
            "seed": seed,
            "true_w": ws.tolist(),
            "noise_std": noise_std,
        },
    )


def fedprox_synthetic(
    alpha: float = 0.5,
    beta: float = 0.5,
    *,
    seed: int = 0,
    num_clients: int = 30,
    dim: int = 60,
    num_classes: int = 10,
    size_scale: float = 1.0,
    max_size: int | None = None,
    iid: bool = False,
    test_fraction: float = 0.2,
) -> FederatedData:
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, Sec. 5.1; also shipped with FedAPM's code).

    Device ``k``: ``u_k ~ N(0, alpha)``, ``W_k`` (``C x d``) and ``b_k`` i.i.d. ``N(u_k, 1)``;
    ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` (``d``-vector); ``x ~ N(v_k, Sigma)`` with
    ``Sigma_jj = j^-1.2``; ``y = argmax(W_k x + b_k)``. Sizes ``n_k = int(LogNormal(4, 2)) + 50``
    (times ``size_scale``, capped at ``max_size``). ``iid=True`` shares one ``W, b`` and ``v = 0``
    (FedProx's Synthetic-IID). No clusters: ``clusters`` is ``None``.
    """
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha!r}, beta={beta!r}")
    if not size_scale > 0:
        raise ValueError(f"size_scale must be > 0, got {size_scale!r}")
    rng = np.random.default_rng(seed)
    n = rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + 50
    n = np.maximum(np.rint(n * float(size_scale)).astype(np.int64), 2)
    if max_size is not None:
        n = np.minimum(n, int(max_size))
    sd = np.arange(1, dim + 1, dtype=np.float64) ** (-1.2 / 2)
    W0, b0 = rng.normal(size=(num_classes, dim)), rng.normal(size=num_classes)
    xs, ys = [], []
    for k in range(num_clients):
        if iid:
            W, b, v = W0, b0, np.zeros(dim)
        else:
            u = rng.normal(0.0, np.sqrt(alpha))
            W, b = rng.normal(u, 1.0, size=(num_classes, dim)), rng.normal(u, 1.0, size=num_classes)
            v = rng.normal(rng.normal(0.0, np.sqrt(beta)), 1.0, size=dim)
        x = v + rng.normal(size=(int(n[k]), dim)) * sd
        xs.append(x.astype(np.float32))
        ys.append(np.argmax(x @ W.T + b, axis=1).astype(np.int64))
    train, test = split_clients(xs, ys, rng, test_fraction)
    return FederatedData.from_client_arrays(
        train,
        test,
        task="classification",
        num_classes=num_classes,
        name=f"fedprox_synthetic_{alpha}_{beta}" if not iid else "fedprox_synthetic_iid",
        meta={"dataset": "fedprox_synthetic", "alpha": alpha, "beta": beta, "iid": iid, "seed": seed},
    )
