"""Issue 46, constrained family: problems stated party by party in plain torch. examples/constrained_qp.py (an
equality-constrained QP with per-party matrices, at most 40 lines) lands on the KKT point computed here with NumPy,
w and every multiplier; per-party functions that read the client's index and its own tensors solve a problem whose
optimum is known in closed form; bad shapes are one line naming the field."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families.constrained import ProxAL, cproxal, party_problem, quadratic_problem
from fedsolve.families.constrained.problem import ConstraintError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "constrained_qp.py"


def test_the_example_qp_lands_on_the_kkt_point_with_its_multipliers(capsys):
    assert len(EXAMPLE.read_text().splitlines()) <= 40
    ns = runpy.run_path(str(EXAMPLE))
    assert "converged (Eq. 11 passed)" in capsys.readouterr().out
    A, b, C, e, C0, e0 = (ns[k].numpy() for k in ("A", "b", "C", "e", "C0", "e0"))
    n, m, d = C.shape
    Call, eall = np.concatenate([C0, C.reshape(-1, d)]), np.concatenate([e0, e.reshape(-1)])   # server first
    k = Call.shape[0]
    K = np.block([[A.sum(0), Call.T], [Call, np.zeros((k, k))]])
    sol = np.linalg.solve(K, np.concatenate([-b.sum(0), -eall]))   # grad f + C^T nu = 0, C w + e = 0
    w_star, nu = sol[:d], sol[d:]
    assert np.abs(ns["w"].numpy() - w_star).max() < 1e-5
    # the AL multipliers are the KKT multipliers of f + sum_i <mu_i, C_i w + e_i>: the server's, then each client's
    assert np.abs(ns["mu_server"].numpy() - nu[:m]).max() < 1e-4 * max(1, np.abs(nu).max())
    assert np.abs(ns["mu_clients"].numpy().reshape(-1) - nu[m:]).max() < 1e-4 * max(1, np.abs(nu).max())
    cert = ns["result"].extras["constrained"]
    assert cert["certified"] == 1 and cert["kkt_eps1"] <= 1e-6 and cert["kkt_eps2"] <= 1e-6
    assert len(cert["w"]) == d and cert["mu_server"] == pytest.approx(ns["mu_server"].tolist())


def test_per_party_functions_with_index_and_own_tensors():
    """f_i(w) = (i + 1)/2 ||w - t_i||^2 (the client's index and its own target t_i), c_i(w) = ||w||^2 - r_i <= 0 with
    its own radius: the optimum is the weighted mean of the t_i projected on the smallest ball, only that client's
    multiplier is positive, mu_j = sum_i (i+1) (|t_bar| / sqrt(r_j) - 1) / 2 (stationarity along w). Prox-AL FL
    (Newton solves) and cProx-AL reach it."""
    t = torch.tensor([[3.0, 1.0], [2.0, 2.0], [4.0, 0.0]], dtype=torch.float64)
    r = torch.tensor([[9.0], [2.0], [5.0]], dtype=torch.float64)
    problem = party_problem(lambda w, i, p: 0.5 * (i + 1).to(w.dtype) * (w - p.t).pow(2).sum(), 2,
                            constraint=lambda w, i, p: (w * w).sum().reshape(1) - p.r, num_constraints=1,
                            names=("||w||^2 - r_i",), party_tensors={"t": t, "r": r})
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    tbar = (weights[:, None] * t).sum(0) / weights.sum()
    w_star = tbar / tbar.norm() * 2 ** 0.5
    mu_star = weights.sum() * (float(tbar.norm()) / 2 ** 0.5 - 1) / 2
    params = {"beta": 10.0, "rho": 1.0, "s_bar": 1e-4, "q": 0.5, "eps1": 1e-6, "eps2": 1e-6, "eps_floor": 1e-12}
    res = Simulation(problem, ProxAL(params, problem), SimulationConfig(rounds=4000, eval_every=4000,
                                                                        sampling={"fraction": 1.0}), seed=0).run()
    assert res.extras["constrained"]["status"] == "converged (Eq. 11 passed)"
    torch.testing.assert_close(res.server["w"], w_star, atol=1e-5, rtol=0)
    torch.testing.assert_close(res.clients["mu"].reshape(-1), torch.tensor([0.0, float(mu_star), 0.0],
                                                                          dtype=torch.float64), atol=1e-4, rtol=0)
    ref = cproxal(problem.extras["constraints"], problem.data, res.server["w0"], beta=10.0, s_bar=1e-4, eps1=1e-6,
                  eps2=1e-6)
    assert ref.status == "converged (Eq. 11 passed)"
    torch.testing.assert_close(ref.w, w_star, atol=1e-5, rtol=0)


def test_bad_matrices_and_functions_are_one_line_naming_the_field():
    A, b = torch.eye(3).expand(2, 3, 3), torch.zeros(2, 3)
    with pytest.raises(ConstraintError, match=r"^b: expected \[n, d\] = \[2, 3\], got \[2, 4\]$"):
        quadratic_problem(A, torch.zeros(2, 4))
    with pytest.raises(ConstraintError, match=r"^C: expected \[n, m, d\] = \[2, 1, 3\], got \[3, 1, 3\]$"):
        quadratic_problem(A, b, torch.zeros(3, 1, 3), torch.zeros(3, 1))
    with pytest.raises(ConstraintError, match=r"^C0, e0: give both"):
        quadratic_problem(A, b, C0=torch.zeros(1, 3))
    with pytest.raises(ConstraintError, match=r"^num_clients: the clients disagree"):
        party_problem(lambda w, i, p: (p.t * w).sum(), 3, party_tensors={"t": torch.zeros(2, 3)}, num_clients=3)
    with pytest.raises(ConstraintError, match=r"^objective: expected shape \(\) \(scalar\), got \(3,\) on client 0$"):
        party_problem(lambda w, i, p: p.t * w, 3, party_tensors={"t": torch.zeros(2, 3)})


def test_the_docs_opening_script_solves_its_problem(capsys):
    """docs/constrained.md opens with a script of per-party functions: run as written, it prints a converged status
    and lands on the closed-form answer (the problem of the test above)."""
    import re

    text = (ROOT / "docs" / "constrained.md").read_text()
    start = text.index("## A constrained problem of your own")
    code = re.search(r"^```python\n(.*?)^```", text[start:], flags=re.S | re.M).group(1)
    ns: dict = {}
    exec(compile(code, "docs/constrained.md", "exec"), ns)
    assert "converged (Eq. 11 passed)" in capsys.readouterr().out
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    tbar = (weights[:, None] * ns["t"]).sum(0) / weights.sum()
    torch.testing.assert_close(ns["result"].server["w"], tbar / tbar.norm() * 2 ** 0.5, atol=1e-5, rtol=0)
    mu = ns["result"].clients["mu"].reshape(-1)
    assert float(mu[1]) > 1 and float(mu[0]) == float(mu[2]) == 0.0
