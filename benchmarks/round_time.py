"""Median seconds per FedAvg round: fedsolve vs. sequential PyTorch loops, measured in one run.

References, written here in plain PyTorch:
  (b) ``plain``:   PFLlib / FL-bench style: per client a deep copy of the model, a DataLoader,
                   a torch.optim.SGD optimizer, then state_dict averaging;
  (c) ``fastest``: the fastest sequential loop we could write, the faster of two: one reused module,
                   pre-sliced per-client tensors, precomputed minibatch indices, autograd and in-place SGD with
                   no optimizer object, flat-vector weighted accumulation; and, for the Linear chains (logreg,
                   mlp), ``benchmarks/peers/handwritten.py``: hand-written forward/backward passes into
                   preallocated buffers, no autograd (the line says which one won).

Workloads (all clients take part every round):
  logreg: multinomial logistic regression, 60 features, 10 classes, 200 clients x 100 samples,
          20 full-batch local steps;
  mlp:    MLP 784-200-200-10 on MNIST-shaped data, 100 clients x 600 samples, 1 epoch of batch 50;
  lenet:  FPFC's label-swap CNN (LeNet, one fc layer) on MNIST-shaped data, 20 clients of unequal sizes
          (151 to 369 samples: seed 0 of the MNIST label-swap suite), 2 epochs of batch 100, so short last
          batches are the rule.

Prints ``ratio <workload> <reference> <value>`` with value = reference time / fedsolve time. The references run
with ``FEDSOLVE_NATIVE=0`` (LeNet's pooling is then ``torch.max_pool2d``, not the compiled kernel).
Usage: python benchmarks/round_time.py [--rounds 5] [--workloads logreg,mlp] [--executor auto,batched,vectorized]
       [--threads 1] [--skip-plain] [--repeats 3] [--clock wall|cpu] [--profile]
(auto runs logreg, full-batch GD on one nn.Linear, through the batched `linear` executor, and picks the
fastest of batched / vectorized / sequential elsewhere, and batched's chunk size, by its cached per-machine
calibration; batched runs the MLP with stacked ``bmm`` passes and LeNet as channel-stacked grouped convolutions)
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.data.federated import FederatedData  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.engine import Simulation, SimulationConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from handwritten import HandwrittenChain  # noqa: E402

#: the clock of every timing: wall time (default) or, with --clock cpu, this process's CPU time, which a busy
#: machine disturbs far less (with one thread it is the wall time of an idle machine; with more it sums them)
CLOCK = time.perf_counter

WORKLOADS = {
    "logreg": dict(model="logreg", in_shape=(60,), classes=10, clients=200, n=100, steps=20, batch=None, lr=0.1),
    "mlp": dict(model="mlp", in_shape=(1, 28, 28), classes=10, clients=100, n=600, epochs=1, batch=50, lr=0.05),
    "lenet": dict(model="lenet", in_shape=(1, 28, 28), classes=10, clients=20, epochs=2, batch=100, lr=0.01,
                  sizes=[315, 210, 288, 324, 172, 202, 339, 231, 208, 305, 369, 241, 228, 271, 237, 209, 151, 155, 246,
                         299]),
}
MODEL_KW = {"mlp": {"hidden": (200, 200)}, "lenet": {"fc_hidden": 0}}


def make_data(w: dict, seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    m = w["clients"]
    sizes = w.get("sizes") or [w["n"]] * m
    N = sum(sizes)
    x = torch.randn(N, *w["in_shape"], generator=g)
    proj = torch.randn(int(torch.tensor(w["in_shape"]).prod()), w["classes"], generator=g)
    y = (x.reshape(N, -1) @ proj).argmax(1)
    off = torch.cumsum(torch.tensor([0] + sizes), 0)
    toff = torch.arange(0, m * 2 + 1, 2)
    return FederatedData(x, y, off, x[: m * 2], y[: m * 2], toff, num_classes=w["classes"], name="bench")


def local_steps(w: dict, n: int) -> int:
    """Steps of a client with ``n`` samples: fixed, or epochs of ceil(n / batch) minibatches."""
    return w["steps"] if w.get("steps") else w["epochs"] * -(-n // w["batch"])


# ------------------------------------------------------------------ (a) fedsolve
def fedsolve_sim(w: dict, data: FederatedData, rounds: int, executor: str) -> Simulation:
    """FedAvg on workload ``w`` with ``executor`` (any name make_executor knows, ``batched`` included)."""
    model_kw = MODEL_KW.get(w["model"], {})
    problem = FederatedProblem(data, build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw))
    params = {"lr": w["lr"], "batch_size": w["batch"]}
    params.update({"local_steps": w["steps"]} if w.get("steps") else {"local_epochs": w["epochs"]})
    algo = get_algorithm("fedavg")(params, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds + 1, executor="sequential"), seed=0)
    sim.use_executor(executor)
    return sim


def profile_fedsolve(w: dict, data: FederatedData, executor: str, rows: int = 14) -> None:
    """Print where one fedsolve round's time goes (``torch.profiler``, self CPU time, after a warm-up round)."""
    from torch.profiler import profile

    sim = fedsolve_sim(w, data, 2, executor)
    sim.run_round(0)
    with profile() as prof:
        sim.run_round(1)
    print(f"profile of one round, fedsolve[{sim.executor.name}]:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def time_fedsolve(w: dict, data: FederatedData, rounds: int, executor: str) -> tuple[float, str]:
    sim = fedsolve_sim(w, data, rounds, executor)
    times = []
    for t in range(rounds + 1):
        t0 = CLOCK()
        sim.run_round(t)
        times.append(CLOCK() - t0)
    return statistics.median(times[1:]), sim.executor.name


# ------------------------------------------------------------------ (b) plain loop
def time_plain(w: dict, data: FederatedData, rounds: int) -> float:
    model_kw = MODEL_KW.get(w["model"], {})
    glob = build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw)()
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(rounds + 1):
        t0 = CLOCK()
        states, sizes = [], []
        for i in range(data.num_clients):
            x, y = data.client_train(i)
            model = copy.deepcopy(glob)
            opt = torch.optim.SGD(model.parameters(), lr=w["lr"])
            bs = w["batch"] or len(y)
            loader = DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True)
            steps, done = local_steps(w, len(y)), 0
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
        times.append(CLOCK() - t0)
    return statistics.median(times[1:])


