"""FedNest and LFedNest: round accounting (spec 3.7: 10 and 2 rounds per outer iteration) and one outer
iteration against a hand computation on the quadratic bilevel problem of test_bilevel.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_bilevel import client_matrices, quad_problem, run, MU_X


def _phases_run(sim, rounds: int) -> list[str]:
    """The phase of each of the next ``rounds`` rounds (the algorithm's phase table read from the server state)."""
    out = []
    for _ in range(rounds):
        out.append(sim.algo.phases.current(sim.server))
        sim.step()
    return out


def test_round_accounting():
    prob = quad_problem()
    sim = run(prob, "fednest", 0, batch_size=None)
    assert sim.algo.rounds_per_iteration == 10
    x0, y0 = sim.server["x"].clone(), sim.server["y"].clone()
    moved, seen = [], []
    for t in range(10):
        seen += _phases_run(sim, 1)
        moved.append((not torch.equal(sim.server["x"], x0), not torch.equal(sim.server["y"], y0)))
    assert seen == ["anchor", "inner", "p0"] + ["neumann"] * 5 + ["hypergrad", "outer"]
    assert sim.algo.phases.current(sim.server) == "anchor" and int(sim.server["iteration"]) == 1
    assert [m[0] for m in moved] == [False] * 9 + [True]          # x moves once, in the 10th round
    assert [m[1] for m in moved] == [False] + [True] * 9           # y moves in the 2nd round (FedInn)
    assert len(sim.ledger.per_round) == 10
    l = run(prob, "lfednest", 0, batch_size=None)
    assert l.algo.rounds_per_iteration == 2 and _phases_run(l, 4) == ["inner", "outer_local"] * 2
    f = run(prob, "fednest", 0, inner_ep=2, neumann=3)
    assert f.algo.rounds_per_iteration == 2 * 2 + 1 + 3 + 2
    assert _phases_run(f, 10) == ["anchor", "inner"] * 2 + ["p0"] + ["neumann"] * 3 + ["hypergrad", "outer"]
    assert _phases_run(run(prob, "fednest", 0, neumann=0), 4) == ["anchor", "inner", "p0", "hypergrad"]
    assert _phases_run(run(prob, "lfednest", 0, inner_ep=3), 5) == ["inner"] * 3 + ["outer_local", "inner"]


def _hand_fednest(mats, x0, y0, c, local: bool, taus=None, outer_taus=None):
    """One outer iteration, full participation, full batches (local_ep epochs = local_ep steps, or tau_i);
    ``outer_taus``: each client's local x-steps (default 1)."""
    n = len(mats)
    taus = taus or [int(c.local_ep)] * n
    lr, hlr = c.lr, c.hlr
    glob = sum(A @ y0 - B @ x0 - cc for A, B, cc, C, e in mats) / n
    ys = []
    for (A, B, cc, C, e), steps in zip(mats, taus):
        y = y0.copy()
        for _ in range(steps):
            g = A @ y - B @ x0 - cc
            y = y - lr * (g if local else (A @ (y - y0) + glob))
        ys.append(y)
    y1 = sum(ys) / n

    def neumann(As, fy):
        p, counter = fy.copy(), fy.copy()
        for _ in range(c.neumann):
            counter = counter - hlr * sum(A @ counter for A in As) / len(As)
            p = p + counter
        return p

    if local:
        hgs = [MU_X * x0 - hlr * (-B.T @ neumann([A], C @ y1 - e)) for A, B, cc, C, e in mats]
    else:
        p = neumann([M[0] for M in mats], sum(C @ y1 - e for A, B, cc, C, e in mats) / n)
        hg = sum(MU_X * x0 + hlr * B.T @ p for A, B, cc, C, e in mats) / n
        hgs = [hg] * n
    # x <- x - hlr (grad_x f_i(x) - grad_x f_i(x0) + hg_i), grad_x f_i(x) = mu_x x
    xs = []
    for h, steps in zip(hgs, outer_taus or [1] * n):
        x = x0.copy()
        for _ in range(steps):
            x = x - hlr * (MU_X * (x - x0) + h)
        xs.append(x)
    return sum(xs) / n, y1


@pytest.mark.parametrize("name", ["fednest", "lfednest"])
@pytest.mark.parametrize("taus", [None, [1, 4, 2]])
def test_one_outer_iteration_matches_hand_computation(name, taus):
    """Also with persistent per-client inner steps tau_i (Fig. 4: every method's local work varies)."""
    prob = quad_problem()
    mats = client_matrices(prob)
    sim = run(prob, name, 0, batch_size=None, lr=0.05, hlr=0.1, local_ep=3, tau_clients=taus)
    x0, y0 = sim.server["x"].numpy().copy(), sim.server["y"].numpy().copy()
    for _ in range(sim.algo.rounds_per_iteration):
        sim.step()
    x1, y1 = _hand_fednest(mats, x0, y0, sim.algo.cfg, local=name == "lfednest", taus=taus)
    assert np.allclose(sim.server["y"].numpy(), y1, atol=1e-12)
    assert np.allclose(sim.server["x"].numpy(), x1, atol=1e-12)


@pytest.mark.parametrize("name", ["fednest", "lfednest"])
def test_tau_outer_gives_the_x_steps_each_clients_tau(name):
    """``tau_outer``: FedOut's local x-steps take tau_i too (A.2: every method's local work varies); without it
    every client takes outer_tau = 1 x-step, so the two differ."""
    prob = quad_problem()
    mats = client_matrices(prob)
    taus = [1, 4, 2]
    got = {}
    for tau_outer in (True, False):
        sim = run(prob, name, 0, batch_size=None, lr=0.05, hlr=0.1, tau_clients=taus, tau_outer=tau_outer)
        x0, y0 = sim.server["x"].numpy().copy(), sim.server["y"].numpy().copy()
        for _ in range(sim.algo.rounds_per_iteration):
            sim.step()
        got[tau_outer] = sim.server["x"].numpy()
    x1, _ = _hand_fednest(mats, x0, y0, sim.algo.cfg, local=name == "lfednest", taus=taus, outer_taus=taus)
    assert np.allclose(got[True], x1, atol=1e-12)
    assert np.linalg.norm(got[True] - got[False]) > 1e-4
    with pytest.raises(ValueError, match="tau_outer"):
        run(prob, name, 0, tau_outer=True)


def test_neumann_approximates_the_inverse_hessian_vector_product():
    """FedIHGP's p = hlr sum_{j<=K} (I - hlr H)^j grad_y F -> H^-1 grad_y F as K grows (hlr ||H|| < 1)."""
    prob = quad_problem()
    mats = client_matrices(prob)
    errs = []
    for K in (5, 60):
        sim = run(prob, "fednest", 0, batch_size=None, hlr=0.2, neumann=K)
        for _ in range(3 + K):   # anchor, inner, p0, K Neumann rounds
            sim.step()
        A = sum(M[0] for M in mats) / 3
        y = sim.server["y"].numpy()
        fy = sum(M[3] @ y - M[4] for M in mats) / 3
        errs.append(np.linalg.norm(0.2 * sim.server["p"].numpy() - np.linalg.solve(A, fy)))
    assert errs[1] < 1e-4 < errs[0]


@pytest.mark.parametrize("name", ["fednest", "lfednest"])
def test_sequential_and_vectorized_agree(name):
    from fedsolve.models import build_model_fn
    from fedsolve.families import get_problem_kind
    from fedsolve.problems import FederatedProblem
    from tests.conftest import make_data
    from tests.test_bilevel import to64

    data = to64(make_data(m=4, d=5, classes=3, n_range=(10, 25)))
    base = FederatedProblem(data, lambda: build_model_fn("mlp", data.input_shape, 3, hidden=(6,))().double())
    prob = get_problem_kind("hyper_representation")(base, {"lam": 0.1}, 0)
    out = {}
    for ex in ("sequential", "vectorized"):
        sim = run(prob, name, 10 if name == "fednest" else 4, executor=ex, clients=3, batch_size=4, local_ep=1.0)
        out[ex] = sim.server
    for k in ("x", "y"):
        assert torch.allclose(out["sequential"][k], out["vectorized"][k], atol=1e-10), k


def _participants(hold: bool, rounds: int = 20):
    prob = quad_problem(m=8)
    sim = run(prob, "fednest", 0, clients=3, batch_size=None, hold_sample=hold)
    return [tuple(sim.run_round(t)["ids"].tolist()) for t in range(rounds)]


def test_fednest_holds_one_sample_through_fedinn_and_one_through_fedout():
    """FedNest's code samples once for FedInn (anchor + inner: rounds 0-1 of an iteration) and once for FedOut
    (p0, 5 Neumann, hypergradient, outer: rounds 2-9); each block's clients are the engine's draw of the round
    where the block begins, so the fresh-sample run shows the same clients at those rounds."""
    held, fresh = _participants(True), _participants(False)
    blocks = [(0, 2), (2, 10), (10, 12), (12, 20)]
    for a, b in blocks:
        assert set(held[a:b]) == {held[a]}, (a, b, held[a:b])
        assert held[a] == fresh[a]
    assert len({held[a] for a, _ in blocks}) > 1                 # a new draw per block
    assert any(len(set(fresh[a:b])) > 1 for a, b in blocks)      # without hold: a new draw every round


def test_lfednest_draws_afresh_every_round():
    prob = quad_problem(m=8)
    sims = [run(prob, "lfednest", 0, clients=3, batch_size=None, hold_sample=h) for h in (True, False)]
    ids = [[tuple(s.run_round(t)["ids"].tolist()) for t in range(8)] for s in sims]
    assert ids[0] == ids[1] and len(set(ids[0])) > 1
