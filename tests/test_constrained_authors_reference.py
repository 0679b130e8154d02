"""The authors' method on Table 4's QP (benchmarks/authors_lcqp.py), the reference that
benchmarks/constrained_table4_speed.py times Prox-AL FL against: on a small Table 4 instance it reaches the KKT
point Prox-AL FL reaches (with the paper's parties it takes the very same iterates and rounds; as the authors'
code is written, other iterates to the same w*, the server's multiplier at half the KKT one), so the timing
compares like with like; and the benchmark prints a ratio per instance and the median."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.constrained.kind import qp_problem

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
TUNED = {"beta": 30.0, "rho": 4.0, "s_bar": 0.1, "eps1": 1e-4, "eps2": 1e-4, "q": 0.9}   # Table 4 at 1e-4


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


AUTHORS = _load("authors_lcqp")


def _kkt(inst: dict) -> tuple[np.ndarray, np.ndarray]:
    """w* and the multipliers nu of Eq. 86 ((n+1) x m, the server's first): ``A w + b + C^T nu = 0, C w + d = 0``."""
    A, b = inst["A"].sum(0), inst["b"].sum(0)
    C, dd = inst["C"].reshape(-1, A.shape[0]), inst["d"].reshape(-1)
    k = C.shape[0]
    sol = np.linalg.solve(np.block([[A, C.T], [C, np.zeros((k, k))]]), np.concatenate([-b, -dd]))
    return sol[: A.shape[0]], sol[A.shape[0]:].reshape(inst["d"].shape)


@pytest.fixture(scope="module")
def small():
    """Table 4's smallest d at n = 5 (d = 100, m~ = 1), Prox-AL FL run to Eq. 11 in the engine."""
    prob = qp_problem(100, 5, 1, seed=10)
    algo = get_algorithm("proxal")({**TUNED, "inner_stop": "measured", "solver": "quadratic", "max_outer": 10000,
                                    "max_inner": 10000}, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=5000, eval_every=10 ** 9, executor="vectorized", metrics=[],
                                                  sampling={"fraction": 1.0}), seed=0)
    t = 0
    while not algo.phases.finished(sim.server):
        sim.run_round(t)
        t += 1
    server, clients = sim.state()
    mu = np.concatenate([server["mu0"].numpy()[None], clients["mu"].numpy()])
    inst = prob.extras["qp_instance"]
    return inst, server["w0"].numpy(), server, mu, _kkt(inst)


def _run(small, **kw) -> dict:
    inst, w0 = small[0], small[1]
    return AUTHORS.authors_proxal(inst, w0, **TUNED, inner_stop="code", **kw)


def test_with_the_papers_parties_it_takes_prox_al_fls_iterates_to_the_kkt_point(small):
    _, _, server, mu, (w_star, nu) = small
    assert int(server["converged"]) == 1
    out = _run(small)
    assert out["converged"]
    assert (out["outer"], out["admm_rounds"]) == (int(server["k"]), int(server["admm_rounds"])) == (32, 321)
    assert np.abs(out["w"] - server["w"].numpy()).max() < 1e-12       # the same iterates, up to rounding
    assert np.abs(out["mu"] - mu).max() < 1e-10
    assert np.linalg.norm(out["w"] - w_star) / np.linalg.norm(w_star) < 1e-5
    assert np.abs(out["mu"] - nu).max() < 1e-4 * np.abs(nu).max()


def test_cached_factors_take_the_same_iterates(small):
    lu, cached = _run(small), _run(small, solve="cached")
    assert (cached["outer"], cached["admm_rounds"]) == (lu["outer"], lu["admm_rounds"])
    assert np.abs(cached["w"] - lu["w"]).max() < 1e-12


def test_their_code_as_written_reaches_the_same_point_with_the_servers_multiplier_halved(small):
    _, _, server, _, (w_star, nu) = small
    out = _run(small, layout="code")
    assert out["converged"] and out["admm_rounds"] == 348 != int(server["admm_rounds"])   # other iterates
    assert np.linalg.norm(out["w"] - w_star) / np.linalg.norm(w_star) < 1e-5
    assert np.abs(out["mu"][1:] - nu[1:]).max() < 1e-4 * np.abs(nu).max()                  # the clients'
    assert np.abs(2 * out["mu"][0] - nu[0]).max() < 1e-4 * np.abs(nu[0]).max()              # the server's, halved
    assert np.abs(out["mu"][0] - nu[0]).max() > 0.4 * np.abs(nu[0]).max()


def test_a_run_stopped_at_its_cap_says_it_did_not_converge_and_bad_options_are_refused(small):
    out = _run(small, max_outer=3)
    assert not out["converged"] and out["outer"] == 3
    with pytest.raises(ValueError, match="layout 'fast'.*allowed"):
        _run(small, layout="fast")


def test_the_speed_benchmark_prints_a_ratio_per_instance_and_the_median(monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("authors_lcqp", "constrained_qp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    out = _load("constrained_table4_speed").main(["--repeats", "2", "--only", "12,1,1;12,2,2", "--references",
                                                   "authors,code"])
    text = capsys.readouterr().out
    for tag in ("d12_n1_m1", "d12_n2_m2"):
        for who in ("ours", "authors", "code"):   # every run converged, its distance to the optimum printed
            assert re.search(rf"qp {tag} {who}: .*converged 1 rel_obj_err \S+ rel_w_err (\S+)", text), (tag, who)
        value = float(re.search(rf"^ratio constrained_table4 {tag} (\S+)$", text, re.MULTILINE).group(1))
        assert value == pytest.approx(np.median(out["instances"][tag]["authors"]), abs=0.006)
        assert len(out["instances"][tag]["code"]) == 2 and re.search(rf"^ratio constrained_table4_code {tag} ",
                                                                      text, re.MULTILINE)
    median = float(re.search(r"^ratio constrained_table4 median (\S+)$", text, re.MULTILINE).group(1))
    assert median == pytest.approx(np.median([np.median(v["authors"]) for v in out["instances"].values()]),
                                   abs=0.006)
