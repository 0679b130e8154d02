"""Partitioners: split a pooled labelled dataset over federated clients.

Every partitioner has the signature ``fn(labels, num_clients, rng, **params) -> list[np.ndarray]``
and returns one int64 index array per client. Unless a partitioner's docstring says otherwise,
every sample is assigned to exactly one client. ``PARTITIONERS`` maps a name to ``(fn, description)``.

The clustered transforms (:func:`label_swap`, :func:`rotation`) work on per-client arrays after
partitioning and return the transformed arrays together with the true cluster id of each client
(contiguous blocks ``i * L // m``, i.e. ``i // (m/L)`` when ``L`` divides ``m``, as in FPFC).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

Partitioner = Callable[..., list[np.ndarray]]

__all__ = [
    "PARTITIONERS",
    "CLUSTER_TRANSFORMS",
    "get_partitioner",
    "partition",
    "iid",
    "dirichlet",
    "shards",
    "lognormal",
    "natural",
    "cluster_blocks",
    "label_swap",
    "rotation",
    "rotate_images",
]


# ----------------------------------------------------------------------------- helpers
def _check_common(labels: np.ndarray, num_clients: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
    if num_clients > labels.shape[0]:
        raise ValueError(
            f"num_clients: {num_clients} clients exceed the {labels.shape[0]} samples; allowed: 1 to {labels.shape[0]}"
        )
    return labels


def _check_min_size(min_size: int, n: int, num_clients: int) -> None:
    if not isinstance(min_size, (int, np.integer)) or min_size < 0:
        raise ValueError(f"min_size must be a non-negative integer, got {min_size!r}")
    if min_size * num_clients > n:
        raise ValueError(
            f"min_size={min_size} is infeasible: {num_clients} clients x {min_size} > {n} samples; "
            f"allowed values are 0..{n // num_clients}"
        )


def _sorted(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _repair_min_size(parts: list[np.ndarray], min_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Give every client at least ``min_size`` samples by moving random samples out of the largest clients.

    Clients below ``min_size`` are served in increasing order of size; each takes what it lacks from the
    currently largest client (a max-heap on size), never pushing a donor below ``min_size``. This is
    O(m log m) heap operations plus the moved samples, so it terminates quickly even for thousands of
    clients (unlike the retry-until-ok loop of common FL benchmark code).
    """
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    sizes = np.array([p.size for p in parts])
    needy = [int(i) for i in np.argsort(sizes, kind="stable") if sizes[i] < min_size]
    if not needy:
        return parts
    needy_set = set(needy)
    heap = [(-int(sizes[i]), int(i)) for i in range(len(parts)) if i not in needy_set]
    heapq.heapify(heap)
    for r in needy:
        deficit = min_size - parts[r].size
        taken = [parts[r]]
        while deficit > 0:
            neg, d = heapq.heappop(heap)
            surplus = -neg - min_size
            if surplus <= 0:  # cannot happen when min_size * m <= n, kept as a guard
                raise ValueError("min_size repair failed: not enough samples")
            k = min(deficit, surplus)
            pick = rng.choice(parts[d].size, size=k, replace=False)
            mask = np.ones(parts[d].size, dtype=bool)
            mask[pick] = False
            taken.append(parts[d][pick])
            parts[d] = parts[d][mask]
            deficit -= k
            heapq.heappush(heap, (-int(parts[d].size), d))
        parts[r] = np.concatenate(taken)
        # the repaired client may now donate too (only what exceeds min_size, i.e. nothing)
    return parts


