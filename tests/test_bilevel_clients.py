"""Bilevel problems stated by the clients' own functions (issue 46), and the bilevel cases of issue 45: unbiased
server weights under weighted sampling, lower levels that are not strongly convex, one-line errors.

The quadratic problem of examples/bilevel_quadratic.py, with weights q (sum to 1): A = sum q_i A_i (and B, c, d),
y*(x) = A^-1 (B x + c), grad Phi_q(x) = mu x + B^T A^-1 (y*(x) - d), so the stationary point solves
(mu I + B^T A^-2 B) x = B^T A^-1 (d - A^-1 c).
"""

from __future__ import annotations

import itertools
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.engine.sampling import SamplingConfig, inclusion_probabilities, sample_clients
from fedsolve.families import get_algorithm, get_problem_kind
from fedsolve.families.bilevel import client_problem
from fedsolve.problems import FederatedProblem
from tests.test_bilevel import FULL, client_matrices, closed_form, quad_problem, run, to64

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64


def stationary(mats: dict, w: torch.Tensor, mu: float) -> torch.Tensor:
    """The stationary point of the w-weighted quadratic bilevel problem (module docstring)."""
    A, B, c, d = (torch.einsum("i,i...->...", w, mats[k]) for k in "ABcd")
    Ai = torch.linalg.inv(A)
    dx = B.shape[1]
    return torch.linalg.solve(mu * torch.eye(dx, dtype=F64) + B.T @ Ai @ Ai @ B, B.T @ Ai @ (d - Ai @ c))


def lower(i, x, y, data):
    return 0.5 * y @ data["A"] @ y - y @ data["B"] @ x - data["c"] @ y


def upper(i, x, y, data):
    return 0.5 * (y - data["d"]).pow(2).sum() + 0.25 * x.pow(2).sum()


def quadratic_clients(n: int = 4, dx: int = 2, dy: int = 3, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, dy, dy, generator=g, dtype=F64)
    return {"A": M @ M.transpose(1, 2) / dy + torch.eye(dy, dtype=F64), "B": torch.randn(n, dy, dx, generator=g, dtype=F64),
            "c": torch.randn(n, dy, generator=g, dtype=F64), "d": torch.randn(n, dy, generator=g, dtype=F64)}


def quadratic_problem(clients=None, lower_fn=lower, **kw):
    clients = clients if clients is not None else quadratic_clients()
    dx, dy = clients["B"].shape[2], clients["B"].shape[1]
    return client_problem(upper, lower_fn, torch.zeros(dx, dtype=F64), torch.zeros(dy, dtype=F64),
                          client_data=clients, **kw)


# ------------------------------------------------------------------ the example (issue 46 acceptance)
def test_example_lands_on_the_closed_form_points():
    """examples/bilevel_quadratic.py: ShroFBO on the stationary point of Phi (p_i = 1/n), SimFBO on that of the
    reweighted Phi~ (w_i ~ p_i tau_i, Theorem 1), both computed here from the script's own matrices."""
    g = runpy.run_path(str(ROOT / "examples" / "bilevel_quadratic.py"), run_name="example")
    assert len((ROOT / "examples" / "bilevel_quadratic.py").read_text().splitlines()) <= 40
    n, mu = g["n"], g["mu"]
    p = torch.full((n,), 1.0 / n, dtype=F64)
    tau = torch.tensor(g["taus"], dtype=F64)
    x_true, x_rew = stationary(g["clients"], p, mu), stationary(g["clients"], p * tau / (p * tau).sum(), mu)
    print(f"\nShroFBO {g['found']['shrofbo'].tolist()} vs x* {x_true.tolist()}; SimFBO {g['found']['simfbo'].tolist()} "
          f"vs x~* {x_rew.tolist()} (||x* - x~*|| = {float((x_true - x_rew).norm()):.3f})")
    assert float((x_true - x_rew).norm()) > 0.05        # the two points differ: the check can tell them apart
    assert torch.allclose(g["found"]["shrofbo"], x_true, atol=1e-10, rtol=0)
    assert torch.allclose(g["found"]["simfbo"], x_rew, atol=1e-10, rtol=0)


