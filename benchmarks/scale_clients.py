"""Round time and peak memory from 10 to 10,000 clients (FedAvg, SCAFFOLD, FedAPM), 10% participation.

Each configuration runs in its own process (so its peak resident memory is its own): ``rounds`` timed rounds
after one warm-up, vectorized executor, no evaluation. Per configuration it reports the median seconds per round,
the process's peak resident memory, the bytes of client state held in memory (``ClientStates.memory_bytes``), what
a dense ``[m, ...]`` client state would take, the clients with a stored row, and the server state's bytes.

Reduced size for a 2-core CPU (stated in the output): an MLP 64-32-10 (2,410 parameters), 20 samples per client,
1 epoch of batch 10. The full-size run (the MNIST MLP 784-200-200-10, 600 samples per client) is
``--full`` (a machine with tens of GB of memory and many cores, or a GPU with ``--device cuda``).

Prints ``ratio scale fedavg_10000_vs_1000_same_participants <x>`` (FedAvg round time with 10,000 clients at 10%
over 1,000 clients at 100%: the same 1,000 participants; the issue's target is <= 1.2), writes every figure as
JSON and draws the plot (``--out-dir``).

Usage: python benchmarks/scale_clients.py [--out-dir results/scale] [--sizes 10,100,1000,10000] [--rounds 3]
       [--full [--samples N]] [--batch B] [--budget-mb MB] [--chunk-size K] [--tag NAME]

Every round is also timed on the process CPU clock (``round_cpu_s``; one thread per run, so it is the run's own
work, steadier than wall time on a shared machine), and the FedAvg ratio is printed on both clocks.

``--fpfc M,K``: FPFC alone with M devices, K a round (sparse pair store, an MLP 784-200-10 whose last layer is
fused), its round times, stored pairs and peak memory as ``scale_fpfc_<M>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ALGOS = ("fedavg", "scaffold", "fedapm")
SMALL = dict(in_dim=64, hidden=(32,), classes=10, n=20, batch=10, epochs=1, lr=0.05)
FULL = dict(in_dim=784, hidden=(200, 200), classes=10, n=600, batch=50, epochs=1, lr=0.05)


def one(algo: str, m: int, per_round: int, rounds: int, w: dict, device: str, budget_mb: float | None,
        chunk: int = 1024) -> dict:
    """One configuration, in this process: its figures as a dict."""
    import torch

    from fedsolve.families import get_algorithm
    from fedsolve.data.federated import FederatedData
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem
    from fedsolve.engine import Simulation, SimulationConfig

    torch.set_num_threads(int(os.environ.get("SCALE_THREADS", "1")))
    g = torch.Generator().manual_seed(0)
    N = m * w["n"]
    x = torch.randn(N, w["in_dim"], generator=g)
    y = (x @ torch.randn(w["in_dim"], w["classes"], generator=g)).argmax(1)
    off = torch.arange(0, N + 1, w["n"])
    toff = torch.arange(0, m + 1)
    data = FederatedData(x, y, off, x[:m], y[:m], toff, num_classes=w["classes"], name="scale")
    blocks = {"personal": ["out.*"]} if algo == "fedapm" else {}
    problem = FederatedProblem(data, build_model_fn("mlp", (w["in_dim"],), w["classes"], hidden=w["hidden"]),
                               blocks=blocks)
    params = {"lr": w["lr"], "batch_size": w["batch"], "local_epochs": w["epochs"]}
    if algo == "fedapm":
        params.update(log_stationarity=False, log_other_eval=False)
    alg = get_algorithm(algo)(params, problem)
    cfg = SimulationConfig(rounds=rounds + 1, executor="vectorized", sampling={"clients_per_round": per_round},
                           metrics=[], device=device, state_memory_mb=budget_mb, chunk_size=chunk)
    sim = Simulation(problem, alg, cfg, seed=0)
    sync = torch.cuda.synchronize if sim.device.type == "cuda" else (lambda: None)
    times, cpu = [], []
    for t in range(rounds + 1):
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        sim.run_round(t)
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # before anything below allocates
    first = sim.clients.gather(torch.tensor([0]))
    row_bytes = sum(v[0].numel() * v.element_size() for v in first.values())
    touched = max([int(sim.clients.touched(k).numel()) for k in sim.clients.keys()] or [0])
    return {
        "algorithm": algo, "clients": m, "per_round": per_round, "dim": problem.layout.dim,
        "round_s_median": statistics.median(times[1:]), "round_s": times,
        "round_cpu_s_median": statistics.median(cpu[1:]), "round_cpu_s": cpu,
        "peak_rss_mb": peak_rss,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if sim.device.type == "cuda" else None,
        "state_memory_mb": sim.clients.memory_bytes() / 2**20, "state_disk_mb": sim.clients.disk_bytes() / 2**20,
        "state_dense_mb": m * row_bytes / 2**20, "clients_stored": touched,
        "server_mb": sum(v.numel() * v.element_size() for v in sim.server.values()
                         if isinstance(v, torch.Tensor)) / 2**20,
    }


def fpfc_one(m: int, per_round: int, rounds: int, n: int, chunk: int, fused: str) -> dict:
    """FPFC with ``m`` devices on MNIST-shaped data (an MLP 784-200-10; ``fused``: ``out`` fuses its last layer,
    d_f = 2,010, the rest averaged; ``all`` fuses the whole model), sparse pair store: figures as a dict."""
    import torch

    from fedsolve.families import get_algorithm
    from fedsolve.data.federated import FederatedData
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem
    from fedsolve.engine import Simulation, SimulationConfig

    torch.set_num_threads(int(os.environ.get("SCALE_THREADS", "1")))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m * n, 784, generator=g)
    y = (x @ torch.randn(784, 10, generator=g)).argmax(1)
    data = FederatedData(x, y, torch.arange(0, m * n + 1, n), x[:m], y[:m], torch.arange(0, m + 1), num_classes=10,
                         name="scale")
    blocks = {"fused": ["out.*"]} if fused == "out" else {}
    problem = FederatedProblem(data, build_model_fn("mlp", (784,), 10, hidden=(200,)), blocks=blocks)
    alg = get_algorithm("fpfc")({"lr": 0.05, "local_epochs": 1.0, "batch_size": 50, "pair_layout": "sparse"},
                                problem)
    cfg = SimulationConfig(rounds=rounds, executor="vectorized", sampling={"clients_per_round": per_round},
                           metrics=[], device="cpu", chunk_size=chunk)
    sim = Simulation(problem, alg, cfg, seed=0)
    times, pairs = [], []
    for t in range(rounds):
        t0 = time.perf_counter()
        sim.run_round(t)
        times.append(time.perf_counter() - t0)
        pairs.append(int(sim.server["pair_key"].numel()))
    t0 = time.perf_counter()
    labels = alg.cluster_labels(sim.server)
    readout_s = time.perf_counter() - t0
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    pool = sum(sim.server[k].numel() * sim.server[k].element_size() for k in ("pair_key", "delta", "scale"))
    return {"algorithm": "fpfc", "clients": m, "per_round": per_round, "dim": problem.layout.dim, "d_f": alg.df,
            "round_s": times, "pairs_stored": pairs, "all_pairs": m * (m - 1) // 2, "pair_store_mb": pool / 2**20,
            "peak_rss_mb": peak_rss, "clusters": int(labels.max() + 1), "readout_s": readout_s,
            "server_mb": sum(v.numel() * v.element_size() for v in sim.server.values()
                             if isinstance(v, torch.Tensor)) / 2**20}


def run_child(algo: str, m: int, per_round: int, args) -> dict:
    cmd = [sys.executable, __file__, "--one", f"{algo},{m},{per_round}", "--rounds", str(args.rounds),
           "--device", args.device] + (["--full"] if args.full else []) + \
        (["--budget-mb", str(args.budget_mb)] if args.budget_mb else []) + \
        (["--samples", str(args.samples)] if args.samples else []) + \
        (["--batch", str(args.batch)] if args.batch else []) + ["--chunk-size", str(args.chunk_size)]
    env = dict(os.environ)
    if args.malloc_mmap:   # blocks over 1 MB from mmap, back to the system when freed (glibc): a round's freed
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))   # buffers leave the process; slower (page faults)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{algo} m={m}: {out.stderr.strip()[-600:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, algo in enumerate(ALGOS):
        r = sorted((x for x in rows if x["algorithm"] == algo and x["per_round"] == max(1, x["clients"] // 10)),
                   key=lambda x: x["clients"])
        if not r:
            continue
        ms, c = [x["clients"] for x in r], f"C{i}"
        ax[0].plot(ms, [1000 * x["round_s_median"] / x["per_round"] for x in r], "o-", color=c, label=algo)
        ax[1].plot(ms, [x["peak_rss_mb"] for x in r], "o-", color=c, label=algo)
        if any(x["state_dense_mb"] > 0 for x in r):
            ax[2].plot(ms, [x["state_memory_mb"] for x in r], "o-", color=c, label=f"{algo}: client state stored")
            ax[2].plot(ms, [x["state_dense_mb"] for x in r], "x:", color=c, label=f"{algo}: dense [m, d] state")
        if max(x["server_mb"] for x in r) > 1:
            ax[2].plot(ms, [x["server_mb"] for x in r], "s--", color=c, label=f"{algo}: server state")
    for a, lab in zip(ax, ("ms per round per participant (median)", "peak resident memory (MB)",
                           "state (MB)")):
        a.set_xscale("log")
        a.set_xlabel("clients (10% take part per round)")
        a.set_ylabel(lab)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax[2].set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default="results/scale")
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--algorithms", default=",".join(ALGOS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--full", action="store_true", help="the MNIST MLP workload (see the module docstring)")
    ap.add_argument("--budget-mb", type=float, default=None, help="simulation.state_memory_mb of every run")
    ap.add_argument("--chunk-size", type=int, default=1024, help="simulation.chunk_size: clients per vectorized "
                                                                    "call (bounds the round's working memory)")
    ap.add_argument("--malloc-mmap", action="store_true",
                    help="MALLOC_MMAP_THRESHOLD_=1048576 in every run (lower peak memory, slower rounds)")
    ap.add_argument("--samples", type=int, default=None, help="samples per client (default: the workload's)")
    ap.add_argument("--batch", type=int, default=None, help="minibatch size (default: the workload's)")
    ap.add_argument("--tag", default=None, help="output files scale_clients_<tag>.json/.png (default: full or "
                                                 "reduced)")
    ap.add_argument("--fpfc", default=None, metavar="M,K",
                    help="FPFC alone: M devices, K per round (sparse pairs; see fpfc_one), --rounds rounds")
    ap.add_argument("--fpfc-fused", default="out", choices=("out", "all"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    w = dict(FULL if args.full else SMALL)
    if args.samples:
        w["n"] = args.samples
    if args.batch:
        w["batch"] = args.batch
    if args.fpfc:
        m, k = (int(v) for v in args.fpfc.split(","))
        r = fpfc_one(m, k, args.rounds, args.samples or 20, args.chunk_size, args.fpfc_fused)
        print(json.dumps(r))
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"scale_fpfc_{m}.json").write_text(json.dumps(r, indent=2))
        return 0
    if args.one:
        algo, m, k = args.one.split(",")
        print(json.dumps(one(algo, int(m), int(k), args.rounds, w, args.device, args.budget_mb, args.chunk_size)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    algos = args.algorithms.split(",")
    size_note = f"MNIST MLP 784-200-200-10, {w['n']} samples/client, 1 epoch of batch {w['batch']}" if args.full \
        else f"reduced: MLP 64-32-10 (2,410 parameters), {w['n']} samples/client, 1 epoch of batch {w['batch']}"
    load = os.getloadavg()
    print(f"{size_note}; 10% participation; median of {args.rounds} rounds after 1 warm-up; device {args.device}",
          flush=True)
    rows = []
    for algo in algos:
        for m in sizes:
            r = run_child(algo, m, max(1, m // 10), args)
            rows.append(r)
            print(f"{algo:9s} m={m:6d} k={r['per_round']:5d}: {r['round_s_median'] * 1000:8.1f} ms/round, peak RSS "
                  f"{r['peak_rss_mb']:7.0f} MB, client state {r['state_memory_mb']:8.2f} MB in memory "
                  f"(+{r['state_disk_mb']:.2f} MB spilled; dense would be {r['state_dense_mb']:8.1f} MB; "
                  f"{r['clients_stored']} clients stored), server {r['server_mb']:.2f} MB", flush=True)
    ratios = {}
    if "fedavg" in algos and 10_000 in sizes:
        same = run_child("fedavg", 1_000, 1_000, args)
        rows.append(same)
        big = next(r for r in rows if r["algorithm"] == "fedavg" and r["clients"] == 10_000 and r["per_round"] == 1_000)
        ratios["fedavg_10000_vs_1000_same_participants"] = big["round_s_median"] / same["round_s_median"]
        ratios["fedavg_10000_vs_1000_same_participants_cpu"] = big["round_cpu_s_median"] / same["round_cpu_s_median"]
        print(f"fedavg    m=  1000 k= 1000: {same['round_s_median'] * 1000:8.1f} ms/round (same participants as "
              f"m=10000 at 10%)")
        print(f"ratio scale fedavg_10000_vs_1000_same_participants "
              f"{ratios['fedavg_10000_vs_1000_same_participants']:.3f}")
        print(f"ratio scale fedavg_10000_vs_1000_same_participants_cpu "   # process CPU clock: steadier under load
              f"{ratios['fedavg_10000_vs_1000_same_participants_cpu']:.3f} "
              f"({big['round_cpu_s_median'] * 1000:.1f} / {same['round_cpu_s_median'] * 1000:.1f} ms CPU)")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or ("full" if args.full else "reduced")
    (out / f"scale_clients_{tag}.json").write_text(json.dumps(
        {"workload": size_note, "device": args.device, "rounds": args.rounds, "threads_per_run": 1, "rows": rows,
         "ratios": ratios, "load_average_start": load, "load_average_end": os.getloadavg()}, indent=2))
    plot(rows, out / f"scale_clients_{tag}.png", f"fedsolve: round time and memory vs clients ({size_note})")
    print(f"wrote {out / f'scale_clients_{tag}.json'} and .png", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
