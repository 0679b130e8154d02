"""The quadratic bilevel problem with a known answer (``families/bilevel/quadratic.py``, problem kind
``bilevel_quadratic``) on which the regime where ShroFBO must beat SimFBO is mapped (issue 47,
experiments/bilevel/regime_suite.yaml): its closed-form points, its heterogeneity knobs and its records.
"""

from __future__ import annotations

import pytest
import torch

from fedsolve.experiments.config import ConfigError, parse_config
from fedsolve.experiments.runner import build_problem
from fedsolve.families.bilevel.quadratic import (
    lower,
    quadratic_clients,
    reweighted_weights,
    stationary_point,
    upper,
)
from tests.test_bilevel import run

F64 = torch.float64
TAU = [1, 2, 3, 4]


def config(**params) -> dict:
    return {"name": "regime", "seeds": [0], "data": {"dataset": "breast_cancer", "num_clients": 4},
            "problem": {"kind": "bilevel_quadratic", "params": {"dx": 2, "dy": 3, **params}},
            "simulation": {"rounds": 2, "eval_every": 1, "sampling": {"clients_per_round": 4}},
            "algorithm": {"name": "simfbo", "params": {"batch_size": None}}}


def problem(**params):
    return build_problem(parse_config(config(**params)), 0)


def phi(clients: dict, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Phi_w(x) = sum_i w_i f_i(x, y*(x)), y*(x) the minimiser of sum_i w_i g_i(x, .) (a linear solve)."""
    A, B, c = (torch.einsum("i,i...->...", w, clients[k]) for k in "ABc")
    y = torch.linalg.solve(A, B @ x + c)
    return sum(w[i] * upper(i, x, y, {k: v[i] for k, v in clients.items()}) for i in range(w.numel()))


def test_stationary_point_zeroes_the_hypergradient_of_its_weights():
    """The closed form is where autograd's gradient of Phi_w vanishes, for the true and the reweighted weights."""
    clients = quadratic_clients(4, 2, 3, 1.0, 1.0, 0.5, seed=3)
    for w in (torch.full((4,), 0.25, dtype=F64), reweighted_weights(torch.tensor(TAU))):
        x = stationary_point(clients, w).requires_grad_(True)
        (g,) = torch.autograd.grad(phi(clients, w, x), x)
        assert float(g.norm()) < 1e-12
        x0 = torch.zeros(2, dtype=F64, requires_grad=True)
        assert float(torch.autograd.grad(phi(clients, w, x0), x0)[0].norm()) > 1e-2   # the check can fail


def test_the_knobs_move_only_their_level_and_zero_means_identical_clients():
    a = quadratic_clients(5, 2, 3, 0.0, 0.0, 0.5, seed=1)
    for k in "ABcd":
        assert torch.equal(a[k], a[k][:1].expand_as(a[k]))            # identical clients
    b = quadratic_clients(5, 2, 3, 1.0, 0.0, 0.5, seed=1)
    c = quadratic_clients(5, 2, 3, 0.0, 1.0, 0.5, seed=1)
    assert torch.equal(b["d"], a["d"]) and not torch.equal(b["A"], a["A"])   # lower_het moves A, B, c only
    assert torch.equal(c["A"], a["A"]) and not torch.equal(c["d"], a["d"])   # upper_het moves d only
    assert bool((torch.linalg.eigvalsh(b["A"]) > 0).all())                   # every g_i strongly convex


@pytest.mark.parametrize("lower_het, upper_het, tau, differ", [
    (0.0, 0.0, TAU, False),          # identical clients: any weights give one point
    (1.0, 1.0, [2, 2, 2, 2], False),  # equal tau_i: SimFBO's weights are p
    (1.0, 0.0, TAU, True),           # only the lower levels differ
    (0.0, 1.0, TAU, True),           # only the upper levels differ
])
def test_simfbo_reweighted_point_differs_from_x_star_only_when_clients_and_tau_differ(lower_het, upper_het, tau,
                                                                                    differ):
    clients = quadratic_clients(4, 2, 3, lower_het, upper_het, 0.5, seed=0)
    gap = float((stationary_point(clients, torch.full((4,), 0.25, dtype=F64))
                 - stationary_point(clients, reweighted_weights(torch.tensor(tau)))).norm())
    assert (gap > 1e-2) if differ else (gap < 1e-12)


def test_drift_free_limits_are_the_closed_form_points_and_the_records_say_so():
    """eta = 0 and persistent tau_i: ShroFBO lands on x* (Theorem 2), SimFBO on x~* (Theorem 1), to 1e-8; the
    evaluation records hold both distances."""
    prob = problem(tau=TAU, instance_seed=5)
    refs = prob.extras["bilevel"].functions.references
    gap = float((refs["true"] - refs["reweighted"]).norm())
    assert gap > 0.05
    steps = dict(eta_y=0.0, eta_v=0.0, eta_x=0.0, gamma_y=0.2, gamma_v=0.2, gamma_x=0.1, tau_clients=TAU,
                 batch_size=None)
    for name, want, other in (("shrofbo", "true", "reweighted"), ("simfbo", "reweighted", "true")):
        sim = run(prob, name, 150, **steps)
        x = sim.server["x"]
        assert float((x - refs[want]).norm()) < 1e-8, name
        assert float((x - refs[other]).norm()) == pytest.approx(gap, rel=1e-6), name
        rec = sim.algo.report(sim.server, sim.clients)
        assert rec["x_dist_" + want] < 1e-8 and rec["x_dist_" + other] == pytest.approx(gap, rel=1e-6)


@pytest.mark.parametrize("params, field", [
    ({"lower_het": 1.5}, "problem.params: lower_het"),
    ({"upper_het": -0.1}, "problem.params: upper_het"),
    ({"tau": [1, 2, 3]}, "problem.params.tau"),
    ({"tau": [0, 1, 2, 3]}, "problem.params.tau"),
    ({"dxx": 2}, "problem.params"),
])
def test_bad_parameters_get_one_line_naming_the_field(params, field):
    with pytest.raises(ConfigError) as e:
        problem(**params)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(field), msg


def test_a_reference_point_of_another_shape_is_refused():
    from fedsolve.families.bilevel import client_problem

    clients = quadratic_clients(2, 2, 3, 1.0, 1.0, 0.5, seed=0)
    z = lambda d: torch.zeros(d, dtype=F64)   # noqa: E731
    with pytest.raises(ValueError, match=r"references\['true'\]: allowed: a finite tensor of x0's shape \(2,\)"):
        client_problem(upper, lower, z(2), z(3), client_data=clients, references={"true": z(3)})
