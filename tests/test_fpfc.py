"""FPFC: prox branches, server layouts, executors, theory checks (Lemma 2, oracle), lam = 0 -> LOCAL."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.func import functional_call

import fedsolve.families.clustered.fpfc.pairs as pairs_module
from fedsolve.families.clustered.fpfc import FPFC, FPFCL1, paper_cost, prox, prox_scale, scad, smoothed_scad
from fedsolve.families.clustered.oracle import augmented_lagrangian, oracle_models
from fedsolve.core.linear import LinearGDExecutor
from fedsolve.data.synthetic import clustered_regression, fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.families.clustered.protocols.path import warmup_lambda_path
from fedsolve.families.clustered.protocols.newcomers import fpfc_newcomers
from fedsolve.engine import Simulation, SimulationConfig


# ---------------------------------------------------------------- helpers
def s1_small(seed=0, scale=0.03):
    data = fpfc_synthetic("S1", seed=seed, size_scale=scale)
    return FederatedProblem(data, build_model_fn("logreg", (60,), 10))


def regression(sizes=(5, 5), dim=3, n=60, seed=0, center_scale=3.0, noise=0.1):
    data = clustered_regression(seed=seed, cluster_sizes=sizes, dim=dim, samples_per_client=n, noise_std=noise,
                                center_scale=center_scale)
    return FederatedProblem(data, build_model_fn("logreg", (dim,), 1), loss="squared_error")


def run(prob, cfg, rounds=10, fraction=0.3, seed=1, executor="sequential", fast=False, eval_every=None):
    algo = FPFC(cfg, prob) if not isinstance(cfg, FPFC) else cfg
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=eval_every or rounds, executor=executor,
                                                  sampling={"fraction": fraction}, metrics=[]), seed=seed)
    if fast:
        sim.executor = LinearGDExecutor(prob, chunk=16)
    res = sim.run()
    return algo, sim, res


def brute_radial(r, pen, rho, grid=200001):
    """argmin_{t >= 0} pen(t) + rho/2 (r - t)^2 on a fine grid, then a local refinement."""
    t = torch.linspace(0, r, grid, dtype=torch.float64)
    obj = pen(t) + rho / 2 * (r - t) ** 2
    i = int(torch.argmin(obj))
    lo, hi = float(t[max(i - 1, 0)]), float(t[min(i + 1, grid - 1)])
    for _ in range(100):  # golden-section on the bracket
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        fa = pen(torch.tensor([a], dtype=torch.float64)) + rho / 2 * (r - a) ** 2
        fb = pen(torch.tensor([b], dtype=torch.float64)) + rho / 2 * (r - b) ** 2
        if fa <= fb:
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


# ---------------------------------------------------------------- prox
@pytest.mark.parametrize("rho", [1.0, 2.0])
def test_scad_prox_all_branches_match_brute_force(rho):
    lam, a, xi = 0.5, 3.7, 0.05
    pen = lambda t: smoothed_scad(t, lam, a, xi)  # noqa: E731
    b1, b2, b3 = xi + lam / rho, lam + lam / rho, a * lam
    rs = [0.3 * b1, 0.9 * b1, (b1 + b2) / 2, 0.99 * b2, (b2 + b3) / 2, 0.98 * b3, 1.2 * b3, 3 * b3]
    branch_hit = set()
    for r in rs:
        s = float(prox_scale(torch.tensor(r, dtype=torch.float64), lam, rho, a, xi))
        t_star = brute_radial(r, pen, rho)
        assert abs(s * r - t_star) < 2e-6 * max(1, r), (r, s * r, t_star)
        branch_hit.add(0 if r <= b1 else 1 if r <= b2 else 2 if r <= b3 else 3)
    assert branch_hit == {0, 1, 2, 3}


def test_prox_is_radial_and_matches_vector_problem():
    torch.manual_seed(0)
    lam, rho, a, xi = 0.4, 1.0, 3.7, 1e-3
    for r in [0.0005, 0.3, 0.6, 1.2, 5.0]:
        d = torch.randn(7, dtype=torch.float64)
        d = d / d.norm() * r
        th = prox(d, lam, rho, a, xi)
        # vector objective is not improved by random perturbations
        f = lambda t: float(smoothed_scad(t.norm(), lam, a, xi) + rho / 2 * (d - t).pow(2).sum())  # noqa: E731
        base = f(th)
        for _ in range(200):
            assert f(th + 1e-4 * torch.randn(7, dtype=torch.float64)) >= base - 1e-12


def test_l1_prox_is_group_soft_threshold():
    lam, rho = 0.3, 1.5
    pen = lambda t: lam * t.abs()  # noqa: E731
    for r in [0.05, 0.19, 0.21, 0.5, 3.0]:
        s = float(prox_scale(torch.tensor(r, dtype=torch.float64), lam, rho, penalty="l1"))
        assert abs(s * r - brute_radial(r, pen, rho)) < 2e-6
        assert s == pytest.approx(max(0.0, 1 - lam / (rho * r)))


def test_l2sq_prox_is_linear_shrinkage_and_never_fuses():
    lam, rho = 0.7, 1.3
    pen = lambda t: lam * t * t  # noqa: E731
    for r in [0.01, 0.4, 2.0, 9.0]:
        s = float(prox_scale(torch.tensor(r, dtype=torch.float64), lam, rho, penalty="l2sq"))
        assert abs(s * r - brute_radial(r, pen, rho)) < 2e-6 * max(1, r)
        assert s == pytest.approx(rho / (rho + 2 * lam)) and s > 0


def test_smoothed_scad_proposition1():
    lam, a, xi = 0.6, 3.7, 1e-2
    t = torch.tensor([xi - 1e-9, xi, xi + 1e-9], dtype=torch.float64)
    v = smoothed_scad(t, lam, a, xi)
    assert float(v[1]) == pytest.approx(xi * lam)
    assert abs(float(v[2] - v[0])) < 1e-8
    ts = torch.linspace(0, 5, 5001, dtype=torch.float64)
    gap = smoothed_scad(ts, lam, a, xi) - scad(ts, lam, a)
    assert float(gap.min()) >= -1e-12 and float(gap.max()) <= xi * lam / 2 + 1e-12


def test_lam_zero_prox_is_identity():
    d = torch.randn(5, 4)
    assert torch.allclose(prox(d, 0.0, 1.0), d)


# ---------------------------------------------------------------- layouts and executors
def test_sparse_equals_dense_layout():
    prob = s1_small()
    outs = {}
    for lay in ["dense", "sparse"]:
        algo, sim, res = run(prob, dict(lam=0.6, pair_layout=lay), rounds=8, fast=True)
        th, v = algo.theta_v(sim.server)
        outs[lay] = (sim.server["W"], sim.server["R"], th, v, algo.cluster_labels(sim.server, nu=0.5))
    d, s = outs["dense"], outs["sparse"]
    for a, b in zip(d[:4], s[:4]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    assert (d[4] == s[4]).all()
    # the sparse pool holds only touched pairs (i < j), at most m(m-1)/2
    algo, sim, _ = run(prob, dict(lam=0.6, pair_layout="sparse"), rounds=1, fast=True)
    m, k = 100, 30
    assert sim.server["pair_key"].numel() == k * (m - k) + k * (k - 1) // 2


def test_sparse_pair_update_in_pieces_equals_one_piece(monkeypatch):
    """The sparse store updates the touched pairs in pieces of ``CHUNK_FLOATS``: the same pairs, scales and
    row sums as one piece (float64: only the order of the sums into R differs), and a piece never holds more
    than its share of the round's pairs."""
    from fedsolve.families.clustered.fpfc.pairs import SparsePairs

    m, df = 40, 6
    algo = FPFC(dict(lam=0.3, dtype="float64"), s1_small())
    prox_fn = algo.prox_fn
    outs, widest = {}, {}
    for piece in (2**30, 7 * df):   # one piece; 7 pairs a piece
        monkeypatch.setattr(SparsePairs, "CHUNK_FLOATS", piece)
        seen = []
        real_step = pairs_module.pair_step
        monkeypatch.setattr(pairs_module, "pair_step", lambda *a: (seen.append(a[0].shape[0]), real_step(*a))[1])
        st = {**SparsePairs.init(m, df, torch.float64), "R": torch.zeros(m, df, dtype=torch.float64)}
        gg = torch.Generator().manual_seed(1)
        for r in range(4):
            W = torch.randn(m, df, generator=gg, dtype=torch.float64)
            ids = torch.randperm(m, generator=gg)[:9]
            SparsePairs.update(st, W, ids, prox_fn)
        outs[piece], widest[piece] = st, max(seen)
        monkeypatch.setattr(pairs_module, "pair_step", real_step)
    a, b = outs[2**30], outs[7 * df]
    assert torch.equal(a["pair_key"], b["pair_key"]) and widest[7 * df] == 7 and widest[2**30] > 300
    for k in ("delta", "scale", "R"):
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-12)
    assert (a["scale"] != 0).any()


