"""FedAPM (Zhu et al., KDD'25): spec sec. 6 "must get right" list, reductions, and theory checks.

Most tests use a float64 split ridge-regression problem  y ~ A_i u + B_i v_i  (shared u, personal
v_i) with 32 samples per client, so full-batch plan weights (1/32) are exact in float32 and the
closed-form optimum of eq. (2) is one linear solve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedsolve.families.classic.fedadmm import FedADMM
from fedsolve.families.personalized.fedapm import FedAPM
from fedsolve.families.personalized.baselines import FedAlt
from fedsolve.core.executor import SequentialExecutor, build_plans
from fedsolve.data.federated import FederatedData
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

P, Q = 3, 2


class SplitLinear(nn.Module):
    GROUPS = {"shared": ["shared.*"], "personal": ["personal.*"]}

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(P, 1, bias=False)
        self.personal = nn.Linear(Q, 1, bias=False)

    def forward(self, x):
        return self.shared(x[:, :P]) + self.personal(x[:, P:])


def ridge_problem(m=4, sizes=None, seed=0, personal=True):
    g = np.random.default_rng(seed)
    u = g.normal(size=P)
    tr, te = [], []
    for i in range(m):
        n = sizes[i] if sizes else 32
        X = g.normal(size=(n, P + Q)) + 0.5 * g.normal(size=P + Q)
        y = X[:, :P] @ u + X[:, P:] @ g.normal(size=Q) + 0.1 * g.normal(size=n)
        tr.append((X, y))
        te.append((X[:8], y[:8]))
    d = FederatedData.from_client_arrays(tr, te, task="regression")
    for k in ("train_x", "train_y", "test_x", "test_y"):
        setattr(d, k, getattr(d, k).double())
    blocks = {"personal": ["personal.*"]} if personal else {}
    return FederatedProblem(d, lambda: SplitLinear().double(), loss="squared_error", blocks=blocks)


def ridge_optimum(prob, lam, alpha):
    """Minimiser of sum_i alpha_i [(1/2n_i)||A_i u + B_i v_i - y_i||^2 + (lam/2)(||u||^2 + ||v_i||^2)]."""
    m = prob.num_clients
    D = P + m * Q
    H, b = np.zeros((D, D)), np.zeros(D)
    for i in range(m):
        X, y = (t.numpy() for t in prob.data.client_train(i))
        n, a, A, B = len(y), alpha[i], X[:, :P], X[:, P:]
        s = slice(P + i * Q, P + (i + 1) * Q)
        H[:P, :P] += a * (A.T @ A / n + lam * np.eye(P))
        H[:P, s] += a * A.T @ B / n
        H[s, :P] += a * B.T @ A / n
        H[s, s] += a * (B.T @ B / n + lam * np.eye(Q))
        b[:P] += a * A.T @ y / n
        b[s] += a * B.T @ y / n
    z = np.linalg.solve(H, b)
    return z[:P], z[P:].reshape(m, Q)


def make_sim(prob, algo, executor="sequential", **sampling):
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, eval_every=1000, executor=executor,
                                                 sampling=sampling or {}), seed=0)
    sim._t0 = 0.0
    return sim


THEORY = dict(solver="xi_controlled", alpha="one", rho=1.0, sigma=0.1, lr=0.4, xi_decay=0.5, xi0=1.0,
              max_steps=25, weight_decay=0.1, v_tol=1e-20)


# --------------------------------------------------------------------------- sec. 6 items 1, 4, 6, 7
def test_init_common_model_zero_duals():
    prob = ridge_problem()
    algo = FedAPM(None, prob)
    sim = make_sim(prob, algo)
    c, s = sim.clients, sim.server
    assert torch.all(c["pi"] == 0)
    assert torch.equal(c["u"], s["u"].expand_as(c["u"]))  # z_i^0 = u_i^0 = u^0: the server's sum is m u^0
    torch.testing.assert_close(s["zsum"], 4 * s["u"], rtol=0, atol=1e-15)
    assert torch.equal(c["v"], c["v"][:1].expand_as(c["v"]))  # common init
    assert s["u"].numel() == P and c["v"].shape == (4, Q)  # server never holds personal parameters


def test_init_stores_one_default_row_per_state_not_m_rows():
    """Nothing ``[m, d]`` at init: every client state is one default row until a client writes its own."""
    prob = ridge_problem(m=6)
    algo = FedAPM(dict(rho=0.5, batch_size=8), prob)
    sim = make_sim(prob, algo, clients_per_round=2)
    assert set(sim.clients.keys()) == {"v", "u", "pi", "xi", "drift"}
    assert all(sim.clients.touched(k).numel() == 0 for k in sim.clients.keys())
    ids = sim.run_round(0)["ids"]
    assert all(sorted(sim.clients.touched(k).tolist()) == sorted(ids.tolist()) for k in sim.clients.keys())
    torch.testing.assert_close(sim.clients["xi"], torch.where(torch.isin(torch.arange(6), ids), 0.9, 1.0).double())


def test_upload_z_and_uniform_all_client_mean_with_stale_cache():
    prob = ridge_problem(m=5, sizes=[8, 16, 32, 64, 16])  # unequal n_i: a weighted mean would differ
    algo = FedAPM(dict(rho=0.5, lr=0.1, batch_size=None, local_steps=3), prob)
    sim = make_sim(prob, algo, clients_per_round=2)
    z = sim.clients["u"].clone()   # z_i^0 = u_i^0
    for t in range(4):
        info = sim.run_round(t)
        ids = info["ids"]
        c, s = sim.clients, sim.server
        z[ids] = c["u"][ids] + c["pi"][ids] / 0.5   # (13) for the participants; the others' z_i stay stale
        torch.testing.assert_close(s["zsum"], z.sum(0), rtol=0, atol=1e-12)
        torch.testing.assert_close(s["u"], z.mean(0), rtol=0, atol=1e-12)  # uniform mean over ALL m
    # communication: down u^t (d_u floats), up z_i (d_u floats), per selected client, nothing personal
    assert sim.ledger.per_round[-1]["up_floats"] == 2 * P and sim.ledger.per_round[-1]["down_floats"] == 2 * P


def test_non_selected_clients_bit_identical_and_xi_decays_on_participation():
    prob = ridge_problem(m=6)
    algo = FedAPM(dict(rho=0.3, lr=0.1, batch_size=8, xi_decay=0.5), prob)
    sim = make_sim(prob, algo, clients_per_round=2)
    count = torch.zeros(6)
    for t in range(5):
        before = sim.clients.clone()
        ids = sim.run_round(t)["ids"]
        count[ids] += 1
        for i in range(6):
            if i not in ids.tolist():
                for k in before.keys():
                    assert torch.equal(before[k][i], sim.clients[k][i]), (k, i)
            else:
                assert not torch.equal(before["pi"][i], sim.clients["pi"][i])
    torch.testing.assert_close(sim.clients["xi"], 0.5 ** count.double(), rtol=0, atol=0)


def test_duals_distinct_per_client():
    prob = ridge_problem(m=4)
    algo = FedAPM(dict(rho=0.3, lr=0.1, batch_size=8), prob)
    sim = make_sim(prob, algo, executor="vectorized")
    for t in range(3):
        sim.run_round(t)
    pi = sim.clients["pi"]
    for i in range(4):
        for j in range(i + 1, 4):
            assert (pi[i] - pi[j]).abs().max() > 1e-6
    # uploads carry the duals: the server's sum of z_i = u_i + pi_i / rho
    torch.testing.assert_close(sim.server["zsum"], (sim.clients["u"] + pi / 0.3).sum(0))


# --------------------------------------------------------------------------- sec. 6 items 2, 3, 5
def reference_round(prob, alpha, rho, sigma, lr, K, wd, v, u_i, pi, u_t, i):
    """Algorithm 1 for one client, full-batch GD, K steps per phase, written out by hand."""
    x, y = prob.data.client_train(i)

    def f(vv, uu):
        pred = x[:, :P] @ uu + x[:, P:] @ vv
        return 0.5 * (pred - y).pow(2).mean() + 0.5 * wd * (uu.pow(2).sum() + vv.pow(2).sum())

    vk = v.clone()
    for _ in range(K):  # (9): alpha f_i(v, u_i^t) + sigma/2 ||v - v_i^t||^2
        vk.requires_grad_(True)
        g, = torch.autograd.grad(alpha * f(vk, u_i), vk)
        vk = (vk - lr * (g + sigma * (vk - v))).detach()
    uk = u_t.clone()  # warm start at u^t
    for _ in range(K):  # (11): alpha f_i(v^{t+1}, u) + <pi^t, u - u^t> + rho/2 ||u - u^t||^2
        uk.requires_grad_(True)
        g, = torch.autograd.grad(alpha * f(vk, uk), uk)
        uk = (uk - lr * (g + pi + rho * (uk - u_t))).detach()
    pi_new = pi + rho * (uk - u_t)  # (12) with u^t
    return vk, uk, pi_new, uk + pi_new / rho  # (13)


@pytest.mark.parametrize("alpha", ["uniform", "samples", "one"])
def test_client_round_matches_algorithm1_by_hand(alpha):
    prob = ridge_problem(m=3, sizes=[32, 16, 64])
    rho, sigma, lr, K, wd = 0.2, 0.05, 0.3, 4, 0.01
    algo = FedAPM(dict(alpha=alpha, rho=rho, sigma=sigma, lr=lr, local_steps=K, batch_size=None,
                       weight_decay=wd), prob)
    g = torch.Generator().manual_seed(1)
    rows = {"v": torch.randn(3, Q, generator=g, dtype=torch.float64),
            "u": torch.randn(3, P, generator=g, dtype=torch.float64),
            "pi": torch.randn(3, P, generator=g, dtype=torch.float64),
            "xi": torch.ones(3, dtype=torch.float64), "drift": torch.zeros(3, dtype=torch.float64)}
    u_t = torch.randn(P, generator=g, dtype=torch.float64)
    ids = torch.arange(3)
    from fedsolve.core.rng import RngStreams

    plans = build_plans(algo.work(), prob.data.train_offsets, ids, RngStreams(0), 0)
    new, up, _ = SequentialExecutor().run(algo, rows, algo.broadcast({"u": u_t}, ids, 0), ids, plans, prob.data)
    for i in range(3):
        a = {"one": 1.0, "uniform": 1 / 3, "samples": float(prob.data.weights[i])}[alpha]
        v, u, pi, z = reference_round(prob, a, rho, sigma, lr, K, wd, rows["v"][i], rows["u"][i], rows["pi"][i],
                                      u_t, i)
        torch.testing.assert_close(new["v"][i], v, rtol=1e-6, atol=1e-9)  # float32 plan weights for n=... exact
        torch.testing.assert_close(new["u"][i], u, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(new["pi"][i], pi, rtol=1e-6, atol=1e-9)
        # upload z_i^{t+1} - z_i^t, z_i^t = u_i^t + pi_i^t / rho from the client's own state
        torch.testing.assert_close(up["dz"][i], z - (rows["u"][i] + rows["pi"][i] / rho), rtol=1e-6, atol=1e-8)


def test_v_step_uses_local_or_server_shared_copy():
    prob = ridge_problem(m=2)
    kw = dict(rho=0.2, lr=0.3, local_steps=2, batch_size=None)
    rows = {"v": torch.zeros(2, Q, dtype=torch.float64), "u": torch.ones(2, P, dtype=torch.float64),
            "pi": torch.zeros(2, P, dtype=torch.float64), "xi": torch.ones(2, dtype=torch.float64),
            "drift": torch.zeros(2, dtype=torch.float64)}
    ids = torch.arange(2)
    from fedsolve.core.rng import RngStreams

    out = {}
    for mode in ("local", "server"):
        algo = FedAPM(dict(kw, v_shared=mode), prob)
        plans = build_plans(algo.work(), prob.data.train_offsets, ids, RngStreams(0), 0)
        out[mode] = SequentialExecutor().run(algo, rows, {"u": torch.zeros(2, P, dtype=torch.float64)}, ids,
                                             plans, prob.data)[0]["v"]
    assert (out["local"] - out["server"]).abs().max() > 1e-4


# --------------------------------------------------------------------------- sec. 6 items 9, 10
def test_eval_local_or_server_model():
    prob = ridge_problem(m=3)
    for mode in ("local", "server"):
        algo = FedAPM(dict(eval_shared=mode, rho=0.3, batch_size=8), prob)
        sim = make_sim(prob, algo)
        sim.run_round(0)
        p = sim.eval_params()
        shared = sim.clients["u"] if mode == "local" else sim.server["u"].expand(3, P)
        torch.testing.assert_close(p[:, :P], shared, rtol=0, atol=0)  # layout: shared.weight then personal
        torch.testing.assert_close(p[:, P:], sim.clients["v"], rtol=0, atol=0)


def test_rho_zero_requires_no_dual():
    prob = ridge_problem()
    with pytest.raises(ValueError, match="rho"):
        FedAPM(dict(rho=0.0), prob)
    algo = FedAPM(dict(rho=0.0, dual=False, batch_size=8), prob)
    sim = make_sim(prob, algo)
    sim.run_round(0)
    assert torch.isfinite(sim.server["u"]).all()
    torch.testing.assert_close(sim.server["zsum"], sim.clients["u"].sum(0), rtol=0, atol=1e-12)   # z_i = u_i


# --------------------------------------------------------------------------- reductions (sec. 3)
def _alt_pair(prob, **common):
    apm = FedAPM(dict(common, dual=False, sigma=0.0, v_shared="server", warm_start="server"), prob)
    alt = FedAlt(dict(common, aggregate_over="all", weighting="uniform"), prob)
    return apm, alt


@pytest.mark.parametrize("rho", [0.0, 1e-9])
def test_fedapm_pi0_rho_to_0_reproduces_fedalt(rho):
    prob = ridge_problem(m=5)
    common = dict(lr=0.2, batch_size=8, local_epochs=1.0, weight_decay=0.01, alpha="one")
    apm, alt = _alt_pair(prob, **common)
    apm = FedAPM(dict(apm.cfg.model_dump(), rho=rho), prob)
    sims = [make_sim(prob, a, clients_per_round=2) for a in (apm, alt)]
    for t in range(6):
        for s in sims:
            s.run_round(t)
    a, b = sims
    tol = 0 if rho == 0 else 1e-7
    torch.testing.assert_close(a.server["u"], b.server["u"], rtol=0, atol=tol)
    torch.testing.assert_close(a.clients["v"], b.clients["v"], rtol=0, atol=tol)
    torch.testing.assert_close(a.clients["u"], b.clients["u"], rtol=0, atol=tol)
    assert not torch.equal(a.server["u"], sims[0].clients["u"][0])  # something happened


def test_without_personal_block_is_fedadmm():
    prob = ridge_problem(m=4, personal=False)
    common = dict(lr=0.2, batch_size=None, local_steps=3, weight_decay=0.01, rho=0.5)
    apm = FedAPM(dict(common, alpha="one"), prob)
    admm = FedADMM(dict(common, aggregate_over="all", weighting="uniform", warm_start="server"), prob)
    assert apm.d_v == 0
    sims = [make_sim(prob, a, clients_per_round=2) for a in (apm, admm)]
    for t in range(5):
        for s in sims:
            s.run_round(t)
    torch.testing.assert_close(sims[0].server["u"], sims[1].server["z"], rtol=0, atol=1e-12)
    torch.testing.assert_close(sims[0].clients["pi"], sims[1].clients["lam"], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- theory (sec. 5.4)
def _run_theory(prob, rounds, executor="vectorized", **sampling):
    algo = FedAPM(THEORY, prob)
    sim = make_sim(prob, algo, executor=executor, **sampling)
    us, vs = ridge_optimum(prob, THEORY["weight_decay"], [1.0] * prob.num_clients)
    errs, stat = [], []
    for t in range(rounds):
        sim.run_round(t)
        errs.append(float(np.abs(sim.server["u"].numpy() - us).max() + np.abs(sim.clients["v"].numpy() - vs).max()))
        if t % 10 == 9:
            stat.append(algo.stationarity(sim.server, sim.clients)["stationarity"])
    return sim, np.array(errs), stat


@pytest.mark.slow
def test_linear_convergence_to_closed_form_optimum():
    prob = ridge_problem(m=4)
    sim, errs, stat = _run_theory(prob, 60)
    slope = np.polyfit(np.arange(5, 60), np.log(errs[5:]), 1)[0]
    assert slope < -0.1, slope  # geometric decay
    assert errs[-1] < 1e-6, errs[-1]
    # consensus and dual sum -> 0 (spec 5.4 item 2); exact-ish u-solves: pi_i = -alpha grad_u f_i
    assert (sim.clients["u"] - sim.server["u"]).abs().max() < 1e-6
    assert sim.clients["pi"].sum(0).abs().max() < 1e-6


@pytest.mark.slow
def test_stationarity_residual_decreases_to_tolerance():
    prob = ridge_problem(m=4)
    _, _, stat = _run_theory(prob, 60)
    assert all(b < a for a, b in zip(stat, stat[1:])), stat
    assert stat[-1] < 1e-5, stat


@pytest.mark.slow
def test_partial_participation_still_converges():
    prob = ridge_problem(m=4)
    _, errs, stat = _run_theory(prob, 60, clients_per_round=2)
    assert errs[-1] < 1e-3 * errs[0] and stat[-1] < stat[0]


@pytest.mark.slow
def test_admm_closes_consensus_gap_penalty_does_not():
    """Spec 5.4 item 6: at fixed small rho the dual removes the gap a pure penalty method keeps."""
    prob = ridge_problem(m=4)
    gaps = {}
    for dual in (True, False):
        algo = FedAPM(dict(THEORY, rho=0.5, dual=dual), prob)
        sim = make_sim(prob, algo, executor="vectorized")
        for t in range(40):
            sim.run_round(t)
        gaps[dual] = float((sim.clients["u"] - sim.server["u"]).norm(dim=-1).max())
    assert gaps[True] < 1e-5 and gaps[False] > 1e-2, gaps


# --------------------------------------------------------------------------- executors
@pytest.mark.parametrize("kw", [dict(), dict(solver="xi_controlled", max_steps=10, xi0=0.1), dict(dual=False),
                                dict(v_shared="server", warm_start="local", alpha="samples")])
def test_sequential_equals_vectorized(kw):
    prob = ridge_problem(m=5, sizes=[16, 32, 24, 40, 32])
    res = []
    for ex in ("sequential", "vectorized"):
        algo = FedAPM(dict(dict(rho=0.3, lr=0.2, batch_size=8), **kw), prob)
        sim = make_sim(prob, algo, executor=ex, clients_per_round=3)
        for t in range(3):
            sim.run_round(t)
        res.append((sim.server["u"], sim.clients.state_dict()))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=0, atol=1e-12)
    for k in res[0][1]:
        torch.testing.assert_close(res[0][1][k], res[1][1][k], rtol=0, atol=1e-12)


def test_full_simulation_with_diagnostics():
    prob = ridge_problem(m=4)
    algo = FedAPM(dict(rho=0.5, lr=0.2, batch_size=8), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=4, eval_every=2, executor="auto",
                                                 sampling={"fraction": 0.5}), seed=3)
    res = sim.run()
    rec = res.history[-1]
    for k in ("model_deviation", "local_drift", "stationarity", "kkt_u", "dual_sum_norm", "test_rmse",
              "other_eval_rmse"):
        assert k in rec and math.isfinite(rec[k]), k


# --------------------------------------------------------------------------- the server's running sum
class _DenseZ:
    """The former server of ``aggregate_over: all``: every client's last upload ``z_i`` in a dense ``[m, d_u]``
    table, all m rows averaged every round (the reference the running sum must reproduce)."""

    def init(self, x0, rngs):
        server, clients = super().init(x0, rngs)
        del server["zsum"]
        server["z"] = server["u"].unsqueeze(0).repeat(self.num_clients, 1)
        return server, clients

    def upload(self, state, new):
        return {"z": self.z_of(new)}

    def aggregate(self, server, ids, uploads, round_):
        from fedsolve.engine.algorithm import weighted_mean

        z = server["z"].clone()
        z[ids] = uploads["z"]
        uniform = getattr(self.cfg, "weighting", "uniform") == "uniform"
        return {"z": z, "u": z.mean(0) if uniform else weighted_mean(z, self.client_weights)}


def _all_client_cases():
    from fedsolve.families.personalized.baselines import FedPer, FedRep, FedSim, LGFedAvg

    base = dict(lr=0.2, batch_size=4, local_epochs=1.0)
    yield "fedapm", FedAPM, dict(base, rho=0.3)
    yield "fedapm-samples-alpha-local", FedAPM, dict(base, rho=0.3, alpha="samples", v_shared="server",
                                                     warm_start="local")
    yield "fedapm-nodual", FedAPM, dict(base, rho=0.0, dual=False)
    yield "fedapm-nodual-rho", FedAPM, dict(base, rho=0.2, dual=False)
    for cls in (FedAlt, FedSim, FedPer, LGFedAvg, FedRep):
        for weighting in ("uniform", "samples"):
            yield f"{cls.name}-{weighting}", cls, dict(base, aggregate_over="all", weighting=weighting,
                                                       **({"personal_epochs": 2.0} if cls is FedRep else {}))


@pytest.mark.parametrize("case", list(_all_client_cases()), ids=lambda c: c[0])
def test_running_sum_server_reproduces_the_dense_all_client_mean(case):
    """Uploads ``z_i^{t+1} - z_i^t`` into ``S = sum_i w_i z_i`` give the dense ``[m, d_u]`` table's trajectory
    (float64, partial participation, stale clients), for every algorithm that averages over all m clients."""
    from conftest import make_problem

    _, cls, params = case
    prob = make_problem("mlp", m=7, seed=3, n_range=(6, 20))
    fn = prob.model_fn
    for k in ("train_x", "test_x"):
        setattr(prob.data, k, getattr(prob.data, k).double())
    prob = FederatedProblem(prob.data, lambda: fn().double(),
                            blocks={"personal": ["out.*"]})   # the presets (FedPer, ...) pick their own
    dense = type("Dense" + cls.__name__, (_DenseZ, cls), {})
    algos = [cls(dict(params), prob), dense(dict(params), prob)]
    assert algos[0].d_v > 0 and algos[0].d_u > 0
    sims = [make_sim(prob, a, executor="vectorized", clients_per_round=3) for a in algos]
    assert "zsum" in sims[0].server and "z" in sims[1].server
    u0 = sims[0].server["u"].clone()
    for t in range(6):
        for s in sims:
            s.run_round(t)
        a, b = sims
        torch.testing.assert_close(a.server["u"], b.server["u"], rtol=0, atol=1e-10)
        for k in a.clients.keys():
            torch.testing.assert_close(a.clients[k], b.clients[k], rtol=0, atol=1e-10)
    assert a.ledger.per_round == b.ledger.per_round   # d_u floats per participant either way
    assert a.ledger.per_round[-1]["up_floats"] == 3 * algos[0].d_u
    assert (a.server["u"] - u0).abs().max() > 1e-3   # the shared block moved
