"""S1 acceptance run for FPFC (spec 4.4 Table 1): 100 devices, 2000 rounds, 30% participation,
10 full-batch GD steps, lr 0.1, lam 0.6, rho 1, a 3.7, xi 1e-4, nu 0.1.

usage: python experiments/fpfc/s1_acceptance.py [--rounds 2000] [--seed 0] [--executor sequential]
"""
import argparse
import os
import time

import torch

from fedsolve.algorithms.fpfc import FPFC, LinearGDExecutor, paper_cost
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.simulation import Simulation, SimulationConfig

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=2000)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--data-seed", type=int, default=0)
p.add_argument("--executor", default="fast", help="fast (LinearGDExecutor) | sequential | vectorized")
p.add_argument("--features", default="normal")
p.add_argument("--lam", type=float, default=0.6)
p.add_argument("--eval-every", type=int, default=500)
p.add_argument("--layout", default="auto")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--size-scale", type=float, default=1.0)
p.add_argument("--profile", action="store_true")
p.add_argument("--init-std", type=float, default=None)
p.add_argument("--nu", type=float, default=0.1)
p.add_argument("--save", default=None)
a = p.parse_args()
torch.set_num_threads(a.threads)

t0 = time.perf_counter()
data = fpfc_synthetic("S1", seed=a.data_seed, features=a.features, size_scale=a.size_scale)
prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10), name="S1")
print(f"data: m={data.num_clients} n_train={int(data.train_sizes.sum())} max n_i={int(data.train_sizes.max())} "
      f"({time.perf_counter() - t0:.1f}s)")
algo = FPFC(dict(lam=a.lam, pair_layout=a.layout, init_std=a.init_std, nu=a.nu), prob)
cfg = SimulationConfig(rounds=a.rounds, eval_every=a.eval_every,
                       executor="sequential" if a.executor == "fast" else a.executor,
                       sampling={"fraction": 0.3}, metrics=[])
sim = Simulation(prob, algo, cfg, seed=a.seed)
if a.executor == "fast":
    sim.executor = LinearGDExecutor(prob)
if a.profile:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
res = sim.run()
if a.profile:
    pr.disable(); pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
for h in res.history:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in h.items()
           if k in ("round", "test_accuracy", "num_clusters", "ari", "train_loss", "time_s")})
ex = res.extras
print(f"clusters={ex['num_clusters']} sizes={ex['cluster_sizes']} ARI={ex.get('ari'):.4f} "
      f"acc={res.history[-1]['test_accuracy']:.4f} cost={paper_cost(algo, res.ledger):.4g} "
      f"wall={res.wall_time_s:.1f}s (round mean {1e3 * sum(res.round_times) / len(res.round_times):.1f} ms)")
if a.save:
    torch.save({"server": sim.server, "sizes": data.train_sizes, "truth": data.clusters,
                "history": res.history, "extras": ex}, a.save)
    N = algo.theta_norms(sim.server)
    lab = algo.cluster_labels(sim.server)
    for nu in (0.01, 0.1, 0.5, 1.0, 2.0, 3.0):
        from fedsolve.algorithms.fpfc import clusters_from_norms, adjusted_rand
        l2 = clusters_from_norms(N, nu)
        print(f"nu={nu}: clusters={l2.max() + 1} ARI={adjusted_rand(l2, data.clusters.numpy()):.4f}")