# ------------------------------------------------------------------ client functions
def test_client_functions_report_the_objective_and_watch_x():
    prob = quadratic_problem()
    algo = get_algorithm("shrofbo")(dict(tau_clients=[1, 2, 3, 1], eta_y=0, eta_v=0, eta_x=0, gamma_y=0.15,
                                         gamma_v=0.15, gamma_x=0.1, batch_size=None), prob)
    res = Simulation(prob, algo, SimulationConfig(rounds=300, eval_every=300), 0).run()
    last = res.history[-1]
    x = res.server["x"]
    p = torch.full((4,), 0.25, dtype=F64)
    want = sum(p[i] * upper(None, x, res.server["y"], {k: v[i] for k, v in quadratic_clients().items()})
               for i in range(4))
    assert last["lower_grad_norm"] < 1e-10 and last["upper_loss"] == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(x, stationary(quadratic_clients(), p, 0.5), atol=1e-9)
    assert algo.watch == "x"   # the values of the clients' own functions may have any sign


@pytest.mark.parametrize("name", ["simfbo", "shrofbo", "aggitd", "fednest", "lfednest"])
def test_client_functions_sequential_and_vectorized_agree(name):
    """Per-round tau_i (a list of rounds), partial participation: the same numbers client by client and together."""
    prob = quadratic_problem()
    params = {"aggitd": dict(tau_clients=[[1, 3, 2, 2], [2, 1, 1, 3]], inner_lr=0.1, outer_lr=0.1, batch_size=None),
              "fednest": dict(tau_clients=[1, 3, 2, 2], batch_size=None, lr=0.1, hlr=0.1),
              "lfednest": dict(tau_clients=[1, 3, 2, 2], batch_size=None, lr=0.1, hlr=0.1)}.get(
        name, dict(tau_clients=[[1, 3, 2, 2], [2, 1, 1, 3]], eta_y=0.05, eta_v=0.05, eta_x=0.05, batch_size=None))
    out = {ex: run(prob, name, 10, executor=ex, clients=3, **params).server for ex in ("sequential", "vectorized")}
    for k in ("x", "y"):
        assert torch.allclose(out["sequential"][k], out["vectorized"][k], atol=1e-12, rtol=0), k
    assert not torch.equal(out["sequential"]["x"], torch.zeros(2, dtype=F64))


def test_a_function_that_indexes_with_a_python_int_runs_client_by_client():
    clients = quadratic_clients()
    A = clients["A"]

    def lower_int(i, x, y, data):   # indexes its own tensor with int(i): not a function of tensors alone
        return 0.5 * y @ A[int(i)] @ y - y @ data["B"] @ x - data["c"] @ y

    plain, by_int = quadratic_problem(clients), quadratic_problem(clients, lower_int)
    assert plain.vmappable and not by_int.vmappable
    params = dict(tau_clients=[1, 2, 3, 1], eta_y=0.05, eta_v=0.05, eta_x=0.05, batch_size=None)
    a = run(plain, "simfbo", 5, executor="auto", **params).server
    b = run(by_int, "simfbo", 5, executor="auto", **params)
    assert b.executor.name == "sequential"
    assert torch.allclose(a["x"], b.server["x"], atol=1e-13, rtol=0)


def test_per_round_tau_is_each_rounds_own():
    """tau_clients as a list of rounds: round t runs row t mod 2 (SimFBO's server step and ShroFBO's rho^t)."""
    prob = quadratic_problem()
    rows = [[1, 2, 3, 1], [3, 1, 1, 2]]
    for name in ("simfbo", "shrofbo"):
        common = dict(eta_y=0.05, eta_v=0.05, eta_x=0.05, batch_size=None)
        sim = run(prob, name, 0, tau_clients=rows, **common)
        ref = [run(prob, name, 0, tau_clients=r, **common) for r in rows]
        for t in range(3):   # round t of the schedule = one round of the persistent row t mod 2 from the same point
            r = ref[t % 2]
            r.set_state({**r.server, **{k: sim.server[k].clone() for k in ("x", "y", "v")}}, r.clients)
            sim.step()
            r.step()
            for k in ("x", "y", "v"):
                assert torch.allclose(sim.server[k], r.server[k], atol=1e-14, rtol=0), (name, t, k)
        other = run(prob, name, 2, tau_clients=rows[0], **common)   # the rows differ: the check can fail
        assert not torch.allclose(other.server["x"], run(prob, name, 2, tau_clients=rows, **common).server["x"])


