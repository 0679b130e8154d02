"""Client-specific saddle problems (issue 46): each client's own saddle function ``f(i, x, y, d)`` or its own
matrices, in plain torch, checked on every client when the problem is built; examples/saddle_quadratic.py solved
to the closed forms computed here.

Closed forms for f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y (spec fedmm.md sec. 4):

* the saddle point solves grad_x f = 0, grad_y f = 0 for the mean f: [Ā, B̄; B̄', -C̄] [x; y] = [-ā; c̄];
* FedAvgGDA's limit: in minimizer form (x descends f_i, y descends -f_i) a local step is z <- z - E (G_i z + h_i)
  with G_i = [A_i, B_i; -B_i', C_i], h_i = [a_i; c_i] and E the diagonal of step sizes, so M steps from the
  round's z0 give T_i^M z0 - S_i E h_i (T_i = I - E G_i, S_i = sum_{k<M} T_i^k); a round is the affine map
  z0 -> P z0 + q with P = mean_i T_i^M, q = -mean_i S_i E h_i, and its fixed point is (I - P)^{-1} q, which is
  not the saddle point when the clients differ and M > 1.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.minimax import client_saddle_problem, quadratic_saddle_problem

ROOT = Path(__file__).resolve().parents[1]


def saddle_point(A, B, C, a, c) -> torch.Tensor:
    A, B, C, a, c = (torch.stack(list(v)).mean(0) for v in (A, B, C, a, c))
    K = torch.cat([torch.cat([A, B], 1), torch.cat([B.T, -C], 1)])
    return torch.linalg.solve(K, torch.cat([-a, c]))


def fedavg_gda_limit(A, B, C, a, c, lr: float, lr_psi: float, steps: int) -> torch.Tensor:
    """The fixed point of FedAvgGDA's round map (module docstring)."""
    dx, dy = A[0].shape[0], C[0].shape[0]
    E = torch.diag(torch.tensor([lr] * dx + [lr_psi] * dy, dtype=torch.float64))
    eye = torch.eye(dx + dy, dtype=torch.float64)
    P, q = torch.zeros_like(eye), torch.zeros(dx + dy, dtype=torch.float64)
    for Ai, Bi, Ci, ai, ci in zip(A, B, C, a, c):
        G = torch.cat([torch.cat([Ai, Bi], 1), torch.cat([-Bi.T, Ci], 1)])
        T = eye - E @ G
        S = sum(torch.linalg.matrix_power(T, k) for k in range(steps))
        P += torch.linalg.matrix_power(T, steps) / len(A)
        q -= S @ E @ torch.cat([ai, ci]) / len(A)
    return torch.linalg.solve(eye - P, q)


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(ROOT / "examples" / "saddle_quadratic.py"))


def test_example_reaches_the_saddle_and_fedavggda_its_biased_point(example):
    """FedMM and FedSGDA end on the saddle point; FedAvgGDA on the fixed point of its round map, far from it."""
    A, B, C, a, c = (example[k] for k in "ABCac")
    z_star = saddle_point(A, B, C, a, c)
    lines = len((ROOT / "examples" / "saddle_quadratic.py").read_text().splitlines())
    assert lines <= 40
    for name in ("fedmm", "fedsgda"):
        z = torch.cat(example["solutions"][name])
        print(f"{name}: distance to the saddle point {float((z - z_star).norm()):.1e}")
        assert float((z - z_star).norm()) < 1e-8
    steps = example["RUNS"]["fedavggda"][0]
    z_bias = fedavg_gda_limit(A, B, C, a, c, 0.25, 0.25, steps)
    z = torch.cat(example["solutions"]["fedavggda"])
    print(f"fedavggda: {float((z - z_bias).norm()):.1e} from its predicted point, which is "
          f"{float((z_bias - z_star).norm()):.2f} from the saddle point")
    assert float((z - z_bias).norm()) < 1e-8 and float((z_bias - z_star).norm()) > 0.5


def _problem_data(n: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"p": torch.randn(4, generator=g, dtype=torch.float64),
             "B": 0.3 * torch.randn(4, 2, generator=g, dtype=torch.float64),
             "s": 0.5 + torch.rand(2, generator=g, dtype=torch.float64)} for _ in range(n)]


def smooth_saddle(i, x, y, d):
    """Client i: a log-cosh pull of x to its own point p_i, a bilinear coupling and a strongly concave y part."""
    return (torch.log(torch.cosh(x - d["p"])).sum() + x @ d["B"] @ y - 0.5 * (d["s"] * y * y).sum()
            + 0.1 * i * y.sum())


