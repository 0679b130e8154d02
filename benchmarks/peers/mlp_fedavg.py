"""FedAvg on the MNIST MLP (784-200-200-10): fedsolve against its peers, side by side in one run (issue 34, item 1).

Workload: 100 clients x 600 samples (MNIST's 60,000 training images, shuffled with seed 0 and dealt out in equal
shares when MNIST is in fedsolve's cache, else MNIST-shaped synthetic data), 1 epoch of batch 50 (12 SGD steps a
client), lr 0.05, every client every round. Every contender starts from the same initial weights (fedsolve's, seed
0) and uses the same minibatches: the driver reads fedsolve's minibatch orders from its random streams and hands
them to all, so the round losses agree to float rounding (printed: the largest difference to fedsolve's).

Contenders:
  fedsolve   ``Simulation.run_round`` with the ``auto`` executor and with ``batched`` (``--executors``), at each
             of ``--threads``;
  plain      a PFLlib-style loop: client objects holding a deep copy of the model, a torch.optim.SGD and a
             DataLoader, a server that deep-copies and averages the uploaded models (1 torch thread);
  fastest    the fastest sequential loop we could write (``handwritten.py``): one preallocated flat parameter
             vector and gradient buffer, hand-written forward/backward passes (``addmm``/``mm`` into preallocated
             outputs, no autograd, no DataLoader, no optimizer object), one fused update per step; at each of
             ``--threads``;
  flower     Flower's simulation engine (Ray), best of two resource settings (1 CPU per ClientApp: two at once;
             2 CPUs per ClientApp: one at a time with two threads);
  pfl        Apple's pfl-research simulator (FederatedAveraging, SimulatedBackend), best of 1 and 2 threads.
flower and pfl run from their own environment (``bash scripts/setup_peers.sh``) as subprocesses that read the same
data from an exchange folder and write their timings and loss curves as JSON (``benchmarks/peers/common.py``).

Also measured in the same run: the best matrix-multiply rate of the installed libraries (torch ``mm`` on
2048 x 2048 at 1 and 2 threads, numpy's BLAS at 1 and 2 threads, and torch ``bmm`` on the MLP's own first-layer
shape for all clients at once) and the FLOP rate each contender's round reaches. The round's work is counted as
the matrix products it needs: per sample and step, forward 2*(784*200 + 200*200 + 200*10), the same again for the
weight gradients, and 2*(200*200 + 200*10) for the back-propagated errors (none into the input): 879,200 FLOP,
52.75 GFLOP a round (the "3 x forward" convention, which also counts the input's gradient, gives 71.6).

Prints ``ratio mlp <reference> <value>`` with value = the reference's seconds per round / fedsolve's (best of its
executors and thread counts), and ``ratio mlp peak <value>`` = fedsolve's FLOP rate / the best matrix-multiply
rate. Times are medians of ``--rounds`` timed rounds after one warm-up round, the best
of ``--repeats`` interleaved runs of every contender.

Usage: python benchmarks/peers/mlp_fedavg.py [--rounds 3] [--quick] [--threads 1,2] [--executors auto,batched]
       [--skip flower,pfl] [--repeats 1] [--json results/perf/mlp_fedavg.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Exchange  # noqa: E402
from handwritten import HandwrittenChain  # noqa: E402

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.core.executor import build_plans  # noqa: E402
from fedsolve.core.rng import RngStreams  # noqa: E402
from fedsolve.data.federated import FederatedData  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.engine import Simulation, SimulationConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS_PY = HERE / ".venv" / "bin" / "python"
HIDDEN = [200, 200]
LR, BATCH, SEED = 0.05, 50, 0
LOSS_TOL = 1e-4   # same data, weights and minibatches: the round losses differ by float rounding only


def flop_per_sample(d_in: int = 784, hidden=HIDDEN, classes: int = 10) -> int:
    """Matrix-product FLOP of one sample's SGD step: forward, weight gradients, errors into every layer but the
    first."""
    dims = [d_in, *hidden, classes]
    macs = [a * b for a, b in zip(dims[:-1], dims[1:])]
    return 2 * sum(macs) * 2 + 2 * sum(macs[1:])


# ------------------------------------------------------------------ data and the exchange folder
def load_pixels(m: int, n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``m * n`` MNIST training images (flattened, in [0, 1]) shuffled with the seed, or synthetic ones."""
    try:
        from fedsolve.data.datasets import load_mnist
        d = load_mnist(download=False)
        x, y, src = d.x.reshape(len(d.y), -1), d.y, "MNIST (fedsolve cache), IID shares"
    except Exception as e:  # noqa: BLE001 - no MNIST in the cache: MNIST-shaped synthetic data
        print(f"MNIST not in the cache ({type(e).__name__}); synthetic MNIST-shaped data")
        g = np.random.default_rng(SEED)
        x = g.random((m * n, 784), dtype=np.float32)
        y = (x @ g.standard_normal((784, 10)).astype(np.float32)).argmax(1)
        src = "synthetic MNIST-shaped (uniform pixels, labels of a random linear map)"
    idx = np.random.default_rng(SEED).permutation(len(y))[: m * n]
    return np.ascontiguousarray(x[idx], dtype=np.float32), y[idx].astype(np.int64), src