def test_clients_with_samples_see_their_minibatches():
    """Functions over samples: a ridge with each client's own weight s_i (docs example 2, which a regulariser of the
    parameters alone cannot state); with every s_i = 0.7 it is the model-stated problem, iterate for iterate."""
    from tests.test_bilevel import PenalizedLinear, weighted_ridge
    from fedsolve.data.federated import FederatedData
    from fedsolve.families.bilevel.kind import split_rows
    from fedsolve.families.bilevel.problem import BilevelSpec

    rng = np.random.default_rng(0)
    tr = [(rng.normal(size=(20, 3)), rng.normal(size=20)) for _ in range(3)]
    data = to64(FederatedData.from_client_arrays(tr, [(a[:2], b[:2]) for a, b in tr], task="regression"))
    base = FederatedProblem(data, lambda: PenalizedLinear(3), loss="squared_error")
    split = split_rows(base, 0.5, 0)
    model = FederatedProblem(split, lambda: PenalizedLinear(3), loss="squared_error",
                             blocks={"x": ["lam_log"], "y": ["lin.*"]})
    model.extras["bilevel"] = BilevelSpec(lower_reg=weighted_ridge(0.7))

    def fit(y, data):   # the mean squared error of the regression y = (w, b) on this minibatch
        r = data["inputs"] @ y[:3] + y[3] - data["targets"]
        return 0.5 * (data["weights"] * r * r).sum()

    def g(i, x, y, data):
        return fit(y, data) + 0.5 * data["s"] * (x.exp() * y[:3] ** 2).sum()

    x0, y0 = model.layout.flatten(model.model)[:3], model.layout.flatten(model.model)[3:]
    lay = model.layout
    start = model.init_params(torch.Generator().manual_seed(5))
    x0, y0 = start[lay.mask("x")], start[lay.mask("y")]
    fns = client_problem(lambda i, x, y, d: fit(y, d), g, x0, y0, client_data={"s": torch.full((3,), 0.7, dtype=F64)},
                         data=split)
    sims = [run(p, "simfbo", 0, batch_size=4) for p in (model, fns)]
    sims[0].set_state({**sims[0].server, "x": x0.clone(), "y": y0.clone()}, sims[0].clients)
    sims[1].set_state({**sims[1].server, "x": x0.clone(), "y": y0.clone()}, sims[1].clients)
    for _ in range(4):
        for s in sims:
            s.step()
    for k in ("x", "y", "v"):
        assert torch.allclose(sims[0].server[k], sims[1].server[k], atol=1e-12, rtol=0), k


@pytest.mark.parametrize("case,message", [
    ("vector", r"lower: lower\(2, x, y, data\) returned shape \(3,\).*; allowed: a 0-dim floating tensor"),
    ("raises", r"upper: upper\(1, x, y, data\) raised KeyError: 'e'"),
    ("nan", r"lower: lower\(3, x, y, data\) = nan at the start; allowed: a finite value"),
    ("rows", r"client_data\['B'\] 5.*one n >= 1 for all"),
    ("indefinite", r"lower: client 2's lower level g_2 is not strongly convex in y at the start \(the smallest "
                   r"eigenvalue of its y-Hessian is -0\.5"),
    ("x0", r"x0: allowed: a non-empty 1-D floating tensor, got \(2, 1\)"),
    ("float32", r"lower: lower\(0, x, y, data\) is torch.float32, the variables are torch.float64"),
])
def test_every_clients_functions_are_checked_with_one_line(case, message):
    """Shapes, values and strong convexity are checked on EVERY client at the start (the faulty client is not 0)."""
    clients = quadratic_clients()
    lower_fn, upper_fn, kw = lower, upper, {}
    if case == "vector":
        lower_fn = lambda i, x, y, d: lower(i, x, y, d) * torch.ones(3, dtype=F64) if int(i) == 2 else lower(i, x, y, d)  # noqa: E731
    elif case == "raises":
        upper_fn = lambda i, x, y, d: upper(i, x, y, d) if int(i) != 1 else d["e"]  # noqa: E731
    elif case == "nan":
        clients["c"][3, 0] = float("nan")
    elif case == "rows":
        clients["B"] = torch.randn(5, 3, 2, dtype=F64)
    elif case == "indefinite":
        clients["A"][2] = torch.diag(torch.tensor([1.0, -0.5, 2.0], dtype=F64))
    elif case == "float32":
        lower_fn = lambda i, x, y, d: lower(i, x, y, d).float()  # noqa: E731
    x0 = torch.zeros(2, 1, dtype=F64) if case == "x0" else torch.zeros(2, dtype=F64)
    with pytest.raises(ValueError, match=message) as e:
        client_problem(upper_fn, lower_fn, x0, torch.zeros(3, dtype=F64), client_data=clients, **kw)
    assert "\n" not in str(e.value) and "learning rate" not in str(e.value)