def test_own_function_per_client_reaches_a_stationary_point():
    """A non-quadratic saddle function with each client's own data: FedMM ends where the gradient of the clients'
    mean f, taken here by autograd on f itself, vanishes in x and in y; FedAvgGDA (the same M) does not."""
    data = _problem_data()
    problem = client_saddle_problem(smooth_saddle, torch.zeros(4, dtype=torch.float64),
                                    torch.zeros(2, dtype=torch.float64), data)

    def grad_norm(w):
        x, y = (t.detach().requires_grad_(True) for t in problem.players(w))
        f = torch.stack([smooth_saddle(torch.tensor(i), x, y, d) for i, d in enumerate(data)]).mean()
        gx, gy = torch.autograd.grad(f, (x, y))
        return float(torch.cat([gx, gy]).norm())

    out = {}
    for name, extra in (("fedmm", {"eta3": 1.0}), ("fedavggda", {})):
        params = {"lr": 0.3, "lr_psi": 0.3, "local_steps": 5, "batch_size": None, **extra}
        sim = Simulation(problem, get_algorithm(name)(params, problem), SimulationConfig(rounds=150), seed=0)
        out[name] = grad_norm(sim.run().server["w"])
    print(f"|grad f| at the end: {out}")
    assert out["fedmm"] < 1e-9 and out["fedavggda"] > 1e-3


@pytest.mark.parametrize("name", ["fedmm", "fedavggda", "fedproxgda", "fedsgda"])
def test_sequential_and_vectorized_agree_on_an_own_function(name):
    problem = client_saddle_problem(smooth_saddle, torch.full((4,), 0.1, dtype=torch.float64),
                                    torch.zeros(2, dtype=torch.float64), _problem_data())
    runs = {}
    for ex in ("sequential", "vectorized"):
        algo = get_algorithm(name)({"lr": 0.2, "lr_psi": 0.2, "batch_size": None,
                                    "local_steps": 1 if name == "fedsgda" else 4}, problem)
        sim = Simulation(problem, algo, SimulationConfig(rounds=5, eval_every=5, executor=ex), seed=0)
        runs[ex] = sim.run()
    torch.testing.assert_close(runs["sequential"].server["w"], runs["vectorized"].server["w"], rtol=0, atol=1e-12)
    if name == "fedmm":
        torch.testing.assert_close(runs["sequential"].clients["dual"], runs["vectorized"].clients["dual"], rtol=0,
                                   atol=1e-12)
    assert runs["sequential"].history[-1]["test_loss"] == pytest.approx(runs["vectorized"].history[-1]["test_loss"])


def test_the_test_loss_is_the_mean_saddle_value():
    """The scored loss of the global model is (1/N) sum_i f_i(x, y) (the model's output on a client's row is its
    f_i), so a run reports the saddle value."""
    data = _problem_data()
    x0, y0 = torch.full((4,), 0.3, dtype=torch.float64), torch.full((2,), -0.2, dtype=torch.float64)
    problem = client_saddle_problem(smooth_saddle, x0, y0, data)
    algo = get_algorithm("fedsgda")({"lr": 1e-300, "lr_psi": 1e-300, "batch_size": None}, problem)
    rec = Simulation(problem, algo, SimulationConfig(rounds=1), seed=0).run().history[-1]
    want = torch.stack([smooth_saddle(torch.tensor(i), x0, y0, d) for i, d in enumerate(data)]).mean()
    assert rec["test_loss"] == pytest.approx(float(want), rel=1e-12)


# ------------------------------------------------------------------ what is checked when the problem is built
def _zeros():
    return torch.zeros(4, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)