def make_problem(x: np.ndarray, y: np.ndarray, m: int) -> FederatedProblem:
    n = len(y) // m
    xt = torch.from_numpy(x).reshape(-1, 1, 28, 28)
    yt = torch.from_numpy(y)
    off = torch.arange(0, m * n + 1, n)
    toff = torch.arange(0, 2 * m + 1, 2)
    data = FederatedData(xt, yt, off, xt[: 2 * m], yt[: 2 * m], toff, num_classes=10, name="mnist-mlp-bench")
    return FederatedProblem(data, build_model_fn("mlp", (1, 28, 28), 10, hidden=tuple(HIDDEN)))


def fedsolve_sim(problem: FederatedProblem, rounds: int) -> Simulation:
    algo = get_algorithm("fedavg")({"lr": LR, "batch_size": BATCH, "local_epochs": 1}, problem)
    return Simulation(problem, algo, SimulationConfig(rounds=rounds, executor="sequential"), seed=SEED)


def write_exchange(folder: Path, x, y, problem, rounds: int, m: int, src: str) -> None:
    """The data, fedsolve's initial weights and its minibatch orders (stream ``batches``, per round and client)."""
    n = len(y) // m
    sim = fedsolve_sim(problem, rounds)
    w0 = problem.layout.unflatten(sim.server["w"])
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    np.savez(folder / "w0.npz", **{f"p{i}": w0[e.name].numpy() for i, e in enumerate(problem.layout.entries)})
    rngs = RngStreams(SEED)
    perms = np.stack([np.stack([rngs.numpy("batches", r, i, "train").permutation(n) for i in range(m)])
                      for r in range(rounds)]).astype(np.int32)
    np.save(folder / "perms.npy", perms)
    (folder / "meta.json").write_text(json.dumps({"clients": m, "samples": n, "hidden": HIDDEN, "lr": LR,
                                                  "batch": BATCH, "rounds": rounds, "data": src}))


