"""An equality-constrained QP, each party with its own matrices (paper 002, Eq. 86):

    min_w sum_i 1/2 w'A_i w + b_i'w   s.t.  C_i w + e_i = 0 (client i),  C0 w + e0 = 0 (the server)

solved by Prox-AL FL. Run: python examples/constrained_qp.py (tests/test_constrained_parties.py checks w and the
multipliers against the KKT solution)."""
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families.constrained import ProxAL, quadratic_problem

N, D, M = 3, 5, 1                                       # clients, dimension, constraints per party
gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


S = randn(N, D, D)
A = S @ S.mT / D + 0.5 * torch.eye(D, dtype=torch.float64)       # positive definite, one per client
b, C, e = randn(N, D), randn(N, M, D), randn(N, M)
C0, e0 = randn(M, D), randn(M)
problem = quadratic_problem(A, b, C, e, C0=C0, e0=e0)

params = {"beta": 100.0, "rho": 10.0, "s_bar": 1e-4, "q": 0.5, "eps1": 1e-6, "eps2": 1e-6, "max_inner": 2000}
sim = Simulation(problem, ProxAL(params, problem), SimulationConfig(rounds=5000, sampling={"fraction": 1.0}), seed=0)
result = sim.run()
w = result.server["w"]                                  # the answer
mu_server, mu_clients = result.server["mu0"], result.clients["mu"]   # multipliers: [M], [N, M]
print(result.extras["constrained"]["status"])
print("w =", w.numpy().round(6))
print("mu_server =", mu_server.numpy().round(6), " mu_clients =", mu_clients.numpy().round(6).tolist())
