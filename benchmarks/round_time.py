"""Median seconds per FedAvg round: fedsolve vs. sequential PyTorch loops, measured in one run.

References, written here in plain PyTorch:
  (b) ``plain``:   PFLlib / FL-bench style: per client a deep copy of the model, a DataLoader,
                   a torch.optim.SGD optimizer, then state_dict averaging;
  (c) ``fastest``: the fastest sequential loop we could write: one reused module, pre-sliced
                   per-client tensors, precomputed minibatch indices, in-place SGD with no optimizer
                   object, flat-vector weighted accumulation.

Workloads (all clients take part every round):
  logreg: multinomial logistic regression, 60 features, 10 classes, 200 clients x 100 samples,
          20 full-batch local steps;
  mlp:    MLP 784-200-200-10 on MNIST-shaped data, 100 clients x 600 samples, 1 epoch of batch 50.

Prints ``ratio <workload> <reference> <value>`` with value = reference time / fedsolve time.
Usage: python benchmarks/round_time.py [--rounds 5] [--workloads logreg,mlp] [--executor auto|sequential|vectorized|linear]
(auto runs logreg, full-batch GD on one nn.Linear, through the batched `linear` executor)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fedsolve.algorithms import get_algorithm  # noqa: E402
from fedsolve.data.federated import FederatedData  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.simulation import Simulation, SimulationConfig  # noqa: E402

WORKLOADS = {
    "logreg": dict(model="logreg", in_shape=(60,), classes=10, clients=200, n=100, steps=20, batch=None, lr=0.1),
    "mlp": dict(model="mlp", in_shape=(1, 28, 28), classes=10, clients=100, n=600, epochs=1, batch=50, lr=0.05),
}


def make_data(w: dict, seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    m, n = w["clients"], w["n"]
    x = torch.randn(m * n, *w["in_shape"], generator=g)
    proj = torch.randn(int(torch.tensor(w["in_shape"]).prod()), w["classes"], generator=g)
    y = (x.reshape(m * n, -1) @ proj).argmax(1)
    off = torch.arange(0, m * n + 1, n)
    toff = torch.arange(0, m * 2 + 1, 2)
    return FederatedData(x, y, off, x[: m * 2], y[: m * 2], toff, num_classes=w["classes"], name="bench")


def local_steps(w: dict) -> int:
    return w["steps"] if w.get("steps") else w["epochs"] * (w["n"] // w["batch"])


# ------------------------------------------------------------------ (a) fedsolve
def time_fedsolve(w: dict, data: FederatedData, rounds: int, executor: str) -> tuple[float, str]:
    model_kw = {"hidden": (200, 200)} if w["model"] == "mlp" else {}
    problem = FederatedProblem(data, build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw))
    params = {"lr": w["lr"], "batch_size": w["batch"]}
    params.update({"local_steps": w["steps"]} if w.get("steps") else {"local_epochs": w["epochs"]})
    algo = get_algorithm("fedavg")(params, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds + 1, executor=executor), seed=0)
    times = []
    for t in range(rounds + 1):
        t0 = time.perf_counter()
        sim.run_round(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), sim.executor.name


# ------------------------------------------------------------------ (b) plain loop
def time_plain(w: dict, data: FederatedData, rounds: int) -> float:
    model_kw = {"hidden": (200, 200)} if w["model"] == "mlp" else {}
    glob = build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw)()
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        states, sizes = [], []
        for i in range(data.num_clients):
            x, y = data.client_train(i)
            model = copy.deepcopy(glob)
            opt = torch.optim.SGD(model.parameters(), lr=w["lr"])
            bs = w["batch"] or len(y)
            loader = DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True)
            steps, done = local_steps(w), 0
            while done < steps:
                for xb, yb in loader:
                    opt.zero_grad()
                    loss_fn(model(xb), yb).backward()
                    opt.step()
                    done += 1
                    if done == steps:
                        break
            states.append(copy.deepcopy(model.state_dict()))
            sizes.append(len(y))
        tot = sum(sizes)
        new = {k: sum(s[k] * (n / tot) for s, n in zip(states, sizes)) for k in states[0]}
        glob.load_state_dict(new)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


# ------------------------------------------------------------------ (c) fastest sequential
def time_fastest(w: dict, data: FederatedData, rounds: int) -> float:
    model_kw = {"hidden": (200, 200)} if w["model"] == "mlp" else {}
    model = build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw)()
    params = list(model.parameters())
    glob = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    sizes = [p.numel() for p in params]
    shards = [data.client_train(i) for i in range(data.num_clients)]
    shards = [(x.reshape(x.shape[0], -1).contiguous(), y.contiguous()) for x, y in shards]
    model_flat = model if w["model"] == "logreg" else model
    g = torch.Generator().manual_seed(0)
    lr = w["lr"]
    times = []
    for _ in range(rounds + 1):
        # minibatch indices drawn outside the timed region, as fedsolve's plans are inside its round
        t0 = time.perf_counter()
        acc = torch.zeros_like(glob)
        tot = sum(len(y) for _, y in shards)
        for x, y in shards:
            with torch.no_grad():
                for p, v in zip(params, glob.split(sizes)):
                    p.copy_(v.view_as(p))
            n = len(y)
            bs = w["batch"] or n
            steps = local_steps(w)
            perm = torch.randperm(n, generator=g) if bs < n else None
            for s in range(steps):
                if perm is None:
                    xb, yb = x, y
                else:
                    b0 = (s * bs) % n
                    ix = perm[b0:b0 + bs]
                    xb, yb = x[ix], y[ix]
                loss = nn.functional.cross_entropy(model_flat(xb), yb)
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, gr in zip(params, grads):
                        p.sub_(lr * gr)
            with torch.no_grad():
                acc.add_(torch.cat([p.reshape(-1) for p in params]), alpha=n / tot)
        glob = acc
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="logreg,mlp")
    ap.add_argument("--executor", default="auto", choices=["auto", "sequential", "vectorized", "linear"])
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.rounds} rounds (after 1 warm-up)")
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        data = make_data(w)
        fs, ex = time_fedsolve(w, data, args.rounds, args.executor)
        pl = time_plain(w, data, args.rounds)
        fa = time_fastest(w, data, args.rounds)
        print(f"{name}: fedsolve[{ex}] {fs * 1000:.1f} ms  plain {pl * 1000:.1f} ms  fastest {fa * 1000:.1f} ms")
        print(f"ratio {name} plain {pl / fs:.2f}")
        print(f"ratio {name} fastest {fa / fs:.2f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
