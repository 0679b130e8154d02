"""FBO-AggITD (reconstruction, spec simfbo.md 3.7) on the quadratic bilevel problem of test_bilevel.py.

The point it is supposed to reach, derived for tau_i = 1, full participation and exact oracles: each round is
one global step y <- y - beta (A y - B x - c), v <- v - beta (A v - (C y - e)) (a mean of local steps taken
from the same point); v restarts from 0 every outer iteration and the last of the N rounds evaluates
h_x = mu_x x + B^T v at its starting point, where v = v_{N-1}. At a fixed point of the outer map y = y*(x)
(y is warm-started and GD on y stops only there), so v_K = (I - M^K) v*(x), M = I - beta A, K = N - 1, and x
solves the truncated-ITD stationarity condition

    mu_x x + B^T (I - M^K) A^-1 (C A^-1 (B x + c) - e) = 0,

which tends to the true x* as K grows (M^K -> 0).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_bilevel import DX, MU_X, client_matrices, closed_form, quad_problem, run, to64

FULL = dict(batch_size=None, independent_batches=False)


def truncated_itd_point(mats, beta: float, K: int) -> np.ndarray:
    n = len(mats)
    A, B, c, C, e = (sum(M[j] for M in mats) / n for j in range(5))
    Ai = np.linalg.inv(A)
    T = np.eye(len(A)) - np.linalg.matrix_power(np.eye(len(A)) - beta * A, K)
    return np.linalg.solve(MU_X * np.eye(DX) + B.T @ T @ Ai @ C @ Ai @ B, B.T @ T @ Ai @ (e - C @ Ai @ c))


def test_round_accounting():
    prob = quad_problem()
    sim = run(prob, "aggitd", 0, inner_rounds=3, **FULL)
    assert sim.algo.rounds_per_iteration == 3
    x0 = sim.server["x"].clone()
    moved = []
    for _ in range(6):
        y = sim.server["y"].clone()
        sim.step()
        moved.append((not torch.equal(sim.server["x"], x0), not torch.equal(sim.server["y"], y)))
        x0 = sim.server["x"].clone()
    assert [m[0] for m in moved] == [False, False, True] * 2     # x moves once per sub-loop of 3 rounds
    assert all(m[1] for m in moved)                               # y moves every round
    led = sim.ledger.per_round
    n, dy = prob.num_clients, 4
    assert [r["up_floats"] for r in led] == [n * 2 * dy, n * 2 * dy, n * (2 * dy + DX)] * 2
    assert all(r["down_floats"] == n * (DX + 2 * dy) for r in led)


def test_one_outer_iteration_matches_hand_computation():
    """N = 2 rounds with unequal local steps tau_i = [1, 3, 2] (client drift), by hand in numpy."""
    prob = quad_problem()
    mats = client_matrices(prob)
    taus, beta, alpha = [1, 3, 2], 0.07, 0.3
    sim = run(prob, "aggitd", 0, inner_lr=beta, outer_lr=alpha, inner_rounds=2, tau_clients=taus, **FULL)
    x, y = (sim.server[k].numpy().copy() for k in ("x", "y"))
    v = np.zeros_like(y)
    for n in range(2):
        ys, vs, hs = [], [], []
        for (A, B, c, C, e), tau in zip(mats, taus):
            yi, vi, h = y.copy(), v.copy(), np.zeros(DX)
            for _ in range(tau):
                h += MU_X * x + B.T @ vi        # grad_x f_i - grad2_xy g_i v, at the same point
                yi, vi = yi - beta * (A @ yi - B @ x - c), vi - beta * (A @ vi - (C @ yi - e))
            ys.append(yi), vs.append(vi), hs.append(h / tau)
        y, v = np.mean(ys, 0), np.mean(vs, 0)
    x = x - alpha * np.mean(hs, 0)
    for _ in range(2):
        sim.step()
    assert np.allclose(sim.server["y"].numpy(), y, atol=1e-13)
    assert np.allclose(sim.server["x"].numpy(), x, atol=1e-13)
    assert np.allclose(sim.server["v"].numpy(), 0.0)             # restarted for the next sub-loop


@pytest.mark.parametrize("N", [3, 30])
def test_reaches_the_truncated_itd_point(N):
    """tau = 1, full participation, exact oracles: x -> the closed form above (to 1e-10); that point differs
    from the true stationary point x* for a short sub-loop and approaches it for a long one."""
    prob = quad_problem()
    mats = client_matrices(prob, np.float32)   # the engine's float32 sample weights, so the closed form is exact
    beta = 0.3
    x_K = truncated_itd_point(mats, beta, N - 1)
    xs, _, _, grad = closed_form(mats, np.full(3, 1 / 3))
    outer = {3: 150, 30: 40}[N]
    sim = run(prob, "aggitd", N * outer, inner_lr=beta, outer_lr=0.4, inner_rounds=N, tau=1, **FULL)
    x = sim.server["x"].numpy()
    print(f"\nN = {N}: ||x - x_K|| = {np.linalg.norm(x - x_K):.2e}, ||x_K - x*|| = {np.linalg.norm(x_K - xs):.3e}, "
          f"||grad Phi(x)|| = {np.linalg.norm(grad(x)):.3e}")
    assert np.linalg.norm(x - x_K) < 1e-10
    if N == 3:
        assert np.linalg.norm(x_K - xs) > 1e-2     # truncation bias: the test can tell the two points apart
    else:
        assert np.linalg.norm(x_K - xs) < 1e-6 and np.linalg.norm(grad(x)) < 1e-6


def test_sequential_and_vectorized_agree():
    """Minibatches, independent batches, partial participation, unequal tau on an MLP hyper-representation."""
    from fedsolve.models import build_model_fn
    from fedsolve.families import get_problem_kind
    from fedsolve.problems import FederatedProblem
    from tests.conftest import make_data

    data = to64(make_data(m=5, d=5, classes=3, n_range=(10, 25)))
    base = FederatedProblem(data, lambda: build_model_fn("mlp", data.input_shape, 3, hidden=(6,))().double())
    prob = get_problem_kind("hyper_representation")(base, {"lam": 0.1}, 0)
    out = {}
    for ex in ("sequential", "vectorized"):
        sim = run(prob, "aggitd", 4, executor=ex, clients=3, batch_size=4, tau_clients=[1, 3, 2, 2, 1],
                  inner_lr=0.1, outer_lr=0.1)
        out[ex] = sim.server
    assert not torch.equal(out["vectorized"]["x"], run(prob, "aggitd", 0).server["x"])
    for k in ("x", "y", "v"):
        assert torch.allclose(out["sequential"][k], out["vectorized"][k], atol=1e-10), k


def test_bad_input_is_named():
    prob = quad_problem()
    from fedsolve.families import get_algorithm

    with pytest.raises(ValueError, match="tau_clients"):
        get_algorithm("aggitd")(dict(tau_clients=[1, 2]), prob)
    with pytest.raises(ValueError, match="inner_rounds"):
        get_algorithm("aggitd")(dict(inner_rounds=0), prob)
