"""Issue 45, constrained family: no silent wrong answer, no misleading message, no traceback.

A run's status follows its certificate; a quadratic declaration is checked; cProx-AL's arguments are checked;
float targets are not truncated to labels; every client's data and functions are validated; a feasible problem
that converges slowly is not called infeasible; the CLI gives one line (exit 2 for bad input, 3 for a run that
cannot converge) for a config with no problem section, partial participation and an infeasible constraint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families.constrained import ProxAL, cproxal, party_problem
from fedsolve.families.constrained.kind import qp_problem, rows_data
from fedsolve.families.constrained.problem import ConstraintError

B = torch.tensor([[1.0, -2.0, 0.5], [0.3, 1.0, -1.0]], dtype=torch.float64)
QUARTIC = dict(objective=lambda w, i, p: 0.25 * (w ** 4).sum() + (p.b * w).sum(), dim=3,
               constraint=lambda w, i, p: w[:1] - 1.0, num_constraints=1, kinds="eq", party_tensors={"b": B})
FULL = {"fraction": 1.0}


def _run(problem, params: dict, rounds: int):
    sim = Simulation(problem, ProxAL(params, problem), SimulationConfig(rounds=rounds, eval_every=rounds,
                                                                        sampling=FULL), seed=0)
    return sim.run()


def test_a_quartic_objective_declared_quadratic_is_refused():
    with pytest.raises(ConstraintError, match=r"^quadratic: the objective is declared quadratic .* client 0"):
        party_problem(quadratic=True, **QUARTIC)
    with pytest.raises(ConstraintError, match=r"^quadratic: the constraints must be affine .* client 0"):
        party_problem(lambda w, i, p: (w * w).sum(), 2, constraint=lambda w, i, p: (w * w).sum().reshape(1) - 1,
                      num_constraints=1, kinds="eq", num_clients=2, quadratic=True)


def test_the_status_follows_the_certificate():
    """The issue's case: a quartic f_i solved as if quadratic (the declaration slipped past validation) passes Eq. 11
    while its certificate says kkt_eps1 ~ 5.6: the status says so and does not say converged; the same problem
    solved by Newton converges, certified."""
    wrong = party_problem(**QUARTIC)
    wrong.extras["constraints"].quadratic = True   # behind validation's back
    params = {"beta": 10.0, "rho": 1.0, "s_bar": 0.1, "q": 0.5}
    cert = _run(wrong, params, 2000).extras["constrained"]
    assert cert["converged"] == 1 and cert["kkt_eps1"] > 1 and cert["certified"] == 0
    assert "converged (Eq. 11 passed)" not in cert["status"]
    assert "Eq. 11 passed, but the certificate misses its targets: kkt_eps1 = 5.56" in cert["status"]
    assert cert["status"].endswith("not converged")
    good = _run(party_problem(**QUARTIC), params, 3000).extras["constrained"]
    assert good["status"] == "converged (Eq. 11 passed)" and good["certified"] == 1 and good["kkt_eps1"] < 1e-3


@pytest.mark.parametrize("arg,value,msg", [("s_bar", -0.1, "s_bar: Input should be greater than 0"),
                                           ("beta", -1.0, "beta: Input should be greater than 0"),
                                           ("eps1", 2.0, "eps1: Input should be less than 1")])
def test_cproxal_checks_its_arguments(arg, value, msg):
    prob = qp_problem(4, 2, 1, seed=0)
    kw = {"beta": 10.0, "s_bar": 0.1, arg: value}
    with pytest.raises(ValueError, match=f"^cproxal: {msg}"):
        cproxal(prob.extras["constraints"], prob.data, torch.zeros(4, dtype=torch.float64), **kw)


def test_float_targets_are_refused_under_classification_and_kept_under_regression():
    rows = [(np.ones((3, 2)), np.array([0.0, 1.0, 1.0])), (np.ones((2, 2)), np.array([0.25, 1.5]))]
    with pytest.raises(ValueError, match=r"rows_data: client 1's train targets are not class labels \(e.g. 0.25\) "
                                         r"under task='classification'; pass task='regression'"):
        rows_data(rows)
    data = rows_data(rows, task="regression")
    assert data.train_y.dtype == torch.float64 and data.train_y[3:].tolist() == [0.25, 1.5]
    assert rows_data(rows[:1]).train_y.dtype == torch.long


def test_every_client_is_validated():
    """Client 0 is fine; the errors come from client 2's rows, client 1's constraint values, client 1's entry of a
    per-party tensor: each named."""
    rows = [(np.ones((3, 2)), np.zeros(3)) for _ in range(3)]
    rows[2] = (np.array([[1.0, np.nan], [0.0, 1.0]]), np.zeros(2))
    f = lambda w, i, p: (p.x @ w).pow(2).mean()   # noqa: E731
    with pytest.raises(ValueError, match=r"^rows_data: client 2's train features hold NaN or inf \(row 0 first\)"):
        party_problem(f, 2, data=rows_data(rows, task="regression"))   # refused where the rows come in
    ok = rows_data([(np.ones((3, 2)), np.zeros(3)), (np.ones((6, 2)), np.zeros(6))], task="regression")
    grow = lambda w, i, p: (p.x @ w)[: int(p.x.shape[0]) // 3]   # 1 value on 3 rows, 2 on client 1's 6  # noqa: E731
    with pytest.raises(ConstraintError, match=r"^constraint: expected shape \(1,\) .* got \(2,\) on client 1"):
        party_problem(f, 2, data=ok, constraint=grow, num_constraints=1)
    A = torch.ones(2, 3)
    A[1, 2] = float("inf")
    with pytest.raises(ConstraintError, match="^party_tensors.A: client 1's entry holds NaN or inf"):
        party_problem(lambda w, i, p: (p.A * w).sum(), 3, party_tensors={"A": A})


def test_a_feasible_equality_with_a_small_beta_is_not_called_infeasible():
    """w_0 = 1 with beta = 1e-3: the proximal point steps are tiny, so the multiplier step does not halve for
    hundreds of outer iterations (the former rule stopped it after 40), but w still moves as much as mu: the problem
    is feasible and the run goes on."""
    prob = party_problem(lambda w, i, p: 0.5 * (w * w).sum(), 2, constraint=lambda w, i, p: w[:1] - 1.0,
                         num_constraints=1, kinds="eq", num_clients=1, quadratic=True)
    algo = ProxAL({"beta": 1e-3, "rho": 500.0, "s_bar": 1e-3, "q": 0.1, "max_outer": 10 ** 5}, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=2500, eval_every=10 ** 6, sampling=FULL), seed=0)
    steps = []
    for t in range(2500):
        k = int(sim.server["k"])
        sim.run_round(t)
        if int(sim.server["k"]) == k and algo.phases.current(sim.server) == "inner" and k > 0 and \
                float(sim.server["dmu"]) not in steps[-1:]:
            steps.append(float(sim.server["dmu"]))
    assert int(sim.server["k"]) > 120
    assert min(steps[:80]) > 0.5 * steps[0]   # no halving in 80 outer iterations: the former rule's "infeasible"


def _cli(tmp_path, yaml_text: str, capsys, *first: str) -> tuple[int, str]:
    from fedsolve.cli import main as cli

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml_text)
    rc = cli([*first, "run", str(cfg), "--out", str(tmp_path / "out"), "--quiet"])
    return rc, capsys.readouterr().err


BASE = """name: c
seeds: [0]
data: {dataset: breast_cancer, num_clients: 4}
simulation: {rounds: 300, eval_every: 300, sampling: {fraction: FRACTION}, metrics: []}
algorithm: {name: proxal, params: {beta: 10.0, s_bar: 0.1, rho: 1.0, q: 0.3, infeasible_patience: 6}}
"""


def test_cli_a_config_without_a_problem_section_is_one_line(tmp_path, capsys):
    rc, err = _cli(tmp_path, BASE.replace("FRACTION", "1.0"), capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("config error: problem: proxal solves constrained problems")


def test_cli_partial_participation_is_one_line(tmp_path, capsys):
    text = BASE.replace("FRACTION", "0.5") + "problem: {kind: constrained_qp, params: {d: 4, m: 1}}\n"
    rc, err = _cli(tmp_path, text, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("config error: simulation.sampling: Algorithms 1-2 use every client in every round, got 2 "
                          "of 4 clients a round")


def test_cli_an_infeasible_run_is_one_line(tmp_path, capsys):
    """A constraint no point meets (the smallest class-1 loss of these rows is 0.43 > r = 0.3): the run stops with
    one line naming the client and its constraint, exit 3 (the run cannot converge)."""
    plugin = tmp_path / "infeasible_kind.py"
    plugin.write_text(
        "import numpy as np\n"
        "from fedsolve.families.constrained.kind import np_problem\n"
        "from fedsolve.problems import register_problem_kind\n\n\n"
        "@register_problem_kind('test_infeasible_np')\n"
        "def build(problem, params, seed):\n"
        "    rng = np.random.default_rng(0)\n"
        "    y = (rng.random(60) < 0.4).astype(np.int64)\n"
        "    x = rng.normal(size=(60, 3)) + 0.9 * y[:, None] * np.linspace(1, 0.3, 3)\n"
        "    return np_problem(x, y, 1, r=0.3)\n")
    text = BASE.replace("FRACTION", "1.0").replace("num_clients: 4", "num_clients: 1").replace(
        "rounds: 300, eval_every: 300", "rounds: 400, eval_every: 400") + "problem: {kind: test_infeasible_np}\n"
    rc, err = _cli(tmp_path, text, capsys, "--import", str(plugin))
    assert rc == 3 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "client 0's constraint ['class-1 loss - r'] looks infeasible" in err
