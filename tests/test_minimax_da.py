"""Adversarial domain adaptation (FedMM spec 1.1, 3.1, 5): the DANN/CDAN/MDD objectives, domain data and client
splits, the problem kind, executors and the Flower adapter. Tiny synthetic data only (two moons)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedsolve.families import get_algorithm
from fedsolve.data.datasets import build_federated
from fedsolve.data.domains import domain_split, mnistm_blend, toy_domains
from fedsolve.families.minimax.problem import adversarial_problem
from fedsolve.families.minimax.saddle import minimax_of
from tests.test_minimax import run_rounds

torch.set_num_threads(1)
NET = dict(features="mlp", feature_dim=8, hidden=[8], domain_hidden=8)


@pytest.fixture(scope="module")
def moons():
    return toy_domains(n=60, n_test=40, seed=0)


def _params(problem, seed=0):
    return problem.init_params(torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("loss", ["dann", "cdan", "mdd"])
def test_objective_is_the_per_sample_form(moons, loss):
    """f = mean[ CE on source rows - nu * L_dom ]; DANN/CDAN L_dom = domain CE (source 0, target 1); MDD as spec 1.1."""
    nu = 0.7
    pr = adversarial_problem(moons, loss, nu, **NET)
    w = _params(pr)
    x, y = moons.train_x, moons.train_y
    n = y.numel()
    got = minimax_of(pr).loss(w, x, y, torch.full((n,), 1.0 / n))
    logits, d = functional_call(pr.model, pr.layout.unflatten(w), (x,), {"adversarial": True})
    src = y >= 0
    ce = torch.where(src, F.cross_entropy(logits, y.clamp_min(0), reduction="none"), 0.0)
    if loss == "mdd":
        yh = logits.argmax(-1)
        q = torch.softmax(d, -1)[torch.arange(n), yh]
        dom = torch.where(src, -torch.log(q), -torch.log(1.00001 - q))
    else:
        h = torch.softmax(d, -1)[:, 1]                       # P(domain = target)
        dom = torch.where(src, -torch.log(1 - h), -torch.log(h))
    torch.testing.assert_close(got, (ce - nu * dom).mean(), rtol=1e-5, atol=1e-6)
    assert bool(src.any()) and bool((~src).any())


def test_cdan_conditions_on_the_undetached_prediction(moons):
    """On target-only rows there is no label term: the classifier gets a gradient through CDAN's outer product
    (softmax not detached), none under DANN or MDD (MDD's pseudo-label is an argmax)."""
    tgt = moons.train_y < 0
    x, y = moons.train_x[tgt], moons.train_y[tgt]
    w8 = torch.full((y.numel(),), 1.0 / y.numel())
    for loss, expect in (("cdan", True), ("dann", False), ("mdd", False)):
        pr = adversarial_problem(moons, loss, 1.0, **NET)
        g = torch.func.grad(lambda p: minimax_of(pr).loss(p, x, y, w8))(_params(pr))
        cls = torch.zeros_like(g, dtype=torch.bool)
        for name in pr.layout.names:
            if name.startswith("classifier"):
                e = next(e for e in pr.layout.entries if e.name == name)
                cls[e.start:e.start + e.numel] = True
        assert bool(g[cls].abs().max() > 0) == expect, loss
        assert g[pr.layout.mask("psi")].abs().max() > 0


def test_cdan_discriminator_sees_the_outer_product(moons):
    pr = adversarial_problem(moons, "cdan", **NET)
    assert pr.model.domain[0].in_features == 2 * 8          # K x D
    mdd = adversarial_problem(moons, "mdd", **NET)
    assert mdd.model.domain[-1].out_features == 2            # K-way auxiliary head (K = 2 here)


def test_one_gda_step_descends_omega_and_ascends_psi(moons):
    """FedSGDA with one client: omega moves along -grad f, psi along +grad f (spec 5.1)."""
    data = toy_domains(num_clients=1, n=40, n_test=10)
    pr = adversarial_problem(data, "dann", **NET)
    algo = get_algorithm("fedsgda")(dict(lr=0.01, lr_psi=0.02, batch_size=None), pr)
    w0 = _params(pr, 3)
    server, _, _ = run_rounds(algo, 1, "sequential", x0=w0)
    n = data.train_y.numel()
    g = torch.func.grad(lambda p: minimax_of(pr).loss(p, data.train_x, data.train_y, torch.full((n,), 1.0 / n)))(w0)
    om = pr.layout.mask("omega")
    expect = torch.where(om, w0 - 0.01 * g, w0 + 0.02 * g)
    torch.testing.assert_close(server["w"], expect, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ domain data and splits
def test_p_split_and_worst_case(moons):
    g = moons.train_groups
    c0 = g[: int(moons.train_offsets[1])]
    c1 = g[int(moons.train_offsets[1]):]
    assert bool((c0 == 0).all()) and bool((c1 == 1).all())   # p = 1: source-only client 0, target-only client 1
    assert bool((moons.train_y[g == 1] == -1).all()) and bool((moons.train_y[g == 0] >= 0).all())
    half = toy_domains(p=0.7, n=100, n_test=20)
    g0 = half.client_train_groups(0)
    assert int((g0 == 0).sum()) == 70 and int((g0 == 1).sum()) == 30
    assert half.group_names == ("source", "target")


def test_source_clients_and_class_skew():
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(size=(200, 3)), np.repeat(np.arange(10), 20)
    xt, yt = rng.normal(size=(200, 3)), np.repeat(np.arange(10), 20)
    data = domain_split((xs, ys), (xt, yt), (xt[:50], yt[:50]), 10, num_clients=10, source_clients=5,
                        classes_per_client=2, seed=1)
    for i in range(10):
        g = data.client_train_groups(i)
        assert bool((g == (0 if i < 5 else 1)).all())
    for i in range(5):
        _, y = data.client_train(i)
        assert set(y.tolist()) == {(2 * i) % 10, (2 * i + 1) % 10}
    assert int(data.train_sizes.sum()) == 400 and int(data.test_sizes.sum()) == 50
    with pytest.raises(ValueError, match="source_clients must be in"):
        domain_split((xs, ys), (xt, yt), (xt, yt), 10, num_clients=3, source_clients=3)
    with pytest.raises(ValueError, match="give source_clients"):
        domain_split((xs, ys), (xt, yt), (xt, yt), 10, num_clients=3)


def test_mnistm_blend_recipe():
    rng = np.random.default_rng(0)
    digits = rng.random((5, 6, 6)) * (rng.random((5, 6, 6)) > 0.5)
    photos = [rng.integers(0, 256, size=(20, 30, 3), dtype=np.uint8), np.zeros((6, 6, 3), np.uint8)]
    out = mnistm_blend(digits, photos, np.random.default_rng(1))
    assert out.shape == (5, 3, 6, 6) and out.min() >= 0 and out.max() <= 1
    binary = (digits > 0).astype(np.float32)
    for i in range(5):   # |crop - digit| per channel: flipping back recovers a crop that is constant over digits
        crop = np.where(binary[i][None] > 0, 1 - out[i], out[i])
        assert np.all(np.abs(crop * 255 - np.round(crop * 255)) < 1e-3)


def test_registered_datasets_and_problem_kind():
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.runner import build_problem

    raw = {"name": "da", "data": {"dataset": "toy_domains", "num_clients": 2, "params": {"n": 40, "n_test": 10}},
           "problem": {"kind": "domain_adaptation", "params": {"loss": "cdan", "features": "mlp", "feature_dim": 4}},
           "algorithm": {"name": "fedmm"}}
    pr = build_problem(parse_config(raw), seed=0)
    assert minimax_of(pr).name == "cdan" and pr.layout.block_size("psi") > 0
    with pytest.raises(ValueError, match="loss"):
        build_problem(parse_config({**raw, "problem": {"kind": "domain_adaptation", "params": {"loss": "gan"}}}), 0)
    plain = {**raw, "data": {"dataset": "digits", "num_clients": 2}}
    with pytest.raises(ValueError, match="domain data"):
        build_problem(parse_config(plain), 0)
    with pytest.raises(ValueError, match="minimax problem"):
        get_algorithm("fedmm")(None, build_problem(parse_config({**plain, "problem": None}), 0))
    assert build_federated("toy_domains", 4, dataset_params={"source_clients": 1, "n": 30}).num_clients == 4


@pytest.mark.parametrize("name", ["fedmm", "fedavggda", "fedproxgda", "fedsgda"])
def test_sequential_and_vectorized_agree_on_dann(name):
    data = toy_domains(num_clients=3, source_clients=1, n=40, n_test=10)
    pr = adversarial_problem(data, "dann", **NET)
    params = {"batch_size": 8} | ({} if name == "fedsgda" else {"local_steps": 3})
    algo = get_algorithm(name)(params, pr)
    a, ca, _ = run_rounds(algo, 3, "sequential")
    b, cb, _ = run_rounds(algo, 3, "vectorized")
    torch.testing.assert_close(a["w"], b["w"], rtol=1e-5, atol=1e-6)
    for k in ca:
        torch.testing.assert_close(ca[k], cb[k], rtol=1e-5, atol=1e-6)


def test_fedmm_duals_stay_on_the_clients():
    data = toy_domains(n=40, n_test=10)
    pr = adversarial_problem(data, "dann", **NET)
    algo = get_algorithm("fedmm")({"batch_size": 8, "local_steps": 2}, pr)
    server, clients, up = run_rounds(algo, 2)
    assert set(server) == {"w"} and set(up) == {"w"} and set(clients) == {"dual"}
    assert clients["dual"].shape == (2, pr.layout.dim) and float(clients["dual"].abs().max()) > 0


# ------------------------------------------------------------------ Flower adapter
EXPERIMENT = """\
name: minimax_flower
seeds: [1]
data: {dataset: toy_domains, num_clients: 3, params: {source_clients: 1, n: 40, n_test: 12}}
problem: {kind: domain_adaptation, params: {loss: dann, features: mlp, feature_dim: 16, hidden: [16], domain_hidden: 16}}
simulation: {rounds: 3, eval_every: 2, executor: sequential}
algorithm: {name: fedmm, params: {batch_size: 8, lr: 0.05, lr_psi: 0.05}}
"""


@pytest.mark.flower
@pytest.mark.parametrize("name", ["fedmm", "fedavggda", "fedproxgda", "fedsgda"])
def test_minimax_same_numbers_on_flower(tmp_path, name):
    """The same global model and client duals bit for bit, the same metrics. Only ``test_loss`` may differ in the
    last float32 bit: the simulation scores all clients in one vmapped call, a node scores its own client alone,
    and for some layer widths the two matmuls round differently (an engine property, not the solver's)."""
    pytest.importorskip("flwr", reason="needs the flower extra")
    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record
    from fedsolve.flower.replay import simulate_with_participation
    from tests.test_flower_adapter import _run

    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    steps = 1 if name == "fedsgda" else 3
    rc = {"experiment": str(exp), "overrides": f"algorithm.name={name} algorithm.params.local_steps={steps}",
          "wait-for-nodes": 5.0, "round-timeout": 5.0, "eval-timeout": 5.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    assert torch.equal(run.server["w"], sim.server["w"])
    assert [r["round"] for r in hist] == [r["round"] for r in res.history]
    for d, s in zip(hist, res.history):
        keys = (set(d) & set(s)) - {"time_s", "eval_clients"}
        assert {"test_accuracy", "test_loss"} <= keys
        assert {k: d[k] for k in keys - {"test_loss"}} == {k: s[k] for k in keys - {"test_loss"}}
        assert d["test_loss"] == pytest.approx(s["test_loss"], rel=1e-6)
    for node, ctx in grid.ctx.items():   # FedMM's duals live on the nodes, equal to the simulation's rows
        rows = from_array_record(ctx.state[STATE]) if STATE in ctx.state else {}
        for k, v in rows.items():
            assert (v == sim.clients[k][node - 100]).all()
        assert (name == "fedmm") == ("dual" in rows)


def test_experiment_suites_validate():
    from pathlib import Path

    from fedsolve.experiments.config import load_config

    import yaml

    from fedsolve.experiments.suite import is_suite

    suites = sorted((Path(__file__).resolve().parents[1] / "experiments" / "minimax").glob("*.yaml"))
    suites = [p for p in suites if not is_suite(yaml.safe_load(p.read_text()))]   # grid suites: test_grid_suite.py
    assert len(suites) >= 4
    for path in suites:
        cfg = load_config(path)
        assert cfg.problem is not None and cfg.problem.kind == "domain_adaptation", path.name
        names = {a.name for a in cfg.algorithms}
        assert names <= {"fedmm", "fedavggda", "fedproxgda", "fedsgda"} and names, path.name


def test_pooled_single_client_holds_everything():
    data = toy_domains(num_clients=1, n=30, n_test=10)
    assert data.num_clients == 1 and int(data.train_sizes[0]) == 60
    assert set(data.client_train_groups(0).tolist()) == {0, 1}


@pytest.mark.realdata
def test_mnist_pairs_build_from_the_cache():
    from fedsolve.data.fetch import cache_dir, is_cached

    if not is_cached("mnist") or not (cache_dir() / "skimage_photos.npz").exists():
        pytest.skip("MNIST or the scikit-image photos are not in the cache")
    from fedsolve.data.domains import mnist_digits, mnist_mnistm

    d = mnist_mnistm(limit=200, test_limit=50, size=8)
    assert d.input_shape == (3, 8, 8) and int(d.train_sizes.sum()) == 400 and d.test_x.min() >= 0
    g = mnist_digits(limit=200, num_clients=4, source_clients=2)
    assert g.input_shape == (1, 8, 8) and g.num_clients == 4 and float(g.train_x.max()) <= 1.0


@pytest.mark.realdata
def test_three_domain_grid_builds_every_ordered_pair():
    """The Office-31-shaped grid (spec 6.3): six ordered pairs of mnist / mnistm / digits, all RGB at one size,
    labelled source rows, unlabelled target rows, the target's test set; a pair of one domain is refused."""
    from fedsolve.data.fetch import cache_dir, is_cached

    if not is_cached("mnist") or not (cache_dir() / "skimage_photos.npz").exists():
        pytest.skip("MNIST or the scikit-image photos are not in the cache")
    from itertools import permutations

    from fedsolve.data.domains import DIGIT_DOMAINS, digit_domains

    n_test = {"mnist": 50, "mnistm": 50, "digits": 539}   # digits: 30% of 1,797 held out (stratified)
    n_train = {"mnist": 100, "mnistm": 100, "digits": 1797 - 539}
    for s, t in permutations(DIGIT_DOMAINS, 2):
        d = digit_domains(s, t, limit=100, test_limit=50, size=8)
        src = d.train_y >= 0
        assert d.input_shape == (3, 8, 8) and d.num_clients == 2, (s, t)
        assert int(src.sum()) == n_train[s] and int((~src).sum()) == n_train[t], (s, t)
        assert int(d.test_y.numel()) == n_test[t] and float(d.train_x.max()) <= 1.0, (s, t)
        assert set(d.client_train_groups(0).tolist()) == {0} and set(d.client_train_groups(1).tolist()) == {1}
    a, b = digit_domains("mnist", "mnistm", limit=100, test_limit=50), digit_domains("mnistm", "mnist", limit=100,
                                                                                  test_limit=50)
    # the same MNIST images make both domains: the MNIST-M-like rows are the blends of the MNIST rows
    assert torch.equal(a.train_x[a.train_y < 0], b.train_x[b.train_y >= 0])
    with pytest.raises(ValueError, match="target"):
        digit_domains("digits", "digits")
    with pytest.raises(ValueError, match="domain"):
        digit_domains("mnist", "usps")



def test_authors_init_and_its_error():
    """init: authors_code -- every weight from N(0, 0.1^2) truncated at 2 std, every bias 0.1 (the authors' code);
    the default keeps PyTorch's initialization; an unknown value names the field and the allowed values."""
    from fedsolve.families.minimax.problem import DomainAdversarialNet
    from tests.test_minimax_pretrained import _regime_problem

    torch.manual_seed(0)
    net = DomainAdversarialNet((3, 28, 28), 10, "dann", "cnn", init="authors_code")
    for name, p in net.named_parameters():
        if name.endswith("bias"):
            assert torch.equal(p, torch.full_like(p, 0.1)), name
        else:
            p = p.detach()
            assert float(p.abs().max()) <= 0.2 and abs(float(p.std()) - 0.088) < 0.01, name  # N(0, .1) cut at 2 std
    torch.manual_seed(0)
    plain = DomainAdversarialNet((3, 28, 28), 10, "dann", "cnn")
    assert not torch.equal(plain.classifier[0].bias, torch.full_like(plain.classifier[0].bias, 0.1))
    pr = _regime_problem("scratch", init="authors_code")
    assert pr.extras["domain_adaptation"]["init"] == "authors_code"
    x0 = pr.init_params(torch.Generator().manual_seed(0))
    bias = pr.layout.unflatten(x0)["classifier.0.bias"]
    assert torch.equal(bias, torch.full_like(bias, 0.1))
    with pytest.raises(ValueError, match="init"):
        _regime_problem("scratch", init="tf")


def test_auto_calibrates_on_the_saddle_objective(moons, tmp_path, monkeypatch):
    """``executor: auto`` times the executors on the objective of the algorithm's stated update: on domain data the
    model's plain loss cannot run (target rows carry y = -1; under CUDA the failed index is a device-side assert
    that ends the process), so timing it gave every candidate inf. With the objective, both candidates run and the
    cache entry (keyed by it) holds finite times; a calibration where nothing runs is not cached."""
    import json
    import math

    import fedsolve.core.batched_mlp as bm
    from fedsolve.core.selection import make_executor

    monkeypatch.setenv("FEDSOLVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "1")
    pr = adversarial_problem(moons, "dann", 1.0, **NET)
    algo = get_algorithm("fedavggda")({"batch_size": 8, "local_steps": 2}, pr)
    cands = ["vectorized", "sequential"]
    plain = bm.measure(pr, cands, 8)                       # the model's loss: nothing runs on this data
    assert all(math.isinf(plain[c]) for c in cands)
    make_executor("auto", pr, algorithm=algo)
    cache = json.loads((tmp_path / "executor_calibration.json").read_text())
    (key, entry), = cache.items()
    assert "objective" in key and all(math.isfinite(entry["seconds"][c]) for c in cands)
    monkeypatch.setattr(bm, "measure", lambda *a, **k: {c: math.inf for c in cands})
    from fedsolve.core.statements import initial_statement

    assert bm.calibrated_choice(pr, cands, 16, loss=initial_statement(algo).objective) is None
    assert len(json.loads((tmp_path / "executor_calibration.json").read_text())) == 1
