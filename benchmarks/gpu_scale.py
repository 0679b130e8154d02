"""fedsolve on a GPU: vectorized vs sequential executor, and clients per second from 100 to 10,000 clients.

Measured in one run on one device (``torch.cuda.synchronize`` around every timed round; median over the timed
rounds after one warm-up round):

  gpu_mlp:    FedAvg on the MNIST-shaped MLP 784-200-200-10 of ``round_time.py``: 100 clients x 600 samples,
              1 epoch of batch 50 (12 steps), all clients every round; vectorized vs sequential executor;
  gpu_lenet:  FedAvg on ``round_time.py``'s LeNet workload (20 clients of 151 to 369 samples, 2 epochs of
              batch 100); vectorized vs sequential executor;
  scale:      the MLP workload with 10,000 clients, 100 / 1,000 / 10,000 of them sampled per round (vectorized,
              at most ``--chunk-size`` clients per vmapped call): seconds per round, clients per second, the
              share of the round spent drawing the minibatch plans on the CPU, and the peak GPU memory.

The data are synthetic (random MNIST-shaped images, labels from a random linear map), generated on the device.
Prints ``ratio gpu_mlp vectorized_vs_sequential <x>`` (sequential time / vectorized time; the issue's target is
>= 10), ``ratio gpu_lenet vectorized_vs_sequential <x>``, ``clients_per_s gpu_mlp <K> <x>`` and
``round_s gpu_mlp <K> <x>`` lines (target: 1,000 sampled clients in under 1 s), and writes every figure as JSON
to ``--out``.

Usage: python benchmarks/gpu_scale.py --out gpu_scale.json            (a GPU; about 1-2 minutes on an H100)
       python benchmarks/gpu_scale.py --smoke --out smoke.json        (tiny sizes, runs on the CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from round_time import MODEL_KW, WORKLOADS  # noqa: E402  (the same workloads as the CPU benchmark)

from fedsolve.families import get_algorithm  # noqa: E402
from fedsolve.core.executor import build_plans  # noqa: E402
from fedsolve.data.federated import FederatedData  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.engine import Simulation, SimulationConfig  # noqa: E402
from fedsolve.engine.sampling import sample_clients  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_data(w: dict, device: torch.device, clients: int | None = None, n: int | None = None,
              seed: int = 0) -> FederatedData:
    """Synthetic data of workload ``w`` generated on ``device`` (offsets and weights on the CPU)."""
    if clients is None and w.get("sizes"):
        sizes = list(w["sizes"])
    else:
        sizes = [n or w["n"]] * (clients or w["clients"])
    m, N = len(sizes), sum(sizes)
    torch.manual_seed(seed)   # seeds the device's generator too
    x = torch.randn(N, *w["in_shape"], device=device)
    proj = torch.randn(x[0].numel(), w["classes"], device=device)
    y = (x.reshape(N, -1) @ proj).argmax(1)
    off = torch.cumsum(torch.tensor([0] + list(sizes)), 0)
    toff = torch.arange(0, 2 * m + 1, 2)
    return FederatedData(x, y, off, x[: 2 * m], y[: 2 * m], toff, num_classes=w["classes"], name="gpu-bench")


def make_sim(w: dict, data: FederatedData, executor: str, device: torch.device, per_round: int | None = None,
             chunk_size: int | None = None) -> Simulation:
    problem = FederatedProblem(data, build_model_fn(w["model"], data.input_shape, w["classes"],
                                                    **MODEL_KW.get(w["model"], {})))
    params = {"lr": w["lr"], "batch_size": w["batch"], "local_epochs": w["epochs"]}
    algo = get_algorithm("fedavg")(params, problem)
    sampling = {"clients_per_round": per_round} if per_round else {}
    cfg = SimulationConfig(rounds=1000, executor=executor, device=str(device), chunk_size=chunk_size,
                           sampling=sampling, metrics=[])
    return Simulation(problem, algo, cfg, seed=0)


def time_rounds(sim: Simulation, rounds: int) -> tuple[float, list[float]]:
    """Median seconds per round over ``rounds`` rounds after one warm-up round (each synchronized)."""
    times = []
    for t in range(rounds + 1):
        sync(sim.device)
        t0 = time.perf_counter()
        sim.run_round(t)
        sync(sim.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), times


def plan_seconds(sim: Simulation, t: int) -> float:
    """Seconds to sample round ``t``'s clients and draw (and stack) their minibatch plans on the CPU."""
    t0 = time.perf_counter()
    data = sim.problem.data
    ids = sample_clients(sim.cfg.sampling, data.num_clients, data.weights, sim.rngs.numpy("sampling", t))
    plans = build_plans(sim.algo.work(t), data.train_offsets, ids, sim.rngs, t)
    for p in plans.values():
        p.idx   # noqa: B018  (the stacked index is built lazily)
    return time.perf_counter() - t0


