"""Federated minimax (FedMM paper, spec fedmm.md): theory on a quadratic saddle, the adversarial losses, domain
data, executors and configs.

The quadratic testbed (spec sec. 4): f_i(x, y) = 1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y, strongly
convex in x, strongly concave in y, heterogeneous over clients. Everything is deterministic (full batch) and
float64, so the fixed points of the baselines can be predicted in closed form: a round of FedAvgGDA/FedProxGDA is
an affine map z0 -> P z0 + q of the global model, whose fixed point is (I - P)^{-1} q.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsolve.families import get_algorithm
from fedsolve.core.executor import build_plans
from fedsolve.core.selection import make_executor
from fedsolve.core.rng import RngStreams
from fedsolve.data.federated import FederatedData
from fedsolve.families.minimax import quadratic_saddle_problem, saddle_problem

N, DX, DY = 4, 3, 2


# ------------------------------------------------------------------ the quadratic testbed
def quadratic_coeffs(seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N):
        S = rng.normal(size=(DX, DX))
        A = np.eye(DX) * 0.5 + 0.3 * S @ S.T / DX
        T = rng.normal(size=(DY, DY))
        C = np.eye(DY) * 0.5 + 0.3 * T @ T.T / DY
        B = 0.5 * rng.normal(size=(DX, DY))
        a, c = 2.0 * rng.normal(size=DX), 2.0 * rng.normal(size=DY)
        out.append((A, B, C, a, c))
    return out


def unpack(x):
    i = 0
    parts = []
    for shape in ((DX, DX), (DX, DY), (DY, DY), (DX,), (DY,)):
        n = int(np.prod(shape))
        parts.append(x[..., i:i + n].reshape(*x.shape[:-1], *shape))
        i += n
    return parts


def quad_objective(omega, psi, batch):
    """f_i as a torch function of (omega, psi, batch): each client's one row holds its coefficients."""
    x, _, w = batch
    A, B, C, a, c = unpack(x)
    q = (0.5 * torch.einsum("i,nij,j->n", omega, A, omega) + torch.einsum("i,nij,j->n", omega, B, psi)
         - 0.5 * torch.einsum("i,nij,j->n", psi, C, psi) + a @ omega - c @ psi)
    return (w * q).sum()


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.omega = nn.Parameter(torch.zeros(DX, dtype=torch.float64))
        self.psi = nn.Parameter(torch.zeros(DY, dtype=torch.float64))

    def forward(self, x):
        return (self.omega.sum() + self.psi.sum()).expand(x.shape[0], 1)


def quadratic_problem(seed: int = 0):
    """The testbed from each client's matrices (``quadratic_saddle_problem``) and its coefficients."""
    coeffs = quadratic_coeffs(seed)
    A, B, C, a, c = ([torch.tensor(cf[k]) for cf in coeffs] for k in range(5))
    return quadratic_saddle_problem(A, B, C, a, c, name="quadratic"), coeffs


def rows_problem(seed: int = 0):
    """The same testbed as an objective on data rows (``saddle_problem``): each client's one row holds its
    coefficients."""
    coeffs = quadratic_coeffs(seed)
    rows = torch.tensor(np.stack([np.concatenate([p.ravel() for p in cf]) for cf in coeffs]))
    off = torch.arange(N + 1)
    data = FederatedData(rows, torch.zeros(N, dtype=torch.float64), off, rows.clone(),
                         torch.zeros(N, dtype=torch.float64), off.clone(), task="regression", name="quadratic")
    return saddle_problem(data, Pair, quad_objective, omega=["omega"], psi=["psi"], name="quadratic")


def saddle_point(coeffs):
    A, B, C, a, c = (np.mean([cf[k] for cf in coeffs], axis=0) for k in range(5))
    K = np.block([[A, B], [B.T, -C]])
    return np.linalg.solve(K, np.concatenate([-a, c]))


def field(cf):
    """Minimizer-form gradient field F_i(z) = G_i z + h_i (omega: grad_x f_i; psi: -grad_y f_i)."""
    A, B, C, a, c = cf
    return np.block([[A, B], [-B.T, C]]), np.concatenate([a, c])