# ------------------------------------------------------------------ (c) fastest sequential
def time_fastest(w: dict, data: FederatedData, rounds: int) -> float:
    model_kw = MODEL_KW.get(w["model"], {})
    model = build_model_fn(w["model"], data.input_shape, w["classes"], **model_kw)()
    params = list(model.parameters())
    glob = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    sizes = [p.numel() for p in params]
    shards = [data.client_train(i) for i in range(data.num_clients)]
    shards = [(x.contiguous() if w["model"] == "lenet" else x.reshape(x.shape[0], -1).contiguous(), y.contiguous())
              for x, y in shards]
    model_flat = model if w["model"] == "logreg" else model
    g = torch.Generator().manual_seed(0)
    lr = w["lr"]
    times = []
    for _ in range(rounds + 1):
        # minibatch indices drawn outside the timed region, as fedsolve's plans are inside its round
        t0 = CLOCK()
        acc = torch.zeros_like(glob)
        tot = sum(len(y) for _, y in shards)
        for x, y in shards:
            with torch.no_grad():
                for p, v in zip(params, glob.split(sizes)):
                    p.copy_(v.view_as(p))
            n = len(y)
            bs = w["batch"] or n
            steps = local_steps(w, n)
            per_epoch = -(-n // bs)
            for s in range(steps):
                if bs >= n:
                    xb, yb = x, y
                else:
                    if s % per_epoch == 0:
                        perm = torch.randperm(n, generator=g)
                    ix = perm[(s % per_epoch) * bs:(s % per_epoch + 1) * bs]
                    xb, yb = x[ix], y[ix]
                loss = nn.functional.cross_entropy(model_flat(xb), yb)
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, gr in zip(params, grads):
                        p.sub_(lr * gr)
            with torch.no_grad():
                acc.add_(torch.cat([p.reshape(-1) for p in params]), alpha=n / tot)
        glob = acc
        times.append(CLOCK() - t0)
    return statistics.median(times[1:])


def time_handwritten(w: dict, data: FederatedData, rounds: int) -> float | None:
    """(c) for the Linear chains: ``HandwrittenChain`` (no autograd), the same minibatch draws as
    :func:`time_fastest`; None for other models."""
    if w["model"] not in ("logreg", "mlp"):
        return None
    model = build_model_fn(w["model"], data.input_shape, w["classes"], **MODEL_KW.get(w["model"], {}))()
    params = list(model.parameters())
    glob = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    shards = [(x.reshape(x.shape[0], -1).contiguous(), y.contiguous())
              for x, y in (data.client_train(i) for i in range(data.num_clients))]
    net = HandwrittenChain([tuple(p.shape) for p in params], w["batch"] or max(len(y) for _, y in shards))
    g = torch.Generator().manual_seed(0)
    tot = sum(len(y) for _, y in shards)
    times = []
    for _ in range(rounds + 1):
        t0 = CLOCK()
        acc = torch.zeros_like(glob)
        for x, y in shards:
            net.P.copy_(glob)
            n = len(y)
            bs = w["batch"] or n
            per_epoch = -(-n // bs)
            for s in range(local_steps(w, n)):
                ix = None
                if bs < n:
                    if s % per_epoch == 0:
                        perm = torch.randperm(n, generator=g)
                    ix = perm[(s % per_epoch) * bs:(s % per_epoch + 1) * bs]
                net.step(x, y, ix, w["lr"])
            acc.add_(net.P, alpha=n / tot)
        glob = acc
        times.append(CLOCK() - t0)
    return statistics.median(times[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="logreg,mlp")
    ap.add_argument("--executor", default="auto",
                    help="comma-separated fedsolve executors timed in the same run (auto, sequential, vectorized, "
                         "linear, batched); ratio lines of the first are 'ratio <workload> <reference>', of the "
                         "others 'ratio <workload>:<executor> <reference>'")
    ap.add_argument("--skip-plain", action="store_true", help="do not time the (slow) plain loop")
    ap.add_argument("--repeats", type=int, default=1,
                    help="time every method this many times, interleaved, and keep each one's best median")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--ref-threads", type=int, default=None,
                    help="torch threads of the plain and fastest loops (default: --threads); e.g. fedsolve on 2 "
                         "threads against the loops at their best count, 1 on the 2-core machine")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or this process's CPU time (robust on a loaded machine; use with --threads 1)")
    ap.add_argument("--profile", action="store_true",
                    help="also print the torch.profiler table of one round of the first --executor per workload")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    ref_threads = args.ref_threads or args.threads
    print(f"torch {torch.__version__}, {args.threads} threads (loops: {ref_threads}), "
          f"median of {args.rounds} rounds (after 1 warm-up), "
          f"best of {args.repeats} interleaved repeats, {args.clock} clock")
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        data = make_data(w)
        exs = args.executor.split(",")
        fss, pl, fa, fh = [(float("inf"), "")] * len(exs), float("inf"), float("inf"), float("inf")
        for _ in range(args.repeats):   # interleaved: a load that changes over the run hits every method alike
            fss = [min(old, time_fedsolve(w, data, args.rounds, e)) for old, e in zip(fss, exs)]
            os.environ["FEDSOLVE_NATIVE"] = "0"   # the references are plain PyTorch: no compiled kernel in the model
            torch.set_num_threads(ref_threads)
            pl = None if args.skip_plain else min(pl, time_plain(w, data, args.rounds))
            fa = min(fa, time_fastest(w, data, args.rounds))
            hw = time_handwritten(w, data, args.rounds)
            fh = fh if hw is None else min(fh, hw)
            torch.set_num_threads(args.threads)
            os.environ.pop("FEDSOLVE_NATIVE")
        fast_kind = "handwritten" if fh < fa else "autograd"
        fa = min(fa, fh)
        for j, (fs, ex) in enumerate(fss):
            tag = name if j == 0 else f"{name}:{exs[j]}"
            pls = "" if pl is None else f"  plain {pl * 1000:.1f} ms"
            print(f"{tag}: fedsolve[{ex}] {fs * 1000:.1f} ms{pls}  fastest {fa * 1000:.1f} ms ({fast_kind})")
            if pl is not None:
                print(f"ratio {tag} plain {pl / fs:.2f}")
            print(f"ratio {tag} fastest {fa / fs:.2f}")
        if args.profile:
            profile_fedsolve(w, data, exs[0])
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