def test_row_sums_match_recomputation_and_antisymmetry():
    prob = s1_small()
    algo, sim, _ = run(prob, dict(lam=0.6, pair_layout="dense"), rounds=6, fast=True)
    th, v = algo.theta_v(sim.server)
    assert torch.allclose(th, -th.transpose(0, 1)) and torch.allclose(v, -v.transpose(0, 1))
    R = (th - v / algo.cfg.rho).sum(1)
    assert torch.allclose(sim.server["R"], R, atol=1e-4)


def test_sequential_vectorized_and_linear_executor_agree():
    prob = s1_small(scale=0.02)
    W = {}
    for name, ex, fast in [("seq", "sequential", False), ("vec", "vectorized", False), ("lin", "sequential", True)]:
        _, sim, res = run(prob, dict(lam=0.6), rounds=4, executor=ex, fast=fast)
        W[name] = (sim.server["W"], res.history[-1]["train_loss"])
    assert torch.allclose(W["seq"][0], W["vec"][0], atol=1e-5)
    assert torch.allclose(W["seq"][0], W["lin"][0], atol=1e-5)
    assert W["seq"][1] == pytest.approx(W["lin"][1], rel=1e-5)


def test_linear_executor_squared_loss_and_variable_work():
    prob = regression()
    out = []
    for fast in [False, True]:
        algo = FPFC(dict(lam=0.3, lr=0.05), prob)
        sim = Simulation(prob, algo, SimulationConfig(rounds=5, eval_every=5, sampling={"fraction": 0.5}, metrics=[],
                                                      work={"variable": "uniform", "min_fraction": 0.2}), seed=2)
        if fast:
            sim.executor = LinearGDExecutor(prob, chunk=8)
        sim.run()
        out.append(sim.server["W"])
    assert torch.allclose(out[0], out[1], atol=1e-5)