def test_indefinite_lower_level_of_a_model_is_refused_naming_the_cause():
    """A hyper-representation whose output is not affine in y (out = (a . y)^2): g_i's y-Hessian at the start
    (y = 0) is -t_i a a^T + lam I, indefinite; refused when the problem is built, naming client, head and cause."""
    class Squared(nn.Module):
        def __init__(self):
            super().__init__()
            self.rep = nn.Linear(3, 3).double()
            self.head = nn.Linear(3, 1, bias=False).double()
            nn.init.zeros_(self.head.weight)

        def forward(self, a):
            return self.head(self.rep(a)).squeeze(-1) ** 2

    rng = np.random.default_rng(0)
    from fedsolve.data.federated import FederatedData

    tr = [(rng.normal(size=(12, 3)), 1.0 + rng.random(12)) for _ in range(3)]
    data = to64(FederatedData.from_client_arrays(tr, [(a[:2], b[:2]) for a, b in tr], task="regression"))
    base = FederatedProblem(data, Squared, loss="squared_error")
    with pytest.raises(ValueError, match=r"head: client 0's lower level g_0 is not strongly convex in y at the start"):
        get_problem_kind("hyper_representation")(base, {"lam": 0.01}, 0)   # head: the last layer


def test_hyper_representation_refuses_lam_zero_and_non_finite_data():
    from tests.conftest import make_data
    from fedsolve.models import build_model_fn

    data = to64(make_data(m=4, d=5, classes=3, n_range=(10, 25)))
    base = FederatedProblem(data, lambda: build_model_fn("mlp", data.input_shape, 3, hidden=(6,))().double())
    with pytest.raises(ValueError, match=r"lam: lam = 0.0 leaves the lower level g_i .* not strongly convex"):
        get_problem_kind("hyper_representation")(base, {"lam": 0}, 0)
    bad = to64(make_data(m=4, d=5, classes=3, n_range=(10, 25)))
    bad.train_x[int(bad.train_offsets[2]) + 1, 3] = float("nan")
    base = FederatedProblem(bad, lambda: build_model_fn("mlp", data.input_shape, 3, hidden=(6,))().double())
    with pytest.raises(ValueError, match=r"data: client 2 has non-finite training features"):
        get_problem_kind("hyper_representation")(base, {"lam": 0.1}, 0)


# ------------------------------------------------------------------ weighted sampling (issue 45)
def _subset_probabilities(w: np.ndarray, k: int) -> dict[tuple[int, ...], float]:
    """P(C = S) of successive sampling without replacement, probabilities ~ w: the sum over the orders of S."""
    p = w / w.sum()
    out = {}
    for S in itertools.combinations(range(len(w)), k):
        tot = 0.0
        for order in itertools.permutations(S):
            prob, left = 1.0, 1.0
            for j in order:
                prob *= p[j] / left
                left -= p[j]
            tot += prob
        out[S] = tot
    return out


