"""A partially personalized least-squares problem, each client with its own matrices, solved by FedAPM.

Client i: f_i(u, v_i) = 1/2 ||A_i u + B_i v_i - b_i||^2 + (lam/2) (||u||^2 + ||v_i||^2), the block u shared by all
clients, v_i its own; FedAPM (the paper's theory settings) finds min_{u, v_1..v_m} sum_i f_i(u, v_i).
"""

import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.personalized import client_partial_problem

m, p, q, lam = 4, 3, 2, 0.1
g = torch.Generator().manual_seed(0)
data = [{"A": torch.randn(6, p, generator=g, dtype=torch.float64), "B": torch.randn(6, q, generator=g,
         dtype=torch.float64), "b": torch.randn(6, generator=g, dtype=torch.float64)} for _ in range(m)]


def f(i, u, v, d):   # client i's loss; d = data[i], its own matrices
    r = d["A"] @ u + d["B"] @ v - d["b"]
    return 0.5 * r @ r + 0.5 * lam * (u @ u + v @ v)


f64 = torch.float64
problem = client_partial_problem(f, u0=torch.zeros(p, dtype=f64), v0=torch.zeros(q, dtype=f64), data=data)
params = {"solver": "xi_controlled", "alpha": "one", "rho": 2.0, "sigma": 0.1, "lr": 0.1, "max_steps": 50,
          "xi_decay": 0.5, "v_tol": 1e-20, "weight_decay": 0.0}
sim = Simulation(problem, get_algorithm("fedapm")(params, problem), SimulationConfig(rounds=80, eval_every=80), seed=0)
result = sim.run()
u, v = result.server["u"], result.clients["v"]   # the shared block, and each client's personal block [m, q]
print("u =", u.tolist())
print("v =", v.tolist())
print("mean f_i =", result.history[-1]["test_loss"])