# ---------------------------------------------------------------- reductions
def test_lam_zero_reduces_to_local():
    prob = regression(sizes=(3, 3), n=40)
    algo, sim, _ = run(prob, dict(lam=0.0, lr=0.1), rounds=150, fraction=1.0, fast=True)
    th, v = algo.theta_v(sim.server)
    assert float(v.abs().max()) == 0.0
    W = sim.server["W"]
    z = algo.zeta(sim.server, torch.arange(6))
    assert torch.allclose(z, W, atol=1e-5)
    # fixed point = each device's own least squares (LOCAL)
    d = prob.data
    for i in range(6):
        x, y = d.client_train(i)
        X = torch.cat([x, torch.ones(len(y), 1)], 1).double()
        beta = torch.linalg.lstsq(X, y.double().unsqueeze(1)).solution.flatten()
        assert torch.allclose(W[i].double(), beta, atol=1e-4)


def test_growing_schedule_and_lr_decay():
    prob = regression()
    algo = FPFC(dict(local_schedule="growing", growth_rounds=20, lr_decay=0.9, lr_decay_every=5), prob)
    assert algo.work(0)["train"].steps == 1
    assert algo.work(41)["train"].steps == 3
    assert algo.lr_at(10) == pytest.approx(algo.cfg.lr * 0.81)