def executor_pair(name: str, w: dict, device: torch.device, rounds: int, out: dict) -> None:
    data = make_data(w, device)
    res = {}
    for ex in ("vectorized", "sequential"):
        sim = make_sim(w, data, ex, device)
        med, times = time_rounds(sim, rounds)
        res[ex] = {"round_s_median": med, "round_s": times}
        print(f"{name}: {ex} {med * 1000:.1f} ms per round ({data.num_clients} clients)", flush=True)
        del sim
    ratio = res["sequential"]["round_s_median"] / res["vectorized"]["round_s_median"]
    res["ratio_vectorized_vs_sequential"] = ratio
    out["workloads"][name] = res
    print(f"ratio {name} vectorized_vs_sequential {ratio:.2f}", flush=True)


def scale(w: dict, device: torch.device, population: int, points: list[int], rounds: int, chunk_size: int,
          out: dict) -> None:
    data = make_data(w, device, clients=population)
    rows = []
    for k in points:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        sim = make_sim(w, data, "vectorized", device, per_round=k, chunk_size=chunk_size)
        med, times = time_rounds(sim, rounds)
        plan = plan_seconds(sim, 0)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        row = {"sampled_clients": k, "population": population, "round_s_median": med, "round_s": times,
               "clients_per_s": k / med, "plan_s": plan, "peak_gpu_memory_gib": peak, "chunk_size": chunk_size}
        rows.append(row)
        print(f"round_s gpu_mlp {k} {med:.4f}", flush=True)
        print(f"clients_per_s gpu_mlp {k} {k / med:.1f}", flush=True)
        print(f"scale: {k} of {population} clients: {med:.3f} s per round (of which {plan:.3f} s minibatch plans on "
              f"the CPU), peak GPU memory {peak if peak is None else round(peak, 2)} GiB", flush=True)
        del sim
    out["scale"] = rows
    at = [r for r in rows if r["sampled_clients"] == 1000]
    if at:
        out["target_1000_clients_under_1s"] = at[0]["round_s_median"] < 1.0
        print(f"target gpu_mlp 1000_clients_round_under_1s {at[0]['round_s_median'] < 1.0}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file for every figure")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (runs on the CPU in seconds)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu allowed with --smoke)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per measurement (after one warm-up)")
    ap.add_argument("--chunk-size", type=int, default=2000, help="max clients per vmapped call in the scale runs")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: mlp, lenet, scale")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() or not args.smoke else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_scale.py: no CUDA device here; use --smoke (CPU, tiny sizes) or run it on a GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    mlp, lenet = dict(WORKLOADS["mlp"]), dict(WORKLOADS["lenet"])
    population, points = 10_000, [100, 1_000, 10_000]
    if args.smoke:   # the same code paths at toy sizes
        torch.set_num_threads(1)
        mlp.update(clients=4, n=100)
        lenet.update(sizes=[120, 80, 100])
        population, points = 40, [10, 20, 40]
        args.rounds = min(args.rounds, 2)
        args.chunk_size = min(args.chunk_size, 16)
    out: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or
                 "cpu", "torch": torch.__version__, "smoke": args.smoke, "rounds": args.rounds,
                 "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
                 "workloads": {}}
    print(f"device {out['device']}, torch {torch.__version__}, median of {args.rounds} rounds after 1 warm-up"
          f"{' (smoke sizes)' if args.smoke else ''}", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    parts = [("mlp", lambda: executor_pair("gpu_mlp", mlp, device, args.rounds, out)),
             ("lenet", lambda: executor_pair("gpu_lenet", lenet, device, args.rounds, out)),
             ("scale", lambda: scale(mlp, device, population, points, max(1, args.rounds - 1), args.chunk_size, out))]
    failed = []
    for name, run in parts:
        if name in skip:
            continue
        try:
            run()
        except Exception as e:   # noqa: BLE001  (one part's failure must not lose the others' figures)
            failed.append(name)
            out.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["total_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"total {out['total_s']:.1f} s; figures in {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
