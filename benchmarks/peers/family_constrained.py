"""Prox-AL FL (paper 002, Algorithms 1-2, ``src/fedsolve/families/constrained/proxal.py``) on a Table-4 QP:
fedsolve against a plain and a fastest client-by-client loop (``families.py``).

Workload: the App. E.2 instance (d, n, m~) = (100, 5, 1) (``experiments/constrained/table4_qp.yaml``, instance seed
10): f_i(w) = w^T A_i w / 2 + b_i^T w, c_i(w) = C_i w + d_i = 0 for the server (i = 0) and 5 clients; beta 10,
s_bar 0.1, rho 1, q 0.9, eps1 = eps2 = 1e-3, w^0 on the unit sphere, exact subproblem solves; timed from a fresh
start until Eq. 11 passes (the whole run: 603 communication rounds, 11 outer iterations). With
H_i = A_i + beta C_i^T C_i + sigma I, sigma = 1/((n+1) beta), and g_i = grad P_{i,k}(0) = b_i + C_i^T (mu_i +
beta d_i) - sigma w^k:

    outer round (w^k): mu_i += beta c_i(w^k) (not in the first), lambda_i = -(H_i w^k + g_i), u~_i = w^k + lambda_i/rho;
                       the server checks Eq. 11, tau_k = s_bar/(k+1)^2, then solves Eq. 18 for z
    ADMM round (z):    u_i = (H_i + rho I)^{-1} (rho z - g_i - lambda_i)                       (Eq. 19, exact)
                       eps~_i = ||H_i z + g_i - rho (z - u~_i)||_inf;  lambda_i += rho (u_i - z)
                       u~_i = u_i + lambda_i/rho
                       server: if q^t + sum_i eps~_i <= tau_k: w^{k+1} = z, mu_0 += beta c_0(z), next outer round;
                       else z = (beta C_0^T C_0 + (sigma + n rho) I)^{-1} (rho sum_i u~_i - g_0)   (Eq. 18)

plain: client objects with the authors' QP method (their LCQP code, as ``constrained_qp.py``'s
``dense_reference_seconds``): each party forms its dense d x d system once per outer iteration and calls a dense
solver (``torch.linalg.solve``) every round. fastest: each party factors its system ONCE (Cholesky; it does not
depend on k) and every round is two triangular solves, client by client. Agreement (float64, tolerance 1e-9):
the final w, mu_0, outer count and number of rounds, and the server's z after EVERY round (the run converges to
the unique optimum, so the final state alone would hide a wrong round).
"""

from __future__ import annotations

import torch
from torch import Tensor

from family_common import Family, Result, clock, on, fedsolve_contenders, perturbed

from fedsolve.families import get_algorithm
from fedsolve.families.constrained.kind import qp_problem
from fedsolve.engine import Simulation, SimulationConfig

PAPER = {"beta": 10.0, "s_bar": 0.1, "rho": 1.0, "q": 0.9, "eps1": 1e-3, "eps2": 1e-3, "max_outer": 10000,
         "max_inner": 10000, "solver": "quadratic"}
CAP = 5000


def build(smoke: bool, perturb: set[str], executors: tuple[str, ...] = ("auto", "vectorized"), seed: int = 0,
          qp: tuple[int, int, int] | None = None, device: str = "cpu") -> Family:
    """``qp``: another Table-4 instance (d, n, m~) than (100, 5, 1)."""
    d, n, m = (20, 2, 1) if smoke else (qp or (100, 5, 1))
    params = dict(PAPER, max_outer=3) if smoke else PAPER    # smoke: stop after 3 outer iterations (~100 rounds)
    problem = qp_problem(d, n, m, seed=10)
    inst = {k: torch.as_tensor(v).to(device) for k, v in problem.extras["qp_instance"].items()}

    def make() -> Simulation:
        algo = get_algorithm("proxal")(params, problem)
        return Simulation(problem, algo, SimulationConfig(rounds=CAP, eval_every=10 ** 9, executor="sequential",
                                                          metrics=[], sampling={"fraction": 1.0}, device=device),
                          seed=seed)

    probe = make()          # how many rounds fedsolve needs to pass Eq. 11 (the timed runs stop there)
    w0 = probe.server["w0"].clone()
    rounds = 0
    while rounds < CAP and not probe.algo.phases.finished(probe.server):
        probe.run_round(rounds)
        rounds += 1

    def state(sim):
        s = sim.server
        return {"w": s["w"], "mu0": s["mu0"], "k": s["k"].double(), "converged": s["converged"].double(),
                "rounds": torch.tensor(float(rounds))}

    beta = perturbed(PAPER["beta"], perturb)
    fam = Family("constrained", f"Prox-AL FL on the Table-4 QP (d, n, m~) = ({d}, {n}, {m}), paper parameters, "
                 f"exact solves, from w^0 to Eq. 11 or {params['max_outer']} outer iterations ({rounds} rounds)", {},
                 tol=1e-9, unit="run")
    fam.contenders.update(fedsolve_contenders(make, rounds, state, trace=lambda sim: sim.server["z"],
                                              executors=executors))
    fam.contenders["plain"] = on(device, lambda: run(inst, w0, PlainParty, beta["plain"], params))
    fam.contenders["fastest"] = on(device, lambda: run(inst, w0, FactoredParty, beta["fastest"], params))
    return fam