def test_inclusion_probabilities_of_the_weighted_sampler():
    """pi_i of the engine's weighted sampler: equal to the enumeration over ordered draws, and to the sampler's own
    frequencies (4 standard errors over 20,000 draws)."""
    w = np.arange(1.0, 9.0)
    cfg = SamplingConfig(clients_per_round=4, scheme="weighted")
    pi = inclusion_probabilities(cfg, 8, torch.tensor(w)).numpy()
    exact = np.zeros(8)
    for S, prob in _subset_probabilities(w, 4).items():
        exact[list(S)] += prob
    assert np.abs(pi - exact).max() < 1e-12 and abs(pi.sum() - 4) < 1e-12
    R = 20_000
    freq = np.zeros(8)
    for r in range(R):
        freq[sample_clients(cfg, 8, torch.tensor(w), np.random.default_rng(r)).numpy()] += 1
    assert np.all(np.abs(freq / R - pi) < 4 * np.sqrt(pi * (1 - pi) / R))
    drop = inclusion_probabilities(SamplingConfig(clients_per_round=4, scheme="weighted", dropout=0.25), 8,
                                   torch.tensor(w)).numpy()
    assert np.allclose(drop, 0.75 * pi, atol=1e-14)
    assert np.allclose(inclusion_probabilities(SamplingConfig(clients_per_round=4), 8, torch.tensor(w)).numpy(), 0.5)


def _mean_dynamics(algo, prob, probs: dict, rounds: int) -> np.ndarray:
    """The expected SimFBO iterate under the sampler: with tau = 1, eta = 0 and exact oracles each round is affine
    in (x, y, v), so the mean iterate follows the mean of the server steps over the subsets S (weights P(C = S))."""
    mats = client_matrices(prob)
    server = {"x": torch.zeros(3, dtype=F64), "y": torch.zeros(4, dtype=F64), "v": torch.zeros(4, dtype=F64),
              "tau": torch.ones(8, dtype=F64)}
    for t in range(rounds):
        x, y, v = (server[k].numpy() for k in ("x", "y", "v"))
        up = {"hy": [A @ y - B @ x - c for A, B, c, C, e in mats], "hv": [A @ v - (C @ y - e) for A, B, c, C, e in mats],
              "hx": [1.0 * x + B.T @ v for A, B, c, C, e in mats]}
        up = {k: torch.tensor(np.array(val)) for k, val in up.items()}
        mean = {k: torch.zeros_like(server[k]) for k in ("x", "y", "v")}
        for S, pS in probs.items():
            ids = torch.tensor(S)
            new = algo.aggregate(server, ids, {**{k: val[ids] for k, val in up.items()},
                                               "a_norm": torch.ones(len(S), dtype=F64)}, t)
            for k in mean:
                mean[k] += pS * new[k]
        server = {**server, **mean}
    return server["x"].numpy()


def test_weighted_sampling_gives_unbiased_server_steps():
    """Issue 45: client weights 1..8, 4 of 8 clients a round drawn with probabilities ~ weight. With the server weights
    p_i / pi_i the expected SimFBO iterate lands on the stationary point of Phi (p_i = 1/8); with the uniform-sampling
    weights (n/P) p_i it lands on the point of the weights pi_i / sum pi (0.06 away), the bias the issue measured."""
    prob = quad_problem(m=8)
    prob.data.weights = torch.arange(1, 9, dtype=F64) / 36
    mats = client_matrices(prob)
    xs, *_ = closed_form(mats, np.full(8, 1 / 8))
    cfg = SimulationConfig(sampling={"clients_per_round": 4, "scheme": "weighted"})
    pi = inclusion_probabilities(cfg.sampling, 8, prob.data.weights).numpy()
    x_biased, *_ = closed_form(mats, pi / pi.sum())
    probs = _subset_probabilities(prob.data.weights.numpy(), 4)
    params = dict(eta_y=0, eta_v=0, eta_x=0, gamma_y=0.1, gamma_v=0.1, gamma_x=0.05, **FULL)
    told = get_algorithm("simfbo")(params, prob)
    told.sampling = cfg.sampling            # what the engine tells the solver (fedsolve.experiments.runner)
    untold = get_algorithm("simfbo")(params, prob)
    x_told, x_untold = _mean_dynamics(told, prob, probs, 400), _mean_dynamics(untold, prob, probs, 400)
    print(f"\n||E x - x*||: weights p_i/pi_i {np.linalg.norm(x_told - xs):.2e}, (n/P) p_i "
          f"{np.linalg.norm(x_untold - xs):.3f} (predicted bias {np.linalg.norm(x_biased - xs):.3f})")
    assert np.linalg.norm(x_told - xs) < 1e-7
    assert np.linalg.norm(x_untold - x_biased) < 1e-7 and np.linalg.norm(x_biased - xs) > 0.05