def test_every_clients_data_and_value_are_checked():
    data = _problem_data()
    data[2] = {**data[2], "B": torch.zeros(4, 3, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"data\[2\]\['B'\]: shape \(4, 3\) .* but client 0's is \(4, 2\)"):
        client_saddle_problem(smooth_saddle, *_zeros(), data)
    data = _problem_data()
    data[1]["p"][2] = float("nan")
    with pytest.raises(ValueError, match=r"data\[1\]\['p'\]: holds NaN/inf values"):
        client_saddle_problem(smooth_saddle, *_zeros(), data)
    with pytest.raises(ValueError, match=r"f: client 0 returned shape \(4,\)"):
        client_saddle_problem(lambda i, x, y, d: x * y.sum() - y @ y, *_zeros(), num_clients=2)
    with pytest.raises(ValueError, match="f: client 1's value at the start point is nan"):
        client_saddle_problem(lambda i, x, y, d: (x.sum() - y @ y) / (1 - i), *_zeros(), num_clients=2)
    with pytest.raises(ValueError, match="num_clients: expected a positive integer when no data is given"):
        client_saddle_problem(smooth_saddle, *_zeros())
    with pytest.raises(ValueError, match="y0: float32 but x0 is float64"):
        client_saddle_problem(smooth_saddle, _zeros()[0], torch.zeros(2), _problem_data())


def test_python_branching_on_the_client_is_refused_in_one_line():
    """``f`` must run for one client and for all at once: ``int(i)`` is refused when the problem is built (it would
    fail in the middle of a run for all clients at once)."""
    mats = [torch.eye(2, dtype=torch.float64) * (k + 1) for k in range(3)]
    with pytest.raises(ValueError, match="f: it does not run for all clients at once .*allowed: tensor operations"):
        client_saddle_problem(lambda i, x, y, d: x.sum() - 0.5 * y @ mats[int(i)] @ y, *_zeros(), num_clients=3)
    stacked = torch.stack(mats)     # the same function indexing a tensor: fine
    problem = client_saddle_problem(lambda i, x, y, d: (x * x).sum() - 0.5 * y @ stacked[i] @ y, *_zeros(),
                                    num_clients=3)
    assert problem.num_clients == 3


def test_a_max_part_that_is_not_concave_is_refused_naming_the_cause():
    """A convex (not concave) y part is refused when the problem is built, with the cause (before, the run
    diverged and the message said to try smaller step sizes, which cannot help)."""
    def f(shift):   # client 0 concave in y, client 1 convex; their mean: (1/2 - shift) y'y
        return lambda i, x, y, d: (x * x).sum() + x[:2] @ y + (i - shift) * (y * y).sum()

    with pytest.raises(ValueError, match=r"f: the max part is not concave: .* eigenvalue 0\.5 > 0 .*allowed: a "
                                         r"function concave in y"):
        client_saddle_problem(f(0.25), *_zeros(), num_clients=2)
    client_saddle_problem(f(0.75), *_zeros(), num_clients=2)     # mean -1/4 y'y: concave


def test_a_large_max_part_is_checked_by_its_curvature_along_directions():
    """Beyond 256 entries of y the Hessian is not formed: power iteration with Hessian-vector products finds the one
    direction of positive curvature among 300 (the other eigenvalues -0.5 .. -2, the dominant ones)."""
    c = torch.linspace(0.5, 2.0, 300, dtype=torch.float64)
    x0, y0 = torch.zeros(2, dtype=torch.float64), torch.zeros(300, dtype=torch.float64)
    client_saddle_problem(lambda i, x, y, d: (x * x).sum() + x.sum() * y.sum() - 0.5 * (d * y * y).sum(), x0, y0,
                          [c, c.flip(0)])
    bad = c.clone()
    bad[37] = -0.3
    with pytest.raises(ValueError, match=r"f: the max part is not concave: .* eigenvalue 0\.3 > 0"):
        client_saddle_problem(lambda i, x, y, d: (x * x).sum() + x.sum() * y.sum() - 0.5 * (d * y * y).sum(), x0, y0,
                              [bad, bad])


def test_quadratic_matrices_are_checked():
    eye2, eye3 = torch.eye(2, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    B = [torch.ones(3, 2, dtype=torch.float64)] * 2
    quadratic_saddle_problem([eye3, eye3], B, [eye2, eye2])     # fine
    with pytest.raises(ValueError, match=r"C: the clients' mean C has the eigenvalue -0\.5 <= 0: the max part is "
                                         r"not strongly concave in y"):
        quadratic_saddle_problem([eye3, eye3], B, [eye2, -2 * eye2])
    with pytest.raises(ValueError, match=r"A: the clients' mean A has the eigenvalue 0 <= 0"):
        quadratic_saddle_problem([eye3, -eye3], B, [eye2, eye2])
    skew = eye3.clone()
    skew[0, 1] = 1.0
    with pytest.raises(ValueError, match="A: client 1's matrix is not symmetric"):
        quadratic_saddle_problem([eye3, skew], B, [eye2, eye2])
    with pytest.raises(ValueError, match=r"B: shape \(2, 2\) float64 on 2 clients; allowed: \(3, 2\)"):
        quadratic_saddle_problem([eye3, eye3], [eye2, eye2], [eye2, eye2])
    with pytest.raises(ValueError, match=r"C: client 1's is \(3, 3\) but client 0's is \(2, 2\)"):
        quadratic_saddle_problem([eye3, eye3], B, [eye2, eye3])
    with pytest.raises(ValueError, match="a: client 0's entries hold NaN/inf"):
        quadratic_saddle_problem([eye3, eye3], B, [eye2, eye2], a=torch.full((2, 3), float("inf"),
                                                                            dtype=torch.float64))