def test_config_validation(tmp_path, capsys):
    """The SCAD conditions name the field and what is allowed, also as one line from the CLI (exit 2)."""
    import yaml

    from fedsolve.cli import main

    prob = regression()
    with pytest.raises(ValueError, match=r"rho: 0.2 is at most 1/\(a-1\)"):
        FPFC(dict(rho=0.2), prob)
    with pytest.raises(ValueError, match="xi: 0.1 is not below lam 0.01; allowed: 0 < xi < lam"):
        FPFC(dict(lam=0.01, xi=0.1), prob)
    for params, field in ((dict(lam=0.6, xi=1.0), "xi: 1.0"), (dict(rho=0.1), "rho: 0.1")):
        cfg = {"data": {"dataset": "clustered_regression", "num_clients": None,
                        "params": {"cluster_sizes": [3, 3], "dim": 3}},
               "model": {"name": "logreg"}, "simulation": {"rounds": 2, "metrics": []},
               "algorithm": {"name": "fpfc", "params": params}}
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
        capsys.readouterr()
        assert main(["run", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert field in err and "allowed" in err and len(err.strip().splitlines()) == 1, err


def test_communication_cost_matches_paper_formula():
    prob = s1_small()
    algo, sim, res = run(prob, dict(lam=0.6), rounds=3, fast=True)
    d, m, k = 610, 100, 30
    assert res.ledger.uplink_floats == 3 * k * d and res.ledger.downlink_floats == 3 * k * d
    assert paper_cost(algo, res.ledger) == m * d + 3 * 2 * d * k
    assert m * d + 2000 * 2 * d * k == 73_261_000


# ---------------------------------------------------------------- theory
def _full_losses(prob):
    d = prob.data

    def f(i, w):
        x, y = d.client_train(i)
        out = functional_call(prob.model, prob.layout.unflatten(w.float()), (x,))
        return float(prob.loss_fn(out, y).double().mean())
    return f


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_augmented_lagrangian_non_increasing_lemma2(fraction):
    prob = regression(sizes=(3, 3), dim=2, n=50, center_scale=1.0)
    # theory regime (eq. 13 / Remark 4): rho > max(3 L_f, 2 lam/xi, 2/(a-1)), alpha = 1/(L_f + 2 rho)
    Lf = max(float(torch.linalg.eigvalsh(torch.cat([x, torch.ones(len(x), 1)], 1).T.double()
                                         @ torch.cat([x, torch.ones(len(x), 1)], 1).double() / len(x)).max())
             for x, _ in (prob.data.client_train(i) for i in range(6)))
    lam, xi = 0.1, 0.05
    rho = max(3 * Lf, 2 * lam / xi, 2 / 2.7) + 0.01
    algo = FPFC(dict(lam=lam, xi=xi, rho=rho, lr=1 / (Lf + 2 * rho), local_steps=30, pair_layout="dense",
                     dtype="float64"), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, sampling={"fraction": fraction}, metrics=[]), seed=3)
    f = _full_losses(prob)
    vals = [augmented_lagrangian(algo, sim.server, f)]
    for t in range(40):
        sim.run_round(t)
        vals.append(augmented_lagrangian(algo, sim.server, f))
    diffs = np.diff(vals)
    assert diffs.max() <= 1e-6 * max(1.0, abs(vals[0])), diffs.max()
    assert vals[-1] < vals[0]


def test_stationarity_residuals_decay():
    prob = regression(sizes=(3, 3), dim=2, n=50)
    algo = FPFC(dict(lam=0.3, lr=0.1, pair_layout="dense", dtype="float64"), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, sampling={"fraction": 1.0}, metrics=[]), seed=0)
    sim.executor = LinearGDExecutor(prob, chunk=16)
    res = []
    for t in range(300):
        W0 = sim.server["W"].clone()
        sim.run_round(t)
        th, _ = algo.theta_v(sim.server)
        W = sim.server["W"].double()
        primal = float((W.unsqueeze(1) - W.unsqueeze(0) - th).pow(2).sum())
        res.append((primal, float((sim.server["W"] - W0).pow(2).sum())))
    r = np.array(res)
    assert r[-1, 0] < 1e-3 * r[:10, 0].max() and r[-1, 1] < 1e-3 * r[:10, 1].max()


