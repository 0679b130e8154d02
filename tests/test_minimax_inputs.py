"""Bad input to the minimax family (issue 45): one line naming the field, exit code 2 from the CLI, never a
traceback or a silent acceptance; and a divergence guard that fits a saddle objective."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

from fedsolve.cli import main
from fedsolve.data.domains import domain_split, toy_domains
from fedsolve.engine import DivergenceError, Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.minimax import adversarial_problem, quadratic_saddle_problem
from fedsolve.families.minimax.common import MinimaxAlgorithm

torch.set_num_threads(1)
NET = dict(features="mlp", feature_dim=8, hidden=[8], domain_hidden=8)
PROBLEM = "problem: {kind: domain_adaptation, params: {features: mlp, feature_dim: 8, hidden: [8], domain_hidden: 8}}"

#: a user's own pair of domains, built with domain_split, with a fault chosen by a parameter
DOMAINS = textwrap.dedent('''\
    import numpy as np
    from fedsolve.data.domains import domain_split

    def pair(seed=0, nan_in=None, size=8, label=None):
        rng = np.random.default_rng(seed)
        xs, xe = rng.random((40, 3, 8, 8), dtype=np.float32), rng.random((20, 3, 8, 8), dtype=np.float32)
        xt = rng.random((40, 3, size, size), dtype=np.float32)
        if nan_in is not None:
            {"source": xs, "target": xt, "target_test": xe}[nan_in][-1, 0, 0, 0] = np.nan
        ys, yt, ye = (rng.integers(0, 10, n) for n in (40, 40, 20))
        if label:
            ys[3] = label
        return domain_split((xs, ys), (xt, yt), (xe, ye), num_classes=10, seed=seed)
''')


def _cli(tmp_path, monkeypatch, capsys, config: str, *sets: str) -> tuple[int, str]:
    (tmp_path / "faulty_domains.py").write_text(DOMAINS)
    (tmp_path / "run.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "faulty_domains", raising=False)   # this folder's module, not another test's
    rc = main(["run", "run.yaml", "--out", str(tmp_path / "out"), "--quiet", *[f"--set={s}" for s in sets]])
    err = capsys.readouterr().err.strip()
    return rc, err


OWN = f"""\
name: own
data: {{target: "faulty_domains:pair", num_clients: 2}}
{PROBLEM}
simulation: {{rounds: 1}}
algorithm: {{name: fedmm, params: {{batch_size: 8, local_steps: 2}}}}
"""


@pytest.mark.parametrize("fault,words", [
    ("data.params.nan_in=target_test", "target_test: 1 sample(s) hold NaN/inf values (row 19 first); allowed: "
                                       "finite values only"),
    ("data.params.nan_in=source", "source: 1 sample(s) hold NaN/inf values"),
    ("data.params.size=16", "target: samples of shape (3, 16, 16) but source's are (3, 8, 8); allowed: one shape"),
    ("data.params.label=10", "source: label 10 outside the 10 classes; allowed: integer labels 0 to 9"),
])
def test_a_bad_pair_of_domains_is_one_line_naming_the_domain(tmp_path, monkeypatch, capsys, fault, words):
    """NaN in any domain's images (the target test images were accepted and 14% accuracy reported), images of
    different sizes, labels beyond the classes: exit 2 and one line that names the domain."""
    rc, err = _cli(tmp_path, monkeypatch, capsys, OWN, fault)
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("config error: data.target: faulty_domains:pair(") and words in err, err


def test_the_same_pair_without_a_fault_runs(tmp_path, monkeypatch, capsys):
    rc, err = _cli(tmp_path, monkeypatch, capsys, OWN)
    assert rc == 0, err


def test_a_config_with_no_problem_section_is_one_line(tmp_path, monkeypatch, capsys):
    config = OWN.replace(PROBLEM + "\n", "").replace('{target: "faulty_domains:pair", num_clients: 2}',
                                                     "{dataset: toy_domains, num_clients: 2, params: {n: 30}}")
    assert "problem:" not in config
    rc, err = _cli(tmp_path, monkeypatch, capsys, config)
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("config error: problem: the minimax solvers need a minimax problem; allowed: problem: "
                          "{kind: domain_adaptation}"), err


def test_every_clients_data_is_checked_finite():
    """Domain data built without domain_split: a NaN in client 1's target test images (client 0's are clean) is
    refused naming the field, the client and the row."""
    data = toy_domains(num_clients=3, source_clients=1, n=30, n_test=12)
    data.test_x[int(data.test_offsets[1]) + 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^data.test_x \(target test images\): client 1 holds NaN/inf values \(1 "
                                         r"row\(s\) in all, its row 2 first\); allowed: finite values only$"):
        adversarial_problem(data, "dann", **NET)
    data = toy_domains(num_clients=2, n=30, n_test=12)
    data.train_x[-1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^data.train_x \(source and target training images\): client 1"):
        adversarial_problem(data, "dann", **NET)


def test_domain_split_checks_every_pair_in_python():
    rng = np.random.default_rng(0)
    x, y = rng.random((10, 2)), rng.integers(0, 3, 10)
    with pytest.raises(ValueError, match=r"^target: x of shape \(10, 2\) and y of shape \(9,\)"):
        domain_split((x, y), (x, y[:9]), (x, y), 3)
    with pytest.raises(ValueError, match=r"^target_test: labels of type float64 outside the 3 classes"):
        domain_split((x, y), (x, y), (x, y.astype(float)), 3)
    with pytest.raises(ValueError, match="^num_classes: expected a positive integer"):
        domain_split((x, y), (x, y), (x, y), 0)


# ------------------------------------------------------------------ the divergence guard
class TrainLossWatched(get_algorithm("fedsgda")):
    """FedSGDA as it was guarded before: by the train loss (not registered)."""

    watch = "train_loss"


def _zero_start_run(algo_cls):
    """FedSGDA on a quadratic saddle problem from its default start x = y = 0, where every f_i is 0."""
    eye, one = torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    problem = quadratic_saddle_problem([eye, 2 * eye], [eye, -eye], [eye, eye], a=[one, -3 * one], c=[one, one])
    algo = algo_cls({"lr": 0.2, "lr_psi": 0.2, "batch_size": None}, problem)
    return problem, Simulation(problem, algo, SimulationConfig(rounds=200, eval_every=50), seed=0).run()


def test_fedsgda_from_a_zero_start_is_not_stopped_by_its_saddle_value():
    """From x = y = 0 the saddle value f is 0, so a guard on the train loss stopped FedSGDA in its second round
    ("train loss ... exploded (> 10000 x first loss 1e-08)"); the minimax solvers watch the server model w
    instead, and FedSGDA goes on to the saddle point."""
    assert issubclass(get_algorithm("fedsgda"), MinimaxAlgorithm) and get_algorithm("fedsgda").watch == "w"
    with pytest.raises(DivergenceError, match="exploded"):
        _zero_start_run(TrainLossWatched)
    problem, res = _zero_start_run(get_algorithm("fedsgda"))
    # mean A = 1.5 I, mean B = 0, mean C = I, mean a = -1, mean c = 1: x = -mean a / 1.5, y = -mean c
    x, y = problem.players(res.server["w"])
    torch.testing.assert_close(x, torch.full((2,), 2 / 3, dtype=torch.float64), rtol=0, atol=1e-10)
    torch.testing.assert_close(y, torch.full((2,), -1.0, dtype=torch.float64), rtol=0, atol=1e-10)


def test_a_runaway_model_is_stopped_by_the_watched_iterate():
    data = toy_domains(num_clients=2, n=40, n_test=10)
    problem = adversarial_problem(data, "dann", 1.0, **NET)
    algo = get_algorithm("fedsgda")({"lr": 1e6, "lr_psi": 1e6, "batch_size": 8}, problem)
    with pytest.raises(DivergenceError, match="iterate 'w' diverged|non-finite"):
        Simulation(problem, algo, SimulationConfig(rounds=20, eval_every=20), seed=0).run()