# ------------------------------------------------------------------ (a) fedsolve
def run_fedsolve(problem, rounds: int, executor: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    sim = fedsolve_sim(problem, rounds)
    sim.use_executor(executor)
    times, losses, steps = [], [], []
    for t in range(rounds):
        plans = build_plans(sim.algo.work(t), problem.data.train_offsets, torch.arange(problem.num_clients),
                            sim.rngs, t)   # the plans the round draws (same streams), to count its SGD steps
        steps.append(int(sum(int(p.active.sum()) for p in plans.values())))
        t0 = time.perf_counter()
        info = sim.run_round(t)
        times.append(time.perf_counter() - t0)
        losses.append(info["train_loss"])
    return {"round_s": times, "loss": losses, "steps": steps, "w": sim.server["w"].detach().clone(),
            "config": f"executor {executor} ({sim.executor.name}), {threads} thread(s)"}


# ------------------------------------------------------------------ (b) plain PFLlib-style loop
class PlainClient:
    """A client as PFLlib writes one: its own model copy, optimizer and DataLoader."""

    def __init__(self, x, y, model: nn.Module, lr: float, batch: int):
        self.model = copy.deepcopy(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.loss = nn.CrossEntropyLoss()
        self.dataset = TensorDataset(x, y)
        self.batch = batch
        self.n = len(y)

    def set_parameters(self, model: nn.Module) -> None:
        for new, old in zip(model.parameters(), self.model.parameters()):
            old.data = new.data.clone()

    def train(self, order) -> tuple[torch.Tensor, int]:
        loader = DataLoader(self.dataset, batch_size=self.batch, sampler=order.tolist())   # the round's order
        self.model.train()
        total, steps = torch.zeros(()), 0
        for xb, yb in loader:
            loss = self.loss(self.model(xb), yb)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total += loss.detach()
            steps += 1
        return total / steps, steps


def run_plain(ex: Exchange, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    glob = ex.model()
    clients = [PlainClient(*ex.client(i), glob, ex.lr, ex.batch) for i in range(ex.m)]
    times, losses, steps = [], [], []
    for r in range(ex.perms.shape[0]):
        t0 = time.perf_counter()
        ls, st = [], 0
        for i, c in enumerate(clients):
            c.set_parameters(glob)
            loss, s = c.train(ex.order(r, i))
            ls.append(loss)
            st += s
        tot = sum(c.n for c in clients)
        glob = copy.deepcopy(clients[0].model)   # the server: aggregate the uploaded models
        for p in glob.parameters():
            p.data.zero_()
        for c in clients:
            for gp, cp in zip(glob.parameters(), c.model.parameters()):
                gp.data += cp.data.clone() * (c.n / tot)
        times.append(time.perf_counter() - t0)
        losses.append(float(torch.stack(ls).double().mean()))
        steps.append(st)
    w = torch.cat([p.detach().reshape(-1) for p in glob.parameters()])
    return {"round_s": times, "loss": losses, "steps": steps, "w": w, "config": f"{threads} thread(s)"}


# ------------------------------------------------------------------ (c) fastest sequential loop
def run_fastest(ex: Exchange, threads: int) -> dict:
    """One client after another with ``handwritten.HandwrittenChain`` (preallocated, no autograd)."""
    torch.set_num_threads(threads)
    glob = torch.cat([w.reshape(-1) for w in ex.w0])
    net = HandwrittenChain([tuple(w.shape) for w in ex.w0], ex.batch)
    xs = [ex.client(i) for i in range(ex.m)]
    tot = sum(len(y) for _, y in xs)
    times, losses, steps = [], [], []
    for r in range(ex.perms.shape[0]):
        t0 = time.perf_counter()
        acc = torch.zeros_like(glob)
        lsum, st = torch.zeros((), dtype=torch.float64), 0
        for i, (x, y) in enumerate(xs):
            net.P.copy_(glob)
            order = torch.from_numpy(ex.order(r, i).astype(np.int64))
            for b0 in range(0, len(y), ex.batch):
                lsum += net.step(x, y, order[b0:b0 + ex.batch], ex.lr)
                st += 1
            acc.add_(net.P, alpha=len(y) / tot)
        glob = acc
        times.append(time.perf_counter() - t0)
        losses.append(float(lsum) / st)
        steps.append(st)
    return {"round_s": times, "loss": losses, "steps": steps, "w": glob, "config": f"{threads} thread(s)"}


# ------------------------------------------------------------------ (d), (e) peers in their own environment
def run_peer(script: str, exchange: Path, args: list[str], timeout: float) -> dict | None:
    out = exchange / f"{script}-{'-'.join(a.strip('-') for a in args)}.json"
    cmd = [str(PEERS_PY), str(HERE / f"{script}_mlp.py"), str(exchange), str(out), *args]
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", RAY_DEDUP_LOGS="0", PYTHONWARNINGS="ignore")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  {script} {' '.join(args)}: timed out after {timeout:.0f} s")
        return None
    if p.returncode != 0 or not out.is_file():
        tail = "\n    ".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        print(f"  {script} {' '.join(args)}: failed (exit {p.returncode}):\n    {tail}")
        return None
    res = json.loads(out.read_text())
    res["w"] = torch.from_numpy(np.load(f"{out}.w.npy"))
    return res


# ------------------------------------------------------------------ matrix-multiply peak
def best_rate(fn, flop: float, reps: int = 5) -> float:
    fn()
    best = min(_timed(fn) for _ in range(reps))
    return flop / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def matmul_peak(threads: list[int], m: int) -> dict[str, float]:
    """GFLOP/s of float32 matrix products: torch mm 2048^3 and the MLP's first layer for all clients (bmm
    [m,50,784] x [m,784,200]) per thread count, numpy's BLAS 2048^3 per thread count."""
    from threadpoolctl import threadpool_limits
    rates = {}
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    xa, xb = torch.randn(m, BATCH, 784), torch.randn(m, 784, HIDDEN[0])
    na, nb = a.numpy(), b.numpy()
    for t in threads:
        torch.set_num_threads(t)
        rates[f"torch mm 2048, {t} thread(s)"] = best_rate(lambda: torch.mm(a, b), 2 * n ** 3)
        rates[f"torch bmm {m}x50x784x200 (MLP layer 1), {t} thread(s)"] = best_rate(
            lambda: torch.bmm(xa, xb), 2 * m * BATCH * 784 * HIDDEN[0])
        with threadpool_limits(limits=t, user_api="blas"):
            rates[f"numpy matmul 2048, {t} thread(s)"] = best_rate(lambda: na @ nb, 2 * n ** 3)
    return rates


# ------------------------------------------------------------------ driver
def summary(res: dict, timed: slice) -> float:
    return statistics.median(res["round_s"][timed])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up round)")
    ap.add_argument("--quick", action="store_true", help="20 clients, 2 timed rounds (a smoke run, not the figures)")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--threads", default="1,2", help="thread counts of fedsolve and the fastest loop")
    ap.add_argument("--executors", default="auto,batched")
    ap.add_argument("--skip", default="", help="comma-separated contenders not to run: plain,fastest,flower,pfl")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every contender (and the matrix-multiply probe) this many times, interleaved, and keep "
                         "each one's best median")
    ap.add_argument("--peer-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None, help="write every figure here (e.g. results/perf/mlp_fedavg.json)")
    args = ap.parse_args(argv)
    m, timed_rounds = (20, 2) if args.quick else (args.clients, args.rounds)
    rounds = timed_rounds + 1
    timed = slice(1, None)
    threads = [int(t) for t in args.threads.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    n = 600
    x, y, src = load_pixels(m, n)
    problem = make_problem(x, y, m)
    load0 = os.getloadavg()
    print(f"fedsolve peer benchmark, MNIST MLP 784-{'-'.join(map(str, HIDDEN))}-10: {m} clients x {n} samples "
          f"({src}), 1 epoch of batch {BATCH}, lr {LR}, all clients, median of {timed_rounds} rounds after 1 "
          f"warm-up; torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load0[0]:.2f}")
    sys.stdout.flush()
    results: dict[str, dict] = {}      # per contender, its run with the best median
    medians: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="fedsolve-peers-") as tmp:
        folder = Path(tmp)
        write_exchange(folder, x, y, problem, rounds, m, src)
        ex = Exchange(folder)
        runs: list[tuple[str, object]] = []   # (name, function returning a result): every repeat runs them all
        for e in args.executors.split(","):
            for t in threads:
                runs.append((f"fedsolve[{e}] {t}t", lambda e=e, t=t: run_fedsolve(problem, rounds, e, t)))
        if "plain" not in skip:
            runs.append(("plain 1t", lambda: run_plain(ex, 1)))
        if "fastest" not in skip:
            runs += [(f"fastest {t}t", lambda t=t: run_fastest(ex, t)) for t in threads]
        peers = [("flower", f"--client-cpus={c}", f"flower {c}c") for c in (1, 2)] * ("flower" not in skip)
        peers += [("pfl", f"--threads={t}", f"pfl {t}t") for t in (1, 2)] * ("pfl" not in skip)
        if peers and not PEERS_PY.is_file():
            print("flower / pfl skipped: their environment is missing (bash scripts/setup_peers.sh)")
            peers = []
        runs += [(name, lambda s=s_, a=a: run_peer(s, folder, [a], args.peer_timeout)) for s_, a, name in peers]
        rates: dict[str, float] = {}
        for rep in range(args.repeats):   # interleaved: a load that changes over the run hits every contender alike
            for name, fn in runs:
                res = fn()
                if res is None:
                    continue
                medians.setdefault(name, []).append(summary(res, timed))
                if name not in results or summary(res, timed) < summary(results[name], timed):
                    results[name] = res
            for k, v in matmul_peak(threads, m).items():
                rates[k] = max(v, rates.get(k, 0.0))
            print(f"repeat {rep + 1}/{args.repeats} done, load average {os.getloadavg()[0]:.2f}")
            sys.stdout.flush()
    load1 = os.getloadavg()

    # ---------------------------------------------------------- checks: steps, losses, final weights
    ref = results[next(k for k in results if k.startswith("fedsolve"))]
    gflop = flop_per_sample() * m * n / 1e9
    print(f"\n{'contender':<22} {'s/round':>8} {'GFLOP/s':>8} {'steps':>6} {'max|dloss|':>10} {'max|dw|':>9}  config")
    table = {}
    for k, res in results.items():
        s = summary(res, timed)
        dl = max(abs(a - b) for a, b in zip(res["loss"], ref["loss"]))
        dw = float((res["w"].double() - ref["w"].double()).abs().max())
        table[k] = {"s_per_round": s, "gflops": gflop / s, "steps": res["steps"], "loss": res["loss"],
                    "max_loss_diff": dl, "max_weight_diff": dw, "round_s": res["round_s"],
                    "medians_per_repeat": medians[k],
                    "config": res.get("config", ""), "version": res.get("version")}
        print(f"{k:<22} {s:8.3f} {gflop / s:8.1f} {res['steps'][0]:6d} {dl:10.2e} {dw:9.2e}  {res.get('config', '')}")
        if res["steps"] != ref["steps"]:
            print(f"  CHECK FAILED: {k} did {res['steps']} SGD steps per round, fedsolve {ref['steps']}")
        if not dl < LOSS_TOL:
            print(f"  CHECK FAILED: {k}'s round losses differ from fedsolve's by {dl:.2e} (tolerance {LOSS_TOL})")
    peak_name, peak = max(rates.items(), key=lambda kv: kv[1])
    print("\nmatrix-multiply rates (GFLOP/s, best of 5):")
    for k, v in rates.items():
        print(f"  {k:<48} {v:7.1f}")
    print(f"round work: {gflop:.2f} GFLOP ({flop_per_sample():,} FLOP per sample and step)")

    def best(prefix: str) -> tuple[str, float] | None:
        c = [(k, table[k]["s_per_round"]) for k in table if k.startswith(prefix)]
        return min(c, key=lambda kv: kv[1]) if c else None

    fs_name, fs = best("fedsolve")
    print(f"\nfedsolve best: {fs_name} {fs:.3f} s/round; peak {peak:.1f} GFLOP/s ({peak_name}); "
          f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    ratios = {}
    for refname in ("fastest", "plain", "flower", "pfl"):
        b = best(refname)
        if b is not None:
            ratios[refname] = b[1] / fs
            print(f"ratio mlp {refname} {ratios[refname]:.2f}")
    ratios["peak"] = gflop / fs / peak
    print(f"ratio mlp peak {ratios['peak']:.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "workload": {"clients": m, "samples": n, "batch": BATCH, "lr": LR, "epochs": 1, "hidden": HIDDEN,
                         "data": src, "timed_rounds": timed_rounds, "warmup_rounds": 1},
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "load_average_start": load0, "load_average_end": load1},
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                         **{k.split()[0]: v["version"] for k, v in table.items() if v.get("version")}},
            "round_gflop": gflop, "matmul_gflops": rates, "peak": [peak_name, peak],
            "contenders": table, "ratios": ratios, "fedsolve_best": fs_name}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
