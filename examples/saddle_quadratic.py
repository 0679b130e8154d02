"""A strongly-convex-strongly-concave quadratic saddle problem, each client with its own matrices:

    min_x max_y (1/N) sum_i  1/2 x'A_i x + x'B_i y - 1/2 y'C_i y + a_i'x - c_i'y

solved by FedMM, FedSGDA and FedAvgGDA. Run: python examples/saddle_quadratic.py (tests/test_minimax_clients.py
checks the answers against the closed forms)."""
import torch

from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.families import get_algorithm
from fedsolve.families.minimax import quadratic_saddle_problem

N, DX, DY = 4, 3, 2
gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def spd(d):  # symmetric positive definite
    s = randn(d, d)
    return 0.5 * torch.eye(d, dtype=torch.float64) + 0.3 * s @ s.T / d


A, C = [spd(DX) for _ in range(N)], [spd(DY) for _ in range(N)]
B, a, c = [0.5 * randn(DX, DY) for _ in range(N)], [2 * randn(DX) for _ in range(N)], [2 * randn(DY) for _ in range(N)]
problem = quadratic_saddle_problem(A, B, C, a, c)

#: name -> (local steps M, rounds, extra parameters); full-batch steps of 0.25 for both players
RUNS = {"fedmm": (3, 70, {"eta3": 1.0}), "fedsgda": (1, 130, {}), "fedavggda": (10, 40, {})}
solutions = {}
for name, (steps, rounds, extra) in RUNS.items():
    params = {"lr": 0.25, "lr_psi": 0.25, "local_steps": steps, "batch_size": None, **extra}
    result = Simulation(problem, get_algorithm(name)(params, problem), SimulationConfig(rounds=rounds), seed=0).run()
    solutions[name] = x, y = problem.players(result.server["w"])
    print(f"{name:9s} x = {x.numpy().round(6)}  y = {y.numpy().round(6)}  f = {result.history[-1]['test_loss']:.6f}")