def predicted_fixed_point(coeffs, lr, lr_psi, M, mu):
    """Fixed point of FedAvgGDA (mu = 0) / FedProxGDA: each client's M steps
    z <- z - Eta (G_i z + h_i + mu (z - z0)) are affine in z0: z_M = P_i z0 + q_i."""
    d = DX + DY
    Eta = np.diag([lr] * DX + [lr_psi] * DY)
    P, q = np.zeros((d, d)), np.zeros(d)
    for cf in coeffs:
        G, h = field(cf)
        T = np.eye(d) - Eta @ (G + mu * np.eye(d))
        S = sum(np.linalg.matrix_power(T, k) for k in range(M))
        P += (np.linalg.matrix_power(T, M) + S @ Eta * mu) / N
        q += -(S @ Eta @ h) / N
    return np.linalg.solve(np.eye(d) - P, q)


def run_rounds(algo, rounds: int, executor: str = "vectorized", seed: int = 0, x0=None):
    """The engine's round (broadcast -> plans -> executor -> scatter -> aggregate), without logging or eval."""
    problem = algo.problem
    data = problem.data
    rngs = RngStreams(seed)
    if x0 is None:
        x0 = problem.init_params(rngs.torch("init"))
    server, clients = algo.init(x0, rngs)
    ex = make_executor(executor, problem)
    ids = torch.arange(problem.num_clients)
    for t in range(rounds):
        msgs = algo.broadcast(server, ids, t)
        plans = build_plans(algo.work(t), data.train_offsets, ids, rngs, t, None, data.row_groups)
        new, up, _ = ex.run(algo, clients.gather(ids), msgs, ids, plans, data, t)
        clients.scatter(ids, new)
        server = algo.aggregate(server, ids, up, t)
    return server, clients, up


def make(name, problem, **params):
    cls = get_algorithm(name)
    return cls(cls.Config(**{"batch_size": None, **params}), problem)


LR, M = 0.1, 10
LR_FAST = 0.25   # FedSGDA and the baselines converge in fewer rounds with it (the tests stay fast)


@pytest.fixture(scope="module")
def quad():
    return quadratic_problem(0)


def test_fedmm_and_fedsgda_reach_the_exact_saddle(quad):
    problem, coeffs = quad
    z_star = saddle_point(coeffs)
    zero = torch.zeros(DX + DY, dtype=torch.float64)
    mm = make("fedmm", problem, lr=LR_FAST, lr_psi=LR_FAST, local_steps=3, mu1=1.0, mu2=1.0, eta3=1.0)
    sgda = make("fedsgda", problem, lr=LR_FAST, lr_psi=LR_FAST)
    s_mm, clients, _ = run_rounds(mm, 70, x0=zero)
    s_sg, _, _ = run_rounds(sgda, 130, x0=zero)
    d_mm = float(np.linalg.norm(s_mm["w"].numpy() - z_star))
    d_sg = float(np.linalg.norm(s_sg["w"].numpy() - z_star))
    print(f"\ndistance to the exact saddle: FedMM (M=3, 70 rounds) {d_mm:.2e}; FedSGDA (130 rounds) {d_sg:.2e}")
    assert d_mm < 1e-8 and d_sg < 1e-8
    # fixed point: the duals cancel on average (mean_i lambda_i = 0), each is minus the local gradient field
    dual = clients["dual"].numpy()
    assert np.abs(dual.mean(0)).max() < 1e-8
    for i, cf in enumerate(coeffs):
        G, h = field(cf)
        np.testing.assert_allclose(dual[i], -(G @ z_star + h), atol=1e-7)