def _allocate(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total``, proportional to ``weights`` (largest remainders)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    raw = w * total
    base = np.floor(raw).astype(np.int64)
    rest = total - int(base.sum())
    if rest > 0:
        order = np.argsort(-(raw - base), kind="stable")[:rest]
        base[order] += 1
    return base


# ----------------------------------------------------------------------------- partitioners
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """IID split: a random permutation cut into ``num_clients`` near-equal parts (FedAvg's IID setting)."""
    labels = _check_common(labels, num_clients)
    perm = rng.permutation(labels.shape[0])
    return _sorted(np.array_split(perm, num_clients))


def dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, alpha: float = 0.5, min_size: int = 0
) -> list[np.ndarray]:
    """Label skew by a Dirichlet over clients per class (Hsu et al. 2019; FPFC's MNIST protocol).

    For each class ``c`` draw ``p_c ~ Dir(alpha * 1_m)`` and cut the shuffled indices of class ``c`` at
    the cumulative fractions of ``p_c`` (the FPFC code's ``np.random.dirichlet([alpha]*m, C)`` split).
    Then, instead of redrawing until every client is large enough, clients with fewer than
    ``min_size`` samples take randomly chosen samples from the currently largest clients (see
    ``_repair_min_size``), so the call always terminates in one pass.
    """
    labels = _check_common(labels, num_clients)
    if not (isinstance(alpha, (int, float)) and alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    _check_min_size(min_size, labels.shape[0], num_clients)
    classes = np.unique(labels)
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = (np.cumsum(p)[:-1] * idx.size).astype(np.int64)
        for i, chunk in enumerate(np.split(idx, cuts)):
            if chunk.size:
                buckets[i].append(chunk)
    parts = [np.concatenate(b) if b else np.zeros(0, np.int64) for b in buckets]
    if min_size > 0:
        parts = _repair_min_size(parts, min_size, rng)
    return _sorted(parts)


def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, classes_per_client: int = 2
) -> list[np.ndarray]:
    """Pathological label skew: each client holds ``classes_per_client`` distinct classes (McMahan et al. 2017).

    Classes are permuted at random and client ``i`` gets classes ``perm[(i*k + j) mod C]``,
    ``j < k``, so every class has the same number of holders (up to one). Each class's samples are
    split evenly among its holders. If ``num_clients * k < C`` the classes no client holds are left
    out (the only case where not every sample is assigned).
    """
    labels = _check_common(labels, num_clients)
    classes = np.unique(labels)
    C = classes.size
    if not isinstance(classes_per_client, (int, np.integer)) or not 1 <= classes_per_client <= C:
        raise ValueError(
            f"classes_per_client must be an integer in 1..{C} (number of classes), got {classes_per_client!r}"
        )
    k = int(classes_per_client)
    perm = rng.permutation(C)
    holders: list[list[int]] = [[] for _ in range(C)]
    for i in range(num_clients):
        for j in range(k):
            holders[perm[(i * k + j) % C]].append(i)
    buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for ci, c in enumerate(classes):
        if not holders[ci]:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for h, chunk in zip(holders[ci], np.array_split(idx, len(holders[ci]))):
            buckets[h].append(chunk)
    return _sorted([np.concatenate(b) if b else np.zeros(0, np.int64) for b in buckets])


def lognormal(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, sigma: float = 1.0, min_size: int = 1
) -> list[np.ndarray]:
    """Quantity skew: client sizes proportional to LogNormal(0, sigma) draws, labels IID (Li et al. 2022).

    Each client first gets ``min_size`` samples; the rest are allocated proportionally to the draws
    (largest remainders), then a random permutation is cut at those sizes.
    """
    labels = _check_common(labels, num_clients)
    if not (isinstance(sigma, (int, float)) and sigma >= 0 and np.isfinite(sigma)):
        raise ValueError(f"sigma must be a non-negative finite number, got {sigma!r}")
    n = labels.shape[0]
    _check_min_size(min_size, n, num_clients)
    w = rng.lognormal(0.0, float(sigma), size=num_clients)
    sizes = min_size + _allocate(n - min_size * num_clients, w)
    perm = rng.permutation(n)
    return _sorted(np.split(perm, np.cumsum(sizes)[:-1]))


