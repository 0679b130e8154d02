"""Seconds per FPFC round on synthetic S1 at the paper's sizes: fedsolve vs. a plain PyTorch loop.

Workload: scenario S1 (m = 100 devices in 4 clusters, n_i from 250 to 25,810, U[0,1)^60 features),
multinomial logistic regression (d = 610), 30% participation, 10 full-batch GD steps, lr 0.1,
lambda 0.6, rho 1 (spec fpfc.md 2.15).

Reference, written here in plain PyTorch the way the paper's scripts are organized: a Python loop
over the active devices (autograd on a reused ``nn.Linear``, 10 GD steps toward zeta_i), then a
Python loop over the pairs (i in A_k, j != i) with the scalar SCAD prox (eq. 6). It runs
``--ref-rounds`` rounds; fedsolve runs ``--rounds`` rounds (default 2,000, the README's full run)
once per ``--kernels`` entry (``simulation.linear_kernel``: ``auto`` = the compiled kernels where a C
compiler is found; ``torch`` = batched matrix products and the tensor pair update, i.e. the engine
without compiled code). Prints each full-run wall time and ``ratio fpfc_s1 reference <value>`` with
value = reference seconds per round / fedsolve seconds per round (first kernel), both measured in
this process.

Usage: python benchmarks/fpfc_s1.py [--rounds 2000] [--ref-rounds 10] [--threads 2] [--kernels auto torch]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from fedsolve.families.clustered.fpfc import FPFC, prox_scale
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

LAM, RHO, LR, STEPS, FRACTION = 0.6, 1.0, 0.1, 10, 0.3


def reference_rounds(data, rounds: int, seed: int = 0) -> list[float]:
    """Seconds per round of the plain loop (per-device autograd, per-pair Python prox)."""
    m, d_in, C = data.num_clients, 60, 10
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(d_in, C)
    d = d_in * C + C
    W = torch.randn(m, d, generator=g) * 0.1
    theta = torch.zeros(m, m, d)
    V = torch.zeros(m, m, d)
    xs = [data.client_train(i)[0] for i in range(m)]
    ys = [data.client_train(i)[1] for i in range(m)]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        A = torch.randperm(m, generator=g)[: int(FRACTION * m)].tolist()
        zeta = {i: (W + theta[i] - V[i] / RHO).mean(0) for i in A}
        for i in A:                                             # local updates, one device at a time
            w = W[i].clone()
            for _ in range(STEPS):
                model.weight.data = w[: d_in * C].view(C, d_in).clone().requires_grad_()
                model.bias.data = w[d_in * C:].clone().requires_grad_()
                model.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(xs[i]), ys[i])
                loss.backward()
                grad = torch.cat([model.weight.grad.flatten(), model.bias.grad])
                w = w - LR * (grad + RHO * (w - zeta[i]))
            W[i] = w
        done = set()
        for i in A:                                             # server: one pair at a time
            for j in range(m):
                if j == i or (j, i) in done:
                    continue
                done.add((i, j))
                delta = W[i] - W[j] + V[i, j] / RHO
                s = float(prox_scale(delta.norm().view(1), LAM, RHO))
                theta[i, j] = s * delta
                V[i, j] = V[i, j] + RHO * (W[i] - W[j] - theta[i, j])
                theta[j, i], V[j, i] = -theta[i, j], -V[i, j]
        times.append(time.perf_counter() - t0)
    return times


def run_fedsolve(data, rounds: int, kernel: str) -> tuple[float, dict, dict]:
    """Wall seconds of ``rounds`` FPFC rounds (evaluation at the end included), last record, kernels used."""
    prob = FederatedProblem(data, build_model_fn("logreg", (60,), 10), name="S1")
    algo = FPFC(dict(lam=LAM, rho=RHO, lr=LR, local_epochs=STEPS, batch_size=None, init_std=0.1), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=rounds, executor="auto",
                                                  linear_kernel=kernel, sampling={"fraction": FRACTION},
                                                  metrics=[]), seed=0)
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    return wall, res.history[-1], {"executor": sim.executor.kernel, "pairs": algo.pair_kernel}


def _label(kernels: dict) -> str:
    """'native' or 'torch' when both loops ran on that kernel, else 'executor+pairs'."""
    e, p = kernels["executor"], kernels["pairs"]
    return e if e == p else f"{e}+{p}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--ref-rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size-scale", type=float, default=1.0)
    p.add_argument("--kernels", nargs="+", default=["auto"], choices=["auto", "native", "torch"])
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=a.size_scale)
    out: dict = {"rounds": a.rounds, "runs": {}}
    for kernel in a.kernels:
        wall, last, used = run_fedsolve(data, a.rounds, kernel)
        out["runs"][kernel] = {"wall_s": wall, "s_per_round": wall / a.rounds, "kernels": used,
                               "test_accuracy": last.get("test_accuracy"),
                               "num_clusters": last.get("num_clusters"), "ari": last.get("ari")}
        print(f"fedsolve FPFC (local GD: {used['executor']}, pair update: {used['pairs']}), S1 paper sizes, {a.rounds} rounds, {a.threads} threads: "
              f"{wall:.1f} s ({1e3 * wall / a.rounds:.1f} ms per round, evaluation included); accuracy "
              f"{last.get('test_accuracy'):.4f}, {last.get('num_clusters')} clusters, ARI {last.get('ari')}")
    ref = statistics.median(reference_rounds(data, a.ref_rounds))
    first = out["runs"][a.kernels[0]]
    out.update(wall_s=first["wall_s"], ours_s_per_round=first["s_per_round"], ref_s_per_round=ref,
               ratio=ref / first["s_per_round"], ref_full_run_estimate_s=ref * a.rounds,
               test_accuracy=first["test_accuracy"], num_clusters=first["num_clusters"], ari=first["ari"])
    print(f"plain loop: {1e3 * ref:.0f} ms per round (median of {a.ref_rounds}); full run ~{ref * a.rounds:.0f} s")
    for kernel, r in out["runs"].items():
        print(f"ratio fpfc_s1_{_label(r['kernels'])} reference {ref / r['s_per_round']:.1f}")
    if len(out["runs"]) > 1:
        w = {_label(r["kernels"]): r["wall_s"] for r in out["runs"].values()}
        if "native" in w and "torch" in w:
            print(f"ratio fpfc_s1 native_vs_torch {w['torch'] / w['native']:.2f}")
    print(f"ratio fpfc_s1 reference {out['ratio']:.1f}")
    return out


if __name__ == "__main__":
    main()
