"""Partitioners and clustered transforms: coverage, minimum sizes, determinism, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fedsolve.data.partition import (PARTITIONERS, cluster_blocks, dirichlet, get_partitioner, iid, label_swap,
                                     lognormal, natural, partition, rotate_images, rotation, shards)


def _labels(n=2000, c=10, seed=0):
    return np.random.default_rng(seed).integers(0, c, n)


def _assert_exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.size == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


CASES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.1, "min_size": 5}),
    ("dirichlet", {"alpha": 1.0}),
    ("shards", {"classes_per_client": 2}),
    ("lognormal", {"sigma": 1.5, "min_size": 3}),
]


@pytest.mark.parametrize("name,params", CASES)
def test_every_sample_exactly_once_and_deterministic(name, params):
    y = _labels()
    p1 = partition(name, y, 37, np.random.default_rng(5), **params)
    p2 = partition(name, y, 37, np.random.default_rng(5), **params)
    assert len(p1) == 37
    _assert_exact_cover(p1, y.size)
    assert all(np.array_equal(a, b) for a, b in zip(p1, p2))
    assert all(p.dtype == np.int64 for p in p1)
    if "min_size" in params:
        assert min(p.size for p in p1) >= params["min_size"]


def test_registry_descriptions():
    for name, (fn, desc) in PARTITIONERS.items():
        assert callable(fn) and isinstance(desc, str) and desc
        assert get_partitioner(name) is fn


def test_dirichlet_1000_clients_70k_fast_with_min_size():
    y = _labels(70_000, 10, 1)
    for alpha in (0.05, 0.5):
        t = time.perf_counter()
        parts = dirichlet(y, 1000, np.random.default_rng(0), alpha=alpha, min_size=20)
        assert time.perf_counter() - t < 10.0
        _assert_exact_cover(parts, y.size)
        assert min(p.size for p in parts) >= 20


def test_dirichlet_small_alpha_is_label_skewed():
    y = _labels(5000)
    parts = dirichlet(y, 20, np.random.default_rng(0), alpha=0.05)
    # with alpha this small most clients are dominated by one or two classes
    dom = [np.bincount(y[p], minlength=10).max() / max(p.size, 1) for p in parts if p.size]
    assert np.median(dom) > 0.5
    iid_dom = [np.bincount(y[p], minlength=10).max() / p.size for p in iid(y, 20, np.random.default_rng(0))]
    assert np.median(iid_dom) < 0.25


def test_shards_classes_per_client():
    y = _labels()
    parts = shards(y, 30, np.random.default_rng(0), classes_per_client=3)
    assert all(np.unique(y[p]).size == 3 for p in parts)
    # fewer clients x classes than classes: some classes are left out (documented)
    parts = shards(y, 2, np.random.default_rng(0), classes_per_client=2)
    assert sum(p.size for p in parts) < y.size and all(np.unique(y[p]).size == 2 for p in parts)


def test_lognormal_quantity_skew():
    y = _labels(10_000)
    sizes = np.array([p.size for p in lognormal(y, 50, np.random.default_rng(0), sigma=2.0, min_size=10)])
    assert sizes.min() >= 10 and sizes.max() > 5 * np.median(sizes)


def test_natural_groups():
    y = _labels(100)
    g = np.repeat([7, 3, 9, 1], 25)
    parts = natural(y, 4, np.random.default_rng(0), groups=g)
    _assert_exact_cover(parts, 100)
    assert [np.unique(g[p]).tolist() for p in parts] == [[1], [3], [7], [9]]
    with pytest.raises(ValueError, match="num_clients"):
        natural(y, 5, np.random.default_rng(0), groups=g)


@pytest.mark.parametrize("name,params,match", [
    ("dirichlet", {"alpha": -1.0}, "alpha"),
    ("dirichlet", {"alpha": 1.0, "min_size": 1000}, "min_size"),
    ("shards", {"classes_per_client": 11}, "classes_per_client"),
    ("lognormal", {"sigma": -1.0}, "sigma"),
    ("iid", {"alpha": 1.0}, "allowed"),
    ("nope", {}, "partition must be one of"),
])
def test_bad_parameters(name, params, match):
    with pytest.raises(ValueError, match=match):
        partition(name, _labels(), 10, np.random.default_rng(0), **params)


def test_cluster_blocks_contiguous():
    assert cluster_blocks(20, 4).tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    assert np.bincount(cluster_blocks(10, 3)).tolist() == [4, 3, 3]


def test_label_swap_fpfc_pairs():
    ys = [np.arange(10) for _ in range(20)]
    out, cl = label_swap(ys, 4)
    assert cl.tolist() == cluster_blocks(20, 4).tolist()
    for i, z in enumerate(out):
        p = cl[i]
        expect = np.arange(10)
        expect[p], expect[8 - p] = 8 - p, p
        assert z.tolist() == expect.tolist()
        assert not np.array_equal(z, ys[i])
    assert ys[0].tolist() == list(range(10))  # input untouched


def test_rotation_records_clusters_and_rotates():
    rng = np.random.default_rng(0)
    xs = [rng.random((3, 1, 5, 5)) for _ in range(8)]
    out, cl = rotation(xs, 4)
    assert cl.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert np.array_equal(out[0], xs[0])
    for i in range(2, 8):
        assert not np.allclose(out[i], xs[i])
        assert np.allclose(out[i], np.rot90(xs[i], k=int(cl[i]), axes=(-2, -1)))
    # arbitrary angle: 45 degrees changes the image, 360 is the identity
    assert not np.allclose(rotate_images(xs[0], 45), xs[0])
    assert np.allclose(rotate_images(xs[0], 360), xs[0])


def test_label_swap_rejects_identity_pairs():
    with pytest.raises(ValueError, match="num_clusters"):
        label_swap([np.arange(10)] * 5, 5)