def natural(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, groups: np.ndarray | Sequence[int]
) -> list[np.ndarray]:
    """Natural partition: one client per group id (e.g. HAPT users), clients ordered by sorted group id.

    ``num_clients`` must equal the number of distinct groups; ``rng`` is unused.
    """
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    if groups.shape != (labels.shape[0],):
        raise ValueError(f"groups must have one id per sample ({labels.shape[0]}), got shape {groups.shape}")
    ids, inv = np.unique(groups, return_inverse=True)
    if num_clients != ids.size:
        raise ValueError(
            f"num_clients must equal the number of groups for partition 'natural': "
            f"allowed value {ids.size}, got {num_clients}"
        )
    order = np.argsort(inv, kind="stable")
    return _sorted(np.split(order, np.cumsum(np.bincount(inv, minlength=ids.size))[:-1]))


PARTITIONERS: dict[str, tuple[Partitioner, str]] = {
    "iid": (iid, "uniformly random, near-equal sizes"),
    "dirichlet": (
        dirichlet,
        "label skew: per-class Dir(alpha) over clients; min_size by moving samples from the largest",
    ),
    "shards": (shards, "pathological label skew: classes_per_client distinct classes per client"),
    "lognormal": (lognormal, "quantity skew: sizes ~ LogNormal(0, sigma), at least min_size"),
    "natural": (natural, "one client per natural group id (e.g. user); needs groups="),
}


def get_partitioner(name: str) -> Partitioner:
    """Look up a partitioner by name; unknown names raise ValueError listing the allowed ones."""
    try:
        return PARTITIONERS[name][0]
    except KeyError:
        raise ValueError(f"partition must be one of {sorted(PARTITIONERS)}, got {name!r}") from None


def partition(name: str, labels: np.ndarray, num_clients: int, rng: np.random.Generator, **params) -> list[np.ndarray]:
    """Run partitioner ``name``; unknown keyword parameters raise ValueError naming the allowed ones."""
    import inspect

    fn = get_partitioner(name)
    sig = inspect.signature(fn).parameters
    allowed = [p for p in sig if p not in ("labels", "num_clients", "rng") and sig[p].kind is not sig[p].VAR_KEYWORD]
    bad = sorted(set(params) - set(allowed))
    if bad and not any(p.kind is p.VAR_KEYWORD for p in sig.values()):  # **params: the partitioner checks them
        raise ValueError(f"unknown parameter(s) {bad} for partition {name!r}; allowed: {allowed}")
    return fn(labels, num_clients, rng, **params)


# ----------------------------------------------------------------------------- clustered transforms
def cluster_blocks(num_clients: int, num_clusters: int) -> np.ndarray:
    """True cluster ids in contiguous blocks: client ``i`` is in cluster ``i * L // m`` (= ``i // (m/L)``)."""
    if not isinstance(num_clusters, (int, np.integer)) or not 1 <= num_clusters <= num_clients:
        raise ValueError(f"num_clusters must be an integer in 1..{num_clients} (num_clients), got {num_clusters!r}")
    return (np.arange(num_clients) * int(num_clusters)) // int(num_clients)


