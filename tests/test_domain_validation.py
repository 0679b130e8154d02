"""Tuning on domain data (issue 47): the labelled target validation images of :class:`DomainData`, disjoint from
training and test, are what a config's ``tune:`` scores on; the held-out training rows of other data cannot score
target accuracy (the target rows are unlabelled). Tiny synthetic data only (two moons, fake MNIST digits)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fedsolve.data.domains as domains
from fedsolve.data.domain_data import DomainData
from fedsolve.data.domains import mnist_mnistm, toy_domains

torch.set_num_threads(1)


def test_validation_split_trains_on_the_rest_and_scores_the_labelled_target_images():
    d = toy_domains(n=40, n_test=10, n_val=30, seed=3)
    assert isinstance(d, DomainData) and d.validation_x.shape == (30, 2)
    v = d.split_validation(0.25, seed=1)
    assert v.train_sizes.tolist() == [30, 30]                       # 40 rows a client, a quarter held out
    assert v.group_names == ("source", "target") and v.train_groups.numel() == 60
    assert bool(((v.train_groups == 1) == (v.train_y < 0)).all())  # target rows stay unlabelled
    assert v.test_sizes.tolist() == [15, 15] and set(v.test_y.tolist()) <= {0, 1}
    # the scored rows are exactly the validation images with their labels, none of them a training or test row
    got = sorted(map(tuple, torch.cat([v.test_x, v.test_y[:, None].float()], 1).tolist()))
    want = sorted(map(tuple, torch.cat([d.validation_x, d.validation_y[:, None].float()], 1).tolist()))
    assert got == want
    rows = {tuple(r) for r in torch.cat([d.train_x, d.test_x]).tolist()}
    assert not rows & {tuple(r) for r in d.validation_x.tolist()}
    assert isinstance(d.with_dtype(torch.float64), DomainData)
    assert d.with_dtype(torch.float64).validation_x.dtype == torch.float64


def test_no_validation_images_is_refused_naming_the_fix():
    d = toy_domains(n=20, n_test=10)
    assert d.validation_x is None
    with pytest.raises(ValueError, match="tune: .*no labelled target validation images.*val_limit"):
        d.split_validation(0.2, 0)
    with pytest.raises(ValueError, match="n_val"):
        toy_domains(n=20, n_test=10, n_val=-1)


def test_a_tuned_comparison_on_domain_data_scores_on_validation(tmp_path):
    """Before DomainData, tuning on domain data scored the unlabelled target rows (labels -1) and failed."""
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.compare import compare

    raw = {"name": "toy_tune", "seeds": [0],
           "data": {"dataset": "toy_domains", "num_clients": 2, "params": {"n": 60, "n_test": 20, "n_val": 40}},
           "problem": {"kind": "domain_adaptation",
                       "params": {"loss": "dann", "features": "mlp", "feature_dim": 8, "hidden": [8],
                                  "domain_hidden": 8}},
           "simulation": {"rounds": 3, "eval_every": 1},
           "defaults": {"lr": 0.05, "lr_psi": 0.05, "batch_size": 16, "local_steps": 3},
           "algorithms": [{"name": "fedavggda", "label": "GDA",
                           "tune": {"param": "lr", "grid": [0.01, 0.1, 0.5], "rounds": 2}}]}
    compare(parse_config(raw), tmp_path / "out", progress=False)
    tuned = json.loads((tmp_path / "out" / "GDA" / "seed0" / "summary.json").read_text())["extras"]["tuned"]
    assert tuned["grid"] == [0.01, 0.1, 0.5] and tuned["value"] in tuned["grid"]
    assert all(s is not None and 0.0 <= s <= 1.0 for s in tuned["scores"])
    # each score is a tuning run's final accuracy on the validation images (20 per client)
    run = tmp_path / "out" / "GDA" / "seed0" / "tune" / "lr_0.1"
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["test_accuracy"] == pytest.approx(tuned["scores"][1])
    assert {round(20 * a, 6) % 1 for a in tuned["scores"]} == {0.0}


BITS = 2 ** np.arange(36)


@pytest.fixture
def fake_mnist(monkeypatch):
    """``_mnist`` gives distinct binary digits (digit k shows k + 1 in binary over its 36 pixels; label k mod 10)
    and the photos are black, so an MNIST-M-like image is its digit itself: which digits became which rows, with
    which labels, can be read off."""
    calls = []

    def fake(limit, test_limit, seed):
        calls.append(limit)
        n = 60 if limit is None else limit
        k = np.arange(n + 8)
        x = ((k[:, None] + 1) // BITS % 2).astype(np.float32).reshape(-1, 6, 6)
        return x[:n], k[:n] % 10, x[n:], k[n:] % 10

    monkeypatch.setattr(domains, "_mnist", fake)
    monkeypatch.setattr(domains, "skimage_photos", lambda: [np.zeros((10, 10, 3), np.uint8)])
    return calls


def _ids(x: torch.Tensor) -> list[int]:
    """The k of each fake digit image (its first channel read as bits)."""
    return [int(v) - 1 for v in (x[:, 0].flatten(1).round().numpy() @ BITS)]


def test_mnistm_validation_images_are_other_mnist_images(fake_mnist):
    d = mnist_mnistm(num_clients=1, limit=40, test_limit=8, size=6, val_limit=12, seed=0)
    assert fake_mnist == [52]                       # the validation images are drawn with the training ones
    assert d.validation_x.shape == (12, 3, 6, 6) and int(d.train_sizes.sum()) == 80
    val, train = _ids(d.validation_x), _ids(d.train_x)
    assert sorted(set(val) | set(train)) == list(range(52)) and not set(val) & set(train)  # never trained on
    assert d.validation_y.tolist() == [k % 10 for k in val]                            # labels kept
    full = mnist_mnistm(num_clients=1, limit=None, test_limit=8, size=6, val_limit=10)   # out of all 60
    assert fake_mnist[-1] is None and int(full.train_sizes.sum()) == 100
    plain = mnist_mnistm(num_clients=1, limit=40, test_limit=8, size=6)
    assert fake_mnist[-1] == 40 and plain.validation_x is None   # no val_limit: the data of earlier versions
    with pytest.raises(ValueError, match="val_limit"):
        mnist_mnistm(num_clients=1, limit=40, test_limit=8, size=6, val_limit=0)
    with pytest.raises(ValueError, match="val_limit"):
        mnist_mnistm(num_clients=1, limit=None, test_limit=8, size=6, val_limit=60)


def test_twin_runs_score_the_source_or_the_validation_images(fake_mnist, monkeypatch):
    """``test_on``: the same training rows, the test split scoring the source test images (a twin run's source
    accuracy) or the validation images (problem settings chosen without the test images)."""
    monkeypatch.setattr(domains, "skimage_photos", lambda: [np.full((10, 10, 3), 255, np.uint8)])  # blend = 1 - digit
    kw = dict(num_clients=2, limit=40, test_limit=8, size=6, val_limit=12, seed=1)
    d, s, v = (mnist_mnistm(**kw, test_on=t) for t in ("target", "source", "validation"))
    for other in (s, v):
        assert torch.equal(other.train_x, d.train_x) and torch.equal(other.train_y, d.train_y)
        assert torch.equal(other.train_groups, d.train_groups) and torch.equal(other.validation_x, d.validation_x)
    assert torch.equal(s.test_y, d.test_y) and torch.equal(s.test_x, 1 - d.test_x)   # the digits, not their blends
    assert sorted(_ids(s.test_x)) == list(range(52, 60))     # the 8 test digits (drawn after the 52 others)
    assert s.test_y.tolist() == [k % 10 for k in _ids(s.test_x)]
    assert sorted(_ids(1 - v.test_x)) == sorted(_ids(1 - d.validation_x)) and v.test_y.numel() == 12
    assert (d.meta["test"], s.meta["test"]) == ("target domain", "source domain (twin run: the source accuracy)")
    with pytest.raises(ValueError, match="test_on: unknown 'both'"):
        mnist_mnistm(**kw, test_on="both")
    with pytest.raises(ValueError, match="test_on: 'validation' needs .*val_limit"):
        mnist_mnistm(num_clients=2, limit=40, test_limit=8, size=6, test_on="validation")