# ------------------------------------------------------------------ the parties' linear algebra
class PlainParty:
    """The authors' QP method: the dense system formed once per outer iteration, a dense solve every round."""

    def __init__(self, H: Tensor):
        self.H = H
        self.Q = None

    def new_outer(self, shift: float) -> None:
        self.Q = self.H + shift * torch.eye(self.H.shape[0], dtype=self.H.dtype)

    def solve(self, rhs: Tensor) -> Tensor:
        return torch.linalg.solve(self.Q, rhs)


class FactoredParty:
    """The system factored once per run (Cholesky), two triangular solves a round."""

    def __init__(self, H: Tensor):
        self.H = H
        self.L = None

    def new_outer(self, shift: float) -> None:
        if self.L is None:
            self.L = torch.linalg.cholesky(self.H + shift * torch.eye(self.H.shape[0], dtype=self.H.dtype))

    def solve(self, rhs: Tensor) -> Tensor:
        return torch.cholesky_solve(rhs.unsqueeze(-1), self.L).squeeze(-1)


class Client:
    """One client of Algorithm 2 (its multipliers mu_i, lambda_i, u~_i and the constant of grad P_{i,k})."""

    def __init__(self, A, b, C, dv, beta: float, sigma: float, rho: float, party):
        self.b, self.C, self.dv, self.beta, self.sigma, self.rho = b, C, dv, beta, sigma, rho
        H = A + beta * C.T @ C + sigma * torch.eye(A.shape[0], dtype=A.dtype)
        self.H = H
        self.party = party(H)
        self.mu = torch.zeros(C.shape[0], dtype=A.dtype)

    def outer(self, w: Tensor, first: bool) -> tuple[Tensor, float]:
        """Alg. 1 lines 6-8 at w^k, then Alg. 2 line 1: ``(u~_i^0, ||mu_i^{k+1} - mu_i^k||_inf)``."""
        dmu = 0.0
        if not first:
            new = self.mu + self.beta * (self.C @ w + self.dv)
            dmu = float((new - self.mu).abs().max())
            self.mu = new
        self.g = self.b + self.C.T @ (self.mu + self.beta * self.dv) - self.sigma * w
        self.lam = -(self.H @ w + self.g)
        self.ut = w + self.lam / self.rho
        self.party.new_outer(self.rho)
        return self.ut, dmu

    def admm(self, z: Tensor) -> tuple[Tensor, float]:
        """Eqs. 19-22 (exact solve): ``(u~_i^{t+1}, eps~_i)``."""
        u = self.party.solve(self.rho * z - self.g - self.lam)
        et = float((self.H @ z + self.g - self.rho * (z - self.ut)).abs().max())
        self.lam = self.lam + self.rho * (u - z)
        self.ut = u + self.lam / self.rho
        return self.ut, et


def run(inst: dict[str, Tensor], w0: Tensor, party, beta: float, p: dict) -> Result:
    """Algorithms 1-2 round by round, clients one after another, until Eq. 11 passes (or ``max_outer``)."""
    rho, q, s_bar = p["rho"], p["q"], p["s_bar"]
    n = inst["A"].shape[0]
    sigma = 1.0 / ((n + 1) * beta)
    clients = [Client(inst["A"][i], inst["b"][i], inst["C"][i + 1], inst["d"][i + 1], beta, sigma, rho, party)
               for i in range(n)]
    C0, d0 = inst["C"][0], inst["d"][0]
    server = party(beta * C0.T @ C0 + sigma * torch.eye(C0.shape[1], dtype=C0.dtype))
    server.new_outer(n * rho)
    w, w_prev, mu0, dmu0, tau = w0.clone(), w0.clone(), torch.zeros(C0.shape[0], dtype=w0.dtype), 0.0, s_bar
    k, t, phase, converged = 0, 0, "first", False
    z = w
    times, path = [], []
    while phase != "done" and len(times) < CAP:
        t0 = clock()
        if phase in ("first", "outer"):
            ups = [c.outer(w, phase == "first") for c in clients]
            stop = False
            if phase == "outer":                             # Eq. 11 for the outer iteration just finished
                dw = float((w - w_prev).abs().max())
                dmu = max(dmu0, max(dm for _, dm in ups))
                converged = dw + beta * tau <= beta * p["eps1"] and dmu <= beta * p["eps2"]
                stop = converged or k >= p["max_outer"]
            if stop:
                phase = "done"
            else:
                tau, t = s_bar / (k + 1) ** 2, 0
                z = server.solve(rho * sum(u for u, _ in ups) - (C0.T @ (mu0 + beta * d0) - sigma * w))
                phase = "admm"
        else:
            ups = [c.admm(z) for c in clients]
            gap = q ** t + sum(e for _, e in ups)
            if gap <= tau or t + 1 >= p["max_inner"]:        # Eq. 23: the outer step
                mu0_new = mu0 + beta * (C0 @ z + d0)
                dmu0 = float((mu0_new - mu0).abs().max())
                mu0, w_prev, w = mu0_new, w, z
                k += 1
                phase = "outer"
            else:
                t += 1
                z = server.solve(rho * sum(u for u, _ in ups) - (C0.T @ (mu0 + beta * d0) - sigma * w))
        times.append(clock() - t0)
        path.append(z.clone())
    return Result(times, {"trace": torch.stack(path), "w": w, "mu0": mu0,
                          "k": torch.tensor(float(k), dtype=torch.float64),
                          "converged": torch.tensor(float(converged), dtype=torch.float64),
                          "rounds": torch.tensor(float(len(times)))}, f"{torch.get_num_threads()} thread(s)")