@pytest.mark.parametrize("name,mu,steps", [("fedavggda", 0.0, M), ("fedproxgda", 1.0, M), ("fedavggda", 0.0, 2)])
def test_fedavg_and_fedprox_gda_stop_at_the_predicted_biased_point(quad, name, mu, steps):
    problem, coeffs = quad
    z_star = saddle_point(coeffs)
    params = {"mu": mu} if name == "fedproxgda" else {}
    algo = make(name, problem, lr=LR_FAST, lr_psi=LR_FAST, local_steps=steps, **params)
    server, _, _ = run_rounds(algo, 300 // steps, x0=torch.zeros(DX + DY, dtype=torch.float64))
    z = server["w"].numpy()
    z_bias = predicted_fixed_point(coeffs, LR_FAST, LR_FAST, steps, mu)
    pred, got = np.linalg.norm(z_bias - z_star), np.linalg.norm(z - z_star)
    print(f"\n{name} M={steps}: distance to the saddle {got:.4f}, predicted {pred:.4f}, "
          f"off the prediction by {np.linalg.norm(z - z_bias):.1e}")
    assert np.linalg.norm(z - z_bias) < 1e-7   # the limit of the float64 solve of (I - P) z = q
    assert pred > 1e-2  # genuinely biased


def test_fedsgda_fixed_point_is_the_saddle_by_the_same_formula(quad):
    """The closed form of the biased point is exact at M = 1: there it is the saddle point (no bias)."""
    _, coeffs = quad
    np.testing.assert_allclose(predicted_fixed_point(coeffs, LR, LR, 1, 0.0), saddle_point(coeffs), atol=1e-10)


def test_fedmm_without_dual_upload_is_biased(quad):
    problem, coeffs = quad
    z_star = saddle_point(coeffs)
    algo = make("fedmm", problem, lr=LR_FAST, lr_psi=LR_FAST, local_steps=3, eta3=0.0)
    server, _, _ = run_rounds(algo, 50, x0=torch.zeros(DX + DY, dtype=torch.float64))
    s2, _, _ = run_rounds(algo, 60, x0=torch.zeros(DX + DY, dtype=torch.float64))
    d = float(np.linalg.norm(server["w"].numpy() - z_star))
    print(f"\nFedMM eta_3 = 0: distance to the saddle {d:.4f} (converged: moved "
          f"{float((s2['w'] - server['w']).norm()):.1e} in 10 more rounds)")
    assert float((s2["w"] - server["w"]).norm()) < 1e-8   # it converged ...
    assert d > 1e-2                                       # ... to a biased point


def test_exact_local_solves_give_the_dual_identities(quad):
    """lambda_i^{t+1} = -grad_omega f_i(omega_i^{t+1}, psi_i^{t+1}), beta_i^{t+1} = grad_psi f_i(...) (eqs. 42, 47),
    and with eta_3 = 1 omega_0^{t+1} = mean_i (omega_i^{t+1} + lambda_i^{t+1} / mu_1)."""
    problem, coeffs = quad
    mu1, mu2 = 1.0, 2.0
    algo = make("fedmm", problem, lr=0.3, lr_psi=0.3, local_steps=60, mu1=mu1, mu2=mu2, eta3=1.0)
    server, clients, up = run_rounds(algo, 3, x0=torch.zeros(DX + DY, dtype=torch.float64))
    dual = clients["dual"].numpy()
    mu = np.array([mu1] * DX + [mu2] * DY)
    local = up["w"].numpy() - dual / mu          # omega_i^{t+1}, psi_i^{t+1} (the upload minus the dual term)
    worst = 0.0
    for i, cf in enumerate(coeffs):
        A, B, C, a, c = cf
        x, y = local[i, :DX], local[i, DX:]
        lam, beta = dual[i, :DX], dual[i, DX:]
        worst = max(worst, np.abs(lam + (A @ x + B @ y + a)).max(), np.abs(beta - (B.T @ x - C @ y - c)).max())
    print(f"\nexact local solves: max |lambda_i + grad_omega f_i|, |beta_i - grad_psi f_i| = {worst:.1e}")
    assert worst < 1e-10
    np.testing.assert_allclose(server["w"].numpy(), (local + dual / mu).mean(0), atol=1e-14)


@pytest.mark.parametrize("name", ["fedmm", "fedavggda", "fedproxgda", "fedsgda"])
def test_sequential_and_vectorized_agree_on_the_quadratic(quad, name):
    problem, _ = quad
    algo = make(name, problem, lr=LR, lr_psi=LR, **({} if name == "fedsgda" else {"local_steps": 5}))
    x0 = torch.linspace(-1, 1, DX + DY, dtype=torch.float64)
    a, ca, _ = run_rounds(algo, 4, "sequential", x0=x0)
    b, cb, _ = run_rounds(algo, 4, "vectorized", x0=x0)
    torch.testing.assert_close(a["w"], b["w"], rtol=0, atol=1e-12)
    for k in ca:
        torch.testing.assert_close(ca[k], cb[k], rtol=0, atol=1e-12)


def test_eta3_is_a_power_of_the_round(quad):
    """Round t uploads omega_i^{t+1} + eta_3^t lambda_i^{t+1} / mu_1: the same round t = 3 from the same state with
    eta_3 = 0.5 and eta_3 = 1 differs by exactly (1 - 0.5^3) dual / mu."""
    problem, _ = quad
    algo = make("fedmm", problem, lr=LR, lr_psi=LR, local_steps=3, eta3=0.5, mu1=1.0, mu2=2.0)
    server, clients, _ = run_rounds(algo, 3, x0=torch.zeros(DX + DY, dtype=torch.float64))
    ids = torch.arange(N)
    plans = build_plans(algo.work(3), problem.data.train_offsets, ids, RngStreams(0), 3)
    ex = make_executor("sequential", problem)
    outs = {}
    for eta3 in (0.5, 1.0):
        a = make("fedmm", problem, lr=LR, lr_psi=LR, local_steps=3, eta3=eta3, mu1=1.0, mu2=2.0)
        outs[eta3] = ex.run(a, clients.gather(ids), a.broadcast(server, ids, 3), ids, plans, problem.data, 3)
    dual = outs[1.0][0]["dual"]
    torch.testing.assert_close(outs[0.5][0]["dual"], dual)
    mu = torch.tensor([1.0] * DX + [2.0] * DY, dtype=torch.float64)
    torch.testing.assert_close(outs[1.0][1]["w"] - outs[0.5][1]["w"], (1 - 0.5 ** 3) * dual / mu)
    assert dual.abs().max() > 1e-3


@pytest.mark.parametrize("name", ["fedmm", "fedavggda"])
def test_an_objective_on_data_rows_gives_the_client_matrices_iterates(quad, name):
    """The same quadratic stated as an objective on data rows (``saddle_problem``) and from the clients' matrices
    (``quadratic_saddle_problem``): the same server model after 5 rounds, the same duals."""
    problem, _ = quad
    x0 = torch.linspace(-1, 1, DX + DY, dtype=torch.float64)
    a, ca, _ = run_rounds(make(name, problem, lr=LR, lr_psi=LR, local_steps=4), 5, x0=x0)
    b, cb, _ = run_rounds(make(name, rows_problem(0), lr=LR, lr_psi=LR, local_steps=4), 5, x0=x0)
    torch.testing.assert_close(a["w"], b["w"], rtol=0, atol=1e-12)
    for k in ca:
        torch.testing.assert_close(ca[k], cb[k], rtol=0, atol=1e-12)
    assert float((a["w"] - x0).abs().max()) > 1e-2


def test_an_objective_on_data_rows_not_concave_in_psi_is_refused():
    """One client's C_i flipped so that the mean C is indefinite: the max part is not concave, so no step size
    helps; the problem is refused with that cause (before, the run diverged with the hint of a smaller step)."""
    coeffs = quadratic_coeffs(0)
    A, B, C, a, c = coeffs[1]
    coeffs[1] = (A, B, C - 3 * N * np.eye(DY), a, c)
    rows = torch.tensor(np.stack([np.concatenate([p.ravel() for p in cf]) for cf in coeffs]))
    off = torch.arange(N + 1)
    data = FederatedData(rows, torch.zeros(N, dtype=torch.float64), off, rows.clone(),
                         torch.zeros(N, dtype=torch.float64), off.clone(), task="regression")
    with pytest.raises(ValueError, match=r"^objective: the max part is not concave: at the start point the Hessian "
                                         r"in y of the clients' mean has the eigenvalue \d"):
        saddle_problem(data, Pair, quad_objective, omega=["omega"], psi=["psi"])