def label_swap(
    client_labels: Sequence[np.ndarray],
    num_clusters: int = 4,
    *,
    pairs: Sequence[tuple[int, int]] | None = None,
    swap_sum: int = 8,
    clusters: np.ndarray | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """FPFC's label-swap clusters (Sattler et al. CFL protocol; FPFC Sec. 6.3).

    Client ``i`` belongs to cluster ``p = i // (m/L)`` and, in cluster ``p``, labels ``p`` and
    ``swap_sum - p`` are exchanged (default ``swap_sum = 8``: 0<->8, 1<->7, 2<->6, 3<->5 for 4
    clusters). ``pairs[p]`` overrides the pair of cluster ``p``; pass ``clusters`` to use other ids.
    Apply the same call to the train and the test labels. Returns ``(new_labels, clusters)``.
    """
    m = len(client_labels)
    cl = cluster_blocks(m, num_clusters) if clusters is None else np.asarray(clusters, dtype=np.int64)
    if cl.shape != (m,):
        raise ValueError(f"clusters must have one id per client ({m}), got shape {cl.shape}")
    L = int(cl.max()) + 1 if m else 0
    if pairs is None:
        pairs = [(p, swap_sum - p) for p in range(L)]
    if len(pairs) < L:
        raise ValueError(f"pairs must give one (a, b) pair per cluster ({L}), got {len(pairs)}")
    same = [p for p in range(L) if pairs[p][0] == pairs[p][1]]
    if same:
        raise ValueError(
            f"label_swap: cluster(s) {same} would swap a label with itself (pairs {list(pairs[:L])}); "
            f"use num_clusters <= swap_sum // 2 ({swap_sum // 2}) or give distinct pairs"
        )
    out = []
    for i, y in enumerate(client_labels):
        a, b = pairs[int(cl[i])]
        y = np.asarray(y)
        z = y.copy()
        z[y == a] = b
        z[y == b] = a
        out.append(z)
    return out, cl


def rotate_images(x: np.ndarray, angle: float) -> np.ndarray:
    """Rotate a batch of images ``[..., H, W]`` counter-clockwise by ``angle`` degrees.

    Multiples of 90 degrees are exact (``np.rot90``); other angles use nearest-neighbour sampling
    about the image centre, filling uncovered pixels with 0.
    """
    x = np.asarray(x)
    a = float(angle) % 360.0
    if a % 90 == 0:
        return np.ascontiguousarray(np.rot90(x, k=int(a // 90), axes=(-2, -1)))
    H, W = x.shape[-2:]
    t = np.deg2rad(a)
    cy, cx = (H - 1) / 2.0, (W - 1) / 2.0
    yy, xx = np.meshgrid(np.arange(H) - cy, np.arange(W) - cx, indexing="ij")
    # inverse map: output pixel (y, x) samples the input at R(-t) (y, x); image rows grow downwards
    sx = np.cos(t) * xx - np.sin(t) * yy
    sy = np.sin(t) * xx + np.cos(t) * yy
    iy = np.rint(sy + cy).astype(np.int64)
    ix = np.rint(sx + cx).astype(np.int64)
    ok = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    out = np.zeros_like(x)
    out[..., ok] = x[..., iy[ok], ix[ok]]
    return out


def rotation(
    client_images: Sequence[np.ndarray],
    num_clusters: int = 4,
    *,
    angles: Sequence[float] | None = None,
    clusters: np.ndarray | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Rotated-image clusters (Ghosh et al. IFCA protocol): cluster ``c`` rotates its images by ``angles[c]``.

    Default ``angles[c] = 90 * c`` degrees; clusters are contiguous blocks ``i // (m/L)`` unless
    ``clusters`` is given. Images are ``[n, ..., H, W]``. Returns ``(new_images, clusters)``.
    """
    m = len(client_images)
    cl = cluster_blocks(m, num_clusters) if clusters is None else np.asarray(clusters, dtype=np.int64)
    if cl.shape != (m,):
        raise ValueError(f"clusters must have one id per client ({m}), got shape {cl.shape}")
    L = int(cl.max()) + 1 if m else 0
    if angles is None:
        angles = [90.0 * c for c in range(L)]
    if len(angles) < L:
        raise ValueError(f"angles must give one angle per cluster ({L}), got {len(angles)}")
    return [rotate_images(x, angles[int(cl[i])]) for i, x in enumerate(client_images)], cl


CLUSTER_TRANSFORMS: dict[str, tuple[Callable, str]] = {
    "label_swap": (label_swap, "cluster p swaps labels p <-> swap_sum-p (FPFC / CFL protocol)"),
    "rotation": (rotation, "cluster c rotates images by angles[c] (default 90*c degrees)"),
}
