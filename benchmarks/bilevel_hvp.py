"""SimFBO's HVP-heavy local step: all sampled clients at once (vectorized, torch.func.vmap) vs client by client.

Workload: the MNIST hyper-representation problem of SimFBO Sec. 5 (MLP 784-200-10, x = hidden layer, y = output
layer, lower-level ridge 0.1) on MNIST-shaped random data, 100 clients x 600 rows (300 lower / 300 upper, the
i.i.d. split), 10 sampled clients, batch 64, independent minibatches (5 oracle calls per local step: grad_y g,
grad2_yy g v, grad_y f, grad_x f, grad2_xy g v). The timed unit is one round's local work (``executor.run``),
median over repetitions; the four variants run interleaved in the same process on the same plans:

    executor sequential | vectorized  x  oracles autograd (torch.func double backward) | mlp (closed forms)

Prints ``ratio bilevel_hvp vectorized_vs_sequential oracles=<o> <t_seq / t_vec>`` for each oracle kind (the same
algorithm on both sides) and ``ratio bilevel_hvp vectorized_mlp_vs_sequential_autograd`` (the fastest path
against the previous per-client one), plus the largest upload difference between all variants.
Usage: python benchmarks/bilevel_hvp.py [--reps 5] [--tau 1] [--clients 10] [--threads 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from fedsolve.families import get_algorithm
from fedsolve.engine.algorithm import place_algorithm  # noqa: E402
from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor, build_plans  # noqa: E402
from fedsolve.core.rng import RngStreams  # noqa: E402
from fedsolve.data.federated import FederatedData  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.families import get_problem_kind  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402


def make_problem(clients: int = 100, n: int = 600, seed: int = 0) -> FederatedProblem:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(clients * n, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (clients * n,), generator=g)
    parts = [(x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]) for i in range(clients)]
    data = FederatedData.from_client_arrays(parts, [(a[:10], b[:10]) for a, b in parts], num_classes=10)
    base = FederatedProblem(data, build_model_fn("mlp", data.input_shape, 10, hidden=(200,)))
    return get_problem_kind("hyper_representation")(base, {"upper_fraction": 0.5, "lam": 0.1}, seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tau", type=int, default=1)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    prob = make_problem().to(dev)
    algos = {o: get_algorithm("simfbo")({"batch_size": 64, "tau": a.tau, "oracles": o}, prob)
             for o in ("autograd", "mlp")}
    if dev.type != "cpu":
        for algo in algos.values():
            place_algorithm(algo, dev)
    algo = algos["autograd"]
    rngs = RngStreams(0)
    with torch.device(dev):
        server, clients = algo.init(prob.init_params(rngs.torch("init")).to(dev), rngs)
        ids = torch.arange(a.clients) * (prob.num_clients // a.clients)
        msgs = algo.broadcast(server, ids, 0)
        rows = clients.gather(ids)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    plans = build_plans(algo.work(0), prob.data.train_offsets, ids, rngs, 0, groups=prob.data.row_groups)
    variants = [(ex, o) for o in algos for ex in ("sequential", "vectorized")]
    execs = {"sequential": SequentialExecutor(), "vectorized": VectorizedExecutor()}
    times: dict[tuple, list[float]] = {v: [] for v in variants}
    outs = {}
    with torch.enable_grad():
        for rep in range(a.reps + 1):
            for ex, o in variants:
                sync()
                t = time.perf_counter()
                outs[ex, o] = execs[ex].run(algos[o], rows, msgs, ids, plans, prob.data, 0)
                sync()
                if rep:  # rep 0 warms up
                    times[ex, o].append(time.perf_counter() - t)
    ref = outs["sequential", "autograd"][1]
    diff = max(float((outs[v][1][k] - ref[k]).abs().max()) for v in variants for k in ref)
    med = {v: statistics.median(t) for v, t in times.items()}
    print(f"# {a.device}: {a.clients} clients, tau = {a.tau}, batch 64, {a.threads} CPU thread(s), {a.reps} reps; "
          f"max |upload difference| between the variants = {diff:.2e}")
    for (ex, o), t in med.items():
        print(f"time bilevel_hvp {ex} oracles={o} {t:.4f} s")
    for o in algos:
        print(f"ratio bilevel_hvp vectorized_vs_sequential oracles={o} "
              f"{med['sequential', o] / med['vectorized', o]:.2f}")
    print(f"ratio bilevel_hvp vectorized_mlp_vs_sequential_autograd "
          f"{med['sequential', 'autograd'] / med['vectorized', 'mlp']:.2f}")


if __name__ == "__main__":
    main()