def test_oracle_property_linear_model():
    """Theorem 3: exact clusters and w_i = cluster-pooled least squares (equal n_i)."""
    prob = regression(sizes=(4, 4), dim=3, n=80, center_scale=3.0, noise=0.3, seed=4)
    algo, sim, res = run(prob, dict(lam=0.5, lr=0.1, pair_layout="dense", dtype="float64"), rounds=600,
                         fraction=1.0, fast=True)
    lab = algo.cluster_labels(sim.server)
    assert res.extras["ari"] == 1.0 and res.extras["num_clusters"] == 2
    d = prob.data
    W = sim.server["W"].double()
    for c in range(2):
        members = [i for i in range(8) if int(d.clusters[i]) == c]
        X = torch.cat([torch.cat([d.client_train(i)[0], torch.ones(d.client_train(i)[0].shape[0], 1)], 1)
                       for i in members]).double()
        y = torch.cat([d.client_train(i)[1] for i in members]).double()
        oracle = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.flatten()
        assert len(set(lab[members])) == 1
        for i in members:
            assert torch.allclose(W[i], oracle, atol=2e-3), (W[i], oracle)


def test_oracle_models_is_the_per_device_weighted_least_squares():
    """Unequal n_i: the oracle weights each device's mean loss equally (closed form), not the pooled sum."""
    data = clustered_regression(seed=3, cluster_sizes=(3, 2), dim=3, samples_per_client=[20, 80, 200, 30, 120],
                                noise_std=0.5, center_scale=3.0)
    prob = FederatedProblem(data, build_model_fn("logreg", (3,), 1), loss="squared_error")
    W, gmax = oracle_models(prob, data.clusters.numpy())
    assert gmax < 1e-9
    for c, members in ((0, [0, 1, 2]), (1, [3, 4])):
        X = torch.cat([torch.cat([data.client_train(i)[0], torch.ones(data.client_train(i)[0].shape[0], 1)], 1)
                       for i in members]).double()
        y = torch.cat([data.client_train(i)[1] for i in members]).double()
        w = torch.cat([torch.full((data.client_train(i)[0].shape[0],), 1.0 / data.client_train(i)[0].shape[0])
                       for i in members]).double()
        exact = torch.linalg.solve(X.T @ (w[:, None] * X), X.T @ (w * y))
        pooled = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.flatten()
        for i in members:
            assert torch.allclose(W[i].double(), exact, atol=1e-5), (W[i], exact)
        assert not torch.allclose(exact, pooled, atol=1e-3)       # the weighting matters here


def test_oracle_models_cross_entropy_is_stationary():
    """Softmax case: autograd's gradient of sum_{i in c} f_i at the oracle is zero; other labels, other models."""
    prob = s1_small(seed=1, scale=0.01)
    d = prob.data
    lab = d.clusters.numpy()
    W, gmax = oracle_models(prob, lab)
    assert gmax < 1e-9
    for c in range(4):
        members = np.nonzero(lab == c)[0]
        w = W[members[0]].double().clone().requires_grad_()
        F_c = sum(torch.nn.functional.cross_entropy(d.client_train(i)[0].double() @ w[:600].view(10, 60).T + w[600:],
                                                    d.client_train(i)[1].long()) for i in members)
        (g,) = torch.autograd.grad(F_c, w)
        assert float(g.abs().max()) < 1e-6
        assert all(torch.equal(W[i], W[members[0]]) for i in members)
    W1, _ = oracle_models(prob, np.zeros_like(lab))                 # one cluster: one pooled model
    assert torch.equal(W1[0], W1[-1]) and not torch.allclose(W1[0], W[0], atol=1e-2)
    with pytest.raises(ValueError, match="nn.Linear"):
        oracle_models(FederatedProblem(d, build_model_fn("mlp", (60,), 10)), lab)


