"""Prox-AL FL under the Flower adapter (in-process grid): the same numbers as the simulation, and the
clients' multipliers / ADMM duals only on the nodes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr", reason="needs the flower extra: pip install -e '.[flower]' (flwr==1.42.0)")

from test_flower_adapter import _run  # noqa: E402  (the in-memory grid of the adapter tests)

from fedsolve.flower.replay import simulate_with_participation  # noqa: E402

pytestmark = [pytest.mark.flower]

EXPERIMENT = """\
name: constrained_flower
seeds: [0]
data: {dataset: breast_cancer, num_clients: 3}
problem: {kind: constrained_qp, params: {d: 5, m: 1, instance_seed: 3}}
simulation: {rounds: ROUNDS, eval_every: EVERY, sampling: {fraction: 1.0}, executor: sequential, metrics: []}
algorithm: {name: proxal, params: {beta: 10.0, s_bar: 1.0, rho: 1.0, q: 0.5}}
"""


#: Newton-solved subproblems: fairness (Eq. 32, nonconvex) on the offline Adult stand-in
FAIRNESS = """\
name: constrained_flower_fairness
seeds: [0]
data: {dataset: breast_cancer, num_clients: 3}
problem: {kind: fairness, params: {dataset: adult_synthetic, r: 0.05, limit: 300, server_limit: 100}}
simulation: {rounds: ROUNDS, eval_every: EVERY, sampling: {fraction: 1.0}, executor: sequential, metrics: []}
algorithm: {name: proxal, params: {beta: 50.0, s_bar: 0.01, rho: 1.0}}
"""


def _both(tmp_path, rounds: int, every: int, experiment: str = EXPERIMENT, rel: float = 0.0):
    """The experiment through the in-memory Flower grid and in the simulation: (Flower history, its server run,
    the grid, the simulation's result, the simulation). ``rel``: the logged numbers' relative tolerance (0: the
    same bits; a node scores its model alone, the simulation all clients' under vmap, whose products may round
    the last bit differently)."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(experiment.replace("ROUNDS", str(rounds)).replace("EVERY", str(every)))
    rc = {"experiment": str(exp), "wait-for-nodes": 5.0, "round-timeout": 5.0, "eval-timeout": 5.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    for d, s in zip(hist, res.history):
        keys = (set(d) & set(s)) - {"time_s", "eval_clients"}
        assert {k: d[k] for k in keys} == ({k: s[k] for k in keys} if rel == 0 else
                                           {k: pytest.approx(s[k], rel=rel, abs=0) for k in keys})
    return hist, run, grid, res, sim


def _same_states(run, grid, res, sim):
    """The server's protocol state and every node's multipliers and ADMM rows: the simulation's, bit for bit."""
    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record

    for k, v in res.server.items():
        assert (run.server[k] == v).all(), k
    for node, ctx in grid.ctx.items():
        rows = from_array_record(ctx.state[STATE])
        for k in ("mu", "lam", "u", "ut"):
            assert (rows[k] == sim.clients[k][node - 100]).all(), k


def test_proxal_same_numbers_under_flower(tmp_path):
    hist, run, grid, res, sim = _both(tmp_path, 30, 15)
    assert [r["round"] for r in hist] == [r["round"] for r in res.history] == [0, 15, 30]
    # the certificates need every party's data and multipliers: the simulation logs them, a deployment's
    # server cannot; the protocol state (w^k, mu_0, counters, floats) is the same bit for bit
    assert res.history[-1]["admm_rounds"] > 0 and res.history[-1]["outer_iterations"] >= 1
    assert set(run.server) == set(res.server)
    _same_states(run, grid, res, sim)


def test_proxal_with_newton_solves_same_numbers_under_flower(tmp_path, monkeypatch):
    """The Newton-solved path (a fairness problem, whose subproblems go indefinite: the modified step's shift is
    taken) gives the simulation's numbers on the Flower nodes too: the server's and the nodes' states bit for bit,
    the logged test loss to the last bit of the scoring (1 ulp apart)."""
    from test_constrained import record_shifts

    shifted = record_shifts(monkeypatch)
    hist, run, grid, res, sim = _both(tmp_path, 40, 20, FAIRNESS, rel=1e-14)
    assert any(shifted)
    assert res.history[-1]["admm_rounds"] > 0
    _same_states(run, grid, res, sim)


def test_a_flower_run_ends_where_the_simulation_does_once_eq11_passes(tmp_path):
    """With a budget beyond Eq. 11 (passed after 499 rounds here) the Flower server stops at the same round as
    the simulation, with the same final evaluation and state, bit for bit: every product of the quadratic path is
    computed row by row (``subproblem.mv`` and ``sym_pair_apply``: one BLAS call per row), so a node's one row
    and the simulation's three stacked rows round alike. (With torch's batched product the simulation's rows
    rounded the last bit differently from a node's on an AVX-512 CPU: the uploads first differed at round 32.)"""
    hist, run, grid, res, sim = _both(tmp_path, 800, 400)
    assert [r["round"] for r in hist] == [r["round"] for r in res.history] == [0, 400, 499]
    assert int(res.server["converged"]) == 1 and sim.round == 499
    _same_states(run, grid, res, sim)