def test_the_runner_tells_the_solver_its_sampling(tmp_path):
    from fedsolve.experiments.config import ExperimentConfig
    from fedsolve.experiments.runner import build_algorithm, build_problem

    cfg = ExperimentConfig(**_config({"sampling": {"clients_per_round": 2, "scheme": "weighted"}}))
    problem = build_problem(cfg, 1)
    algo = build_algorithm(cfg, cfg.algorithm, problem)
    assert algo.sampling.scheme == "weighted"
    ids = torch.tensor([0, 3])
    pi = inclusion_probabilities(cfg.simulation.sampling, 4, problem.data.weights)
    assert torch.allclose(algo.p_tilde(ids), 0.25 / pi[ids], atol=1e-15)


# ------------------------------------------------------------------ one-line errors from the CLI (issue 45)
def _config(sim: dict | None = None, algorithm: dict | None = None, problem: bool = True) -> dict:
    cfg = {"name": "bilevel_cli", "seeds": [1],
           "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
                    "partition_params": {"alpha": 0.5, "min_size": 20}},
           "model": {"name": "mlp", "params": {"hidden": [8]}},
           "simulation": {"rounds": 2, "eval_every": 2, "executor": "sequential", **(sim or {})},
           "algorithm": algorithm or {"name": "simfbo", "params": {"batch_size": 16}}}
    if problem:
        cfg["problem"] = {"kind": "hyper_representation", "params": {"upper_fraction": 0.5, "lam": 0.1}}
    return cfg


@pytest.mark.parametrize("cfg,want", [
    (_config(algorithm={"name": "simfbo", "params": {"tau_clients": [1, 2, 3]}}),
     "algorithms: simfbo: tau_clients: 3 values for 4 clients; allowed: one tau_i >= 1 per client"),
    (_config(algorithm={"name": "fednest", "params": {"tau_clients": [1, 2]}}),
     "algorithms: fednest: tau_clients: 2 values for 4 clients; allowed: one tau_i >= 1 per client"),
    (_config(problem=False), "problem: 'bilevel_cli' is not bilevel"),
    ({**_config(), "problem": {"kind": "hyper_representation", "params": {"lam": 0}}},
     "problem.params: lam: lam = 0.0 leaves the lower level g_i (cross entropy of a linear head) not strongly convex"),
])
def test_bad_bilevel_input_is_one_line_from_the_cli(tmp_path, capsys, cfg, want):
    import yaml
    from fedsolve.cli import main

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and want in err, err
    assert len(err.splitlines()) == 1 and "simulation." not in err and "Traceback" not in err


# ------------------------------------------------------------------ docs/bilevel.md runs as written (issue 46)
def test_the_docs_code_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every python block of docs/bilevel.md, in order in one namespace (as a reader pastes them), and its config
    with the command line that runs it."""
    import re
    import shlex

    import yaml
    from fedsolve.cli import main

    text = (ROOT / "docs" / "bilevel.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 3 and "client_problem" in blocks[0]
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    for code in blocks:
        exec(compile(code, "docs/bilevel.md", "exec"), ns)
    assert ns["result"].history[-1]["upper_loss"] == ns["result"].history[-1]["upper_loss"]   # finite, recorded
    config = next(b for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M) if "name: bilevel_digits" in b)
    yaml.safe_load(config)
    (tmp_path / "bilevel_digits.yaml").write_text(config)
    command = next(b for b in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M) if "bilevel_digits" in b)
    argv = shlex.split(command.strip())
    assert argv[0] == "fedsolve"
    assert main(argv[1:] + ["--quiet"]) == 0
    assert (tmp_path / "runs" / "bilevel_digits" / "summary.json").exists()