# ---------------------------------------------------------------- end to end (fast)
def test_synthetic_two_clusters_recovered():
    """FPFC synthetic recipe (code's U[0,1) features, N(0,1) init), 2 clusters x 5 devices, 100 rounds."""
    data = fpfc_synthetic([5, 5], seed=0, features="uniform", max_size=2000)
    prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10))
    algo, sim, res = run(prob, dict(lam=0.6, init_std=1.0), rounds=100, fraction=0.5, fast=True)
    assert res.extras["num_clusters"] == 2 and res.extras["ari"] == 1.0
    assert res.history[-1]["test_accuracy"] > 0.7
    N = algo.theta_norms(sim.server)
    same = data.clusters.unsqueeze(0) == data.clusters.unsqueeze(1)
    assert float(N[same].max()) < algo.cfg.nu and float(N[~same].min()) > 3.7 * 0.6


def test_fpfc_l1_and_last_layer_fusion_run():
    prob = s1_small(scale=0.02)
    algo = FPFCL1(dict(lam=0.2), prob)
    _, sim, res = run(prob, algo, rounds=5, fast=True)
    assert "num_clusters" in res.history[-1]
    # last-layer-only fusion on an MLP: block 'fused' = output layer, hidden layers averaged
    data = prob.data
    prob2 = FederatedProblem(data, build_model_fn("mlp", (60,), 10, hidden=(8,)), blocks={"fused": ["out.*"]})
    algo2 = FPFC(dict(lam=0.6, batch_size=16, local_epochs=1), prob2)
    assert algo2.df == 8 * 10 + 10
    _, sim2, res2 = run(prob2, algo2, rounds=3)
    W = sim2.server["W"]
    # hidden (shared) block equal across the last round's participants
    sidx = algo2.sidx
    rows = W[:, sidx]
    uniq = torch.unique(rows, dim=0)
    assert uniq.shape[0] < 100
    assert res2.ledger.uplink_floats == 3 * 30 * prob2.layout.dim


def test_warmup_path_and_newcomers():
    prob = regression(sizes=(4, 4), dim=3, n=60, center_scale=3.0, noise=0.3)
    out = warmup_lambda_path(prob, [0.0, 0.5, 1.0, 50.0], dict(lr=0.1), SimulationConfig(
        rounds=120, sampling={"fraction": 1.0}, metrics=[]), tol=1e-3, min_rounds=5, max_rounds_per_lambda=40)
    assert out["switches"][0] == (0, 0.0) and len(out["scores"]) >= 2
    assert out["best_lambda"] in (0.0, 0.5, 1.0)
    # newcomers: train on 6 of 8 devices, then add devices 3 (cluster 0) and 7 (cluster 1)
    d = prob.data
    old, new = [0, 1, 2, 4, 5, 6], [3, 7]
    p_old = FederatedProblem(d.subset(old), prob.model_fn, loss="squared_error")
    p_new = FederatedProblem(d.subset(new), prob.model_fn, loss="squared_error")
    algo, sim, _ = run(p_old, dict(lam=0.5, lr=0.1), rounds=200, fraction=1.0, fast=True)
    nc = fpfc_newcomers(algo, sim.server, p_new, rounds=100, eval_with="cluster")
    lab = algo.cluster_labels(sim.server)
    assert nc["joined"] == [int(lab[0]), int(lab[3])]
    assert nc["summary"]["test_rmse"] < 1.0


