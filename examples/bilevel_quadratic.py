"""A quadratic bilevel problem whose clients have their own lower level g_i and their own numbers of local steps
tau_i, solved by ShroFBO (the stationary point of Phi) and SimFBO (the reweighted point of its Theorem 1):

    g_i(x, y) = 1/2 y^T A_i y - y^T B_i x - c_i^T y        f_i(x, y) = 1/2 ||y - d_i||^2 + mu/2 ||x||^2

Run:  python examples/bilevel_quadratic.py   (tests/test_bilevel_clients.py checks both points in closed form)
"""
import torch

from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.bilevel import client_problem

n, dx, dy, mu, taus = 5, 2, 3, 0.5, [1, 2, 3, 4, 5]
gen = torch.Generator().manual_seed(0)
rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
M = rand(n, dy, dy)
clients = {"A": M @ M.transpose(1, 2) / dy + torch.eye(dy, dtype=torch.float64),   # A_i > 0: g_i strongly convex
           "B": rand(n, dy, dx), "c": rand(n, dy), "d": rand(n, dy)}


def lower(i, x, y, data):   # client i's own lower level; data holds its A_i, B_i, c_i, d_i
    return 0.5 * y @ data["A"] @ y - y @ data["B"] @ x - data["c"] @ y


def upper(i, x, y, data):
    return 0.5 * (y - data["d"]).pow(2).sum() + 0.5 * mu * x.pow(2).sum()


problem = client_problem(upper, lower, x0=torch.zeros(dx, dtype=torch.float64), y0=torch.zeros(dy, dtype=torch.float64),
                         client_data=clients)
found = {}
for name in ("shrofbo", "simfbo"):   # eta = 0: every local step at the server's point, so no client drift
    params = {"tau_clients": taus, "eta_y": 0, "eta_v": 0, "eta_x": 0, "gamma_y": 0.15, "gamma_v": 0.15, "gamma_x": 0.1,
              "batch_size": None}
    result = Simulation(problem, get_algorithm(name)(params, problem), SimulationConfig(rounds=200, eval_every=200),
                        seed=0).run()
    found[name] = result.server["x"]
    print(f"{name}: x = {found[name].tolist()}, ||grad_y G|| = {result.history[-1]['lower_grad_norm']:.1e}")
