"""Partially personalized problems stated per client in plain torch (``client_partial_problem``, issue 46): the
example script reaches the closed-form optimum computed here, the same numbers under both executors, and every
client's function and data checked when the problem is built, in one line naming what is wrong."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.personalized import client_partial_problem

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "personalized_quadratic.py"


def optimum(data, lam):
    """``argmin_{u, v_1..v_m} sum_i 1/2 ||A_i u + B_i v_i - b_i||^2 + lam/2 (||u||^2 + ||v_i||^2)``: one linear
    solve of the normal equations in ``(u, v_1, ..., v_m)``."""
    p, q, m = data[0]["A"].shape[1], data[0]["B"].shape[1], len(data)
    D = p + m * q
    H, r = torch.zeros(D, D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for i, d in enumerate(data):
        A, B, b = d["A"], d["B"], d["b"]
        s = slice(p + i * q, p + (i + 1) * q)
        H[:p, :p] += A.T @ A + lam * torch.eye(p, dtype=torch.float64)
        H[:p, s] += A.T @ B
        H[s, :p] += B.T @ A
        H[s, s] += B.T @ B + lam * torch.eye(q, dtype=torch.float64)
        r[:p] += A.T @ b
        r[s] += B.T @ b
    z = torch.linalg.solve(H, r)
    return z[:p], z[p:].reshape(m, q)


def test_the_example_reaches_the_closed_form_optimum(capsys):
    assert len(EXAMPLE.read_text().splitlines()) <= 40
    ns = runpy.run_path(str(EXAMPLE))
    assert "mean f_i =" in capsys.readouterr().out
    u, v = optimum(ns["data"], ns["lam"])
    torch.testing.assert_close(ns["u"], u, rtol=0, atol=1e-7)
    torch.testing.assert_close(ns["v"], v, rtol=0, atol=1e-7)
    # the scored models are each client's (u_i, v_i); the problem splits a flat row into them
    su, sv = ns["problem"].blocks_of(ns["sim"].eval_params()[2])
    torch.testing.assert_close(sv, ns["v"][2])
    torch.testing.assert_close(su, ns["result"].clients["u"][2])


def quadratic(m=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"A": torch.randn(5, 3, generator=g), "B": torch.randn(5, 2, generator=g), "b": torch.randn(5, generator=g)}
            for _ in range(m)]


def loss(i, u, v, d):
    r = d["A"] @ u + d["B"] @ v - d["b"]
    return 0.5 * r @ r


@pytest.mark.parametrize("name", ["fedapm", "fedalt", "fedsim"])
def test_sequential_equals_vectorized(name):
    problem = client_partial_problem(loss, torch.zeros(3), torch.zeros(2), quadratic())
    out = []
    for ex in ("sequential", "vectorized"):
        algo = get_algorithm(name)({"lr": 0.05, "local_steps": 4, "batch_size": None}, problem)
        sim = Simulation(problem, algo, SimulationConfig(rounds=3, eval_every=3, executor=ex), seed=0)
        out.append((sim.run(), sim))
    (ra, a), (rb, b) = out
    for k in a.clients:
        torch.testing.assert_close(a.clients[k], b.clients[k], rtol=1e-5, atol=1e-6)
    assert ra.history[-1]["test_loss"] == pytest.approx(rb.history[-1]["test_loss"], rel=1e-5)
    assert ra.history[-1]["test_loss"] < ra.history[0]["test_loss"]


def _refused(match, f=loss, u0=None, v0=None, data="default", **kw):
    data = quadratic() if isinstance(data, str) else data
    u0 = torch.zeros(3) if u0 is None else u0
    v0 = torch.zeros(2) if v0 is None else v0
    with pytest.raises(ValueError, match=match) as e:
        client_partial_problem(f, u0, v0, data, **kw)
    assert "\n" not in str(e.value)


def test_every_clients_data_is_checked():
    data = quadratic()
    data[2]["A"][1, 1] = float("nan")
    _refused(r"^data\[2\]\['A'\]: holds NaN/inf values; allowed: finite values only$", data=data)
    data = quadratic()
    data[1]["B"] = torch.zeros(4, 2)
    _refused(r"^data\[1\]\['B'\]: shape \(4, 2\) float32 but client 0's is \(5, 2\) float32", data=data)
    data = quadratic()
    data[2] = {"A": data[2]["A"], "b": data[2]["b"]}
    _refused(r"^data\[2\]: not structured as client 0's entry", data=data)
    _refused(r"^data\[0\]\['A'\]: float32 but the start points are float64", u0=torch.zeros(3).double(),
             v0=torch.zeros(2).double())
    _refused(r"^data: expected a list with one entry per client", data=torch.zeros(3, 5))
    _refused(r"^num_clients: 4 but data lists 3 clients", num_clients=4)


def test_the_function_is_checked_on_every_client():
    _refused(r"^f: client 0 gives Tensor \(2,\); allowed: a real float scalar$", f=lambda i, u, v, d: v)
    _refused(r"^f: client 2 gives (nan|inf) at the start point",
             f=lambda i, u, v, d: loss(i, u, v, d) / (2 - i).float().clamp_max(1).clamp_min(0))
    _refused(r"^f: fails on client 0 at the start point \(RuntimeError", f=lambda i, u, v, d: d["A"] @ v)
    _refused(r"^u0: holds NaN/inf values", u0=torch.tensor([0.0, float("inf"), 0.0]))
    _refused(r"^v0: float64 but u0 is float32", v0=torch.zeros(2).double())


def test_a_function_that_runs_one_client_at_a_time_only_is_refused():
    """Python control flow on the index, or a tensor indexed by it (a client's tensors belong in its data entry),
    runs client by client but not for all clients at once: refused when the problem is built, naming why."""
    A = torch.randn(3, 5, 3)
    _refused(r"^f: it does not run for all clients at once .*allowed: tensor operations on u, v and d",
             f=lambda i, u, v, d: loss(i, u, v, d) * (2.0 if int(i) == 0 else 1.0))
    _refused(r"^f: it does not run for all clients at once", f=lambda i, u, v, d: (A[i] @ u).sum() + v.sum())


def test_no_data_gives_the_index_alone():
    problem = client_partial_problem(lambda i, u, v, d: ((u - i.to(u.dtype)) ** 2).sum() + (v * v).sum(),
                                     torch.zeros(2), torch.zeros(1), num_clients=4)
    assert problem.num_clients == 4
    with pytest.raises(ValueError, match=r"^num_clients: expected a positive integer when no data is given"):
        client_partial_problem(loss, torch.zeros(3), torch.zeros(2))


def test_a_data_problem_with_nan_is_refused_naming_the_client():
    """Issue 45: the engine's NaN message says the data were checked finite; before every run on data (a FedAPM run
    on a model and its clients' rows) they are, on every client and both splits."""
    import numpy as np

    from fedsolve.data.federated import FederatedData
    from fedsolve.models import MLP
    from fedsolve.problems import FederatedProblem

    g = np.random.default_rng(0)
    clients = [(g.normal(size=(6, 4)).astype("float32"), g.integers(0, 2, size=6)) for _ in range(3)]
    test = [(x.copy(), y) for x, y in clients]
    test[2][0][4, 1] = np.inf
    problem = FederatedProblem(FederatedData.from_client_arrays(clients, test, num_classes=2), lambda: MLP(4, 2),
                               blocks={"personal": ["out.*"]})
    with pytest.raises(ValueError, match=r"^data: client 2's test features hold NaN or inf \(its row 4\); allowed: "
                                         r"finite values only$"):
        Simulation(problem, get_algorithm("fedapm")({}, problem), SimulationConfig(rounds=1), seed=0)
    clients[1][0][0, 0] = np.nan
    problem = FederatedProblem(FederatedData.from_client_arrays(clients, clients, num_classes=2), lambda: MLP(4, 2))
    with pytest.raises(ValueError, match=r"^data: client 1's training features hold NaN or inf \(its row 0\)"):
        problem.check_finite()


def test_nan_in_a_clients_file_rows_is_one_line_from_the_cli(tmp_path, capsys):
    import numpy as np
    import yaml

    from fedsolve.cli import main

    g = np.random.default_rng(0)
    x, y = g.normal(size=(60, 5)).astype("float32"), g.integers(0, 2, size=60)
    x[37, 2] = np.nan
    np.savez(tmp_path / "rows.npz", x=x, y=y)
    cfg = {"name": "nan_rows", "seeds": [0], "data": {"dataset": "npz", "params": {"path": str(tmp_path / "rows.npz")}},
           "model": {"name": "mlp", "params": {"hidden": [4]}, "personalization": "output"},
           "simulation": {"rounds": 1}, "algorithm": {"name": "fedapm"}}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["run", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"data: client \d+'s (training|test) features hold NaN or inf", err[0]), err
    assert "model.blocks" not in err[0]