def test_async_fpfc_event_simulation():
    from fedsolve.families.clustered.protocols.async_fpfc import AsyncConfig, run_async_fpfc, run_sync_fpfc_timed

    prob = regression(sizes=(3, 3), dim=3, n=40)
    cfg = AsyncConfig(delay_high=20.0, horizon=600.0, eval_every=100.0, delay_mode="redraw")
    out = run_async_fpfc(prob, dict(lam=0.5, lr=0.1), cfg, seed=0, simulation={"executor": "linear"})
    h = out["history"]
    assert [r["virtual_time"] for r in h[:3]] == [0.0, 100.0, 200.0]
    assert out["events"] > 6 * 600 / 20  # each node updates about every 10 s on average
    assert h[-1]["test_rmse"] < h[0]["test_rmse"] and h[-1]["ari"] == 1.0
    # one async event touches only the pairs (i_k, .): compare with a dense recomputation of R
    algo = out["algorithm"]
    th, v = algo.theta_v(out["server"])
    assert torch.allclose(out["server"]["R"], (th - v / algo.cfg.rho).sum(1), atol=1e-4)
    sync = run_sync_fpfc_timed(prob, dict(lam=0.5, lr=0.1), clients_per_round=2,
                               cfg=AsyncConfig(delay_high=20.0, horizon=300.0), simulation={"executor": "linear"})
    assert sync["history"][-1]["virtual_time"] >= 300.0 - 20.0


def test_async_and_newcomer_servers_give_the_same_numbers_on_every_executor():
    """The asyncFPFC server (one arrival per step, stale zeta) and the newcomers' server run their devices'
    eq. (5) through the engine: sequential, vectorized and linear executors agree."""
    from fedsolve.families.clustered.protocols.async_fpfc import AsyncConfig, run_async_fpfc

    prob = regression(sizes=(3, 3), dim=3, n=40)
    cfg = AsyncConfig(delay_high=20.0, horizon=80.0, eval_every=40.0, delay_mode="redraw")
    outs = {ex: run_async_fpfc(prob, dict(lam=0.5, lr=0.1), cfg, seed=1, simulation={"executor": ex})
            for ex in ("sequential", "vectorized", "linear")}
    for ex in ("vectorized", "linear"):
        assert outs[ex]["events"] == outs["sequential"]["events"] > 6
        for k in ("W", "R", "Z"):
            torch.testing.assert_close(outs[ex]["server"][k], outs["sequential"]["server"][k], rtol=1e-4, atol=1e-5)
    d = prob.data
    p_old = FederatedProblem(d.subset([0, 1, 3, 4]), prob.model_fn, loss="squared_error")
    p_new = FederatedProblem(d.subset([2, 5]), prob.model_fn, loss="squared_error")
    base, sim, _ = run(p_old, dict(lam=0.5, lr=0.1), rounds=15, fraction=1.0, fast=True)
    nc = {ex: fpfc_newcomers(base, sim.server, p_new, rounds=4, simulation={"executor": ex})
          for ex in ("sequential", "vectorized")}
    torch.testing.assert_close(nc["sequential"]["params"], nc["vectorized"]["params"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(nc["sequential"]["theta_norms"], nc["vectorized"]["theta_norms"], rtol=1e-4, atol=1e-5)


def test_sparse_pairs_resume_from_a_checkpoint_exactly(tmp_path):
    """The sparse pair pool grows from empty: a checkpoint of it resumes (its size differs from init's) and the
    resumed run has the uninterrupted run's pairs, row sums and clusters."""
    prob = s1_small()

    def sim(rounds, out=None):
        algo = FPFC(dict(lam=0.6, pair_layout="sparse"), prob)
        cfg = SimulationConfig(rounds=rounds, eval_every=2, executor="sequential", metrics=[],
                               sampling={"fraction": 0.3})
        return algo, Simulation(prob, algo, cfg, seed=1, out_dir=out)

    a_full, s_full = sim(4)
    full = s_full.run()
    sim(2, tmp_path)[1].run()
    a_res, s_res = sim(4, tmp_path)
    resumed = s_res.run(resume=True)
    assert json.dumps(full.history) == json.dumps(resumed.history)
    for k in ("W", "R", "pair_key", "delta", "scale"):
        assert torch.equal(full.server[k], resumed.server[k]), k
    assert 0 < full.server["pair_key"].numel() < 100 * 99 // 2
    assert (a_full.cluster_labels(full.server) == a_res.cluster_labels(resumed.server)).all()
