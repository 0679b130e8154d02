"""The five families' paper workloads: fedsolve against a plain and the fastest client-by-client loop, side by side
in one run (issue 34, item 1, second bullet).

For each family (``family_<name>.py`` says the workload and the two references):

  fedsolve   the algorithm through the engine: ``Simulation.run_round`` with the ``auto`` executor (what a user
             gets; the line names the executor it picked) from the simulation's own initial state;
  plain      a PFLlib-style loop: client by client, torch.nn modules and torch.optim, one Python loop, as a
             typical FL library writes that algorithm;
  fastest    the fastest sequential loop we could write in plain torch (client by client, no fedsolve).

Every reference starts from fedsolve's initial state and follows fedsolve's schedule (the clients of every round
and their minibatches, read from fedsolve's random streams: ``family_common.schedule``), so all three compute the
same rounds; after the last round each reference's state is compared with fedsolve's (``max |a - b| / max(1,
max |a|)`` over the state tensors, the family's tolerance) and a ratio is printed ONLY when it agrees.

Times: each contender runs the family's rounds from scratch, contenders interleaved, ``--repeats`` times; a run's
figure is the median of its rounds after the first (the first is the warm-up) or, for a run to a stopping test
(the constrained solver), the seconds of all its rounds; the reported figure is the median over the repeats.
``--threads 1,2`` times every contender at each thread count (interleaved too) and reports each at the count that
suits it best: "on 2 cores" then means every contender given both cores and its best use of them. OpenMP's wait
policy is process-wide and read when torch loads: the script keeps ``OMP_WAIT_POLICY`` from the environment
(PASSIVE when unset, as the ``fedsolve`` command does); run it once more with ``OMP_WAIT_POLICY=ACTIVE`` for a
loop whose many small products gain from spinning threads.
Prints ``ratio <family> plain <x>`` and ``ratio <family> fastest <x>`` with x = the reference's seconds /
fedsolve's with the first of ``--executors`` (default ``auto``; x > 1: fedsolve is faster),
``ratio <family>:<executor> <reference> <x>`` the same against another fedsolve executor timed in the run (e.g.
``vectorized``), the load average at the start and the end, and a machine line (the CPU's model, the cost of one
small torch op, a 512 x 512 product's rate: ``family_common.machine_profile``; ratios move between machines with
the first), and ``ratio <family> sequential <x>`` when ``sequential`` is one of the other executors (its seconds /
the headline executor's). The exit status is 1 when any check failed.

``--device cuda`` (issue 48, item 2) runs every contender on the GPU: fedsolve's simulation with
``simulation.device`` set, the references with their data placed there and the tensors they create made there
(``family_common.on``), every round timed after ``torch.cuda.synchronize`` (``family_common.clock``), all in plain
float32 (TF32 off, fedsolve's default). The issue's figures: ``--device cuda --executors vectorized,sequential``
(``ratio <family> sequential`` >= 10, ``ratio <family> plain`` >= 5).

Usage: python benchmarks/peers/families.py [--families fedapm,fpfc,constrained,simfbo,fedmm] [--repeats 3]
       [--smoke] [--threads 1 | 1,2] [--executors auto,vectorized] [--json results/perf/families.json]
       [--perturb fedapm:plain] [--qp 300,3,3] [--device cpu | cuda[:N]]
(``--perturb <family>:<contender>`` changes that reference's step size by 1%: its check must then fail; the
test of this benchmark uses it.)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from family_common import Family, machine_profile, rel_diff  # noqa: E402

FAMILIES = ("fedapm", "fpfc", "constrained", "simfbo", "fedmm")


def figure(fam: Family, round_s: list[float]) -> float:
    """A run's seconds: the median round after the first, or all rounds for a run to a stopping test."""
    return sum(round_s) if fam.unit == "run" else statistics.median(round_s[1:])


def run_family(fam: Family, repeats: int, threads: tuple[int, ...] = (1,)) -> dict:
    """Every contender ``repeats`` times at every thread count of ``threads``, interleaved; a contender's figure is
    its median over the repeats at its best thread count (each gets the setting that suits it best)."""
    per: dict[str, dict[int, list[float]]] = {k: {t: [] for t in threads} for k in fam.contenders}
    last = {}
    for rep in range(repeats):   # interleaved: a load that changes during the run hits every contender alike
        for t in threads:
            torch.set_num_threads(t)
            for name, fn in fam.contenders.items():
                res = fn()
                per[name][t].append(figure(fam, res.round_s))
                last[name] = res
    ours = next(iter(fam.contenders))   # the first contender: fedsolve with the first of --executors
    out = {"workload": fam.workload, "unit": fam.unit, "tolerance": fam.tol, "notes": fam.notes, "contenders": {}}
    for name, res in last.items():
        diff = 0.0 if name == ours else rel_diff(last[ours].state, res.state)
        best = min(threads, key=lambda t: statistics.median(per[name][t]))
        config = res.config if len(threads) == 1 else re.sub(
            r"\d+ thread\(s\)$", f"best at {best} of {'/'.join(map(str, threads))} thread(s)", res.config)
        out["contenders"][name] = {"seconds": statistics.median(per[name][best]), "per_repeat": per[name][best],
                                   "threads": best, "by_threads": {str(t): per[name][t] for t in threads},
                                   "rounds": len(res.round_s), "config": config, "rel_diff": diff,
                                   "agrees": bool(diff <= fam.tol)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; the test runs it), not the figures")
    ap.add_argument("--threads", default="1",
                    help="torch threads; a list (1,2) times every contender at each and reports each at its best")
    ap.add_argument("--executors", default="auto,vectorized",
                    help="fedsolve executors to time (the first gives the headline ratios; one that is auto's pick "
                         "is left out)")
    ap.add_argument("--qp", default=None, help="the constrained family's Table-4 instance d,n,m (default 100,5,1)")
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda[:N]: where fedsolve's run, the references and their data live (issue 48, item 2)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--perturb", default="", help="comma-separated family:contender whose step size is changed "
                                                  "by 1%% (its agreement check must fail)")
    a = ap.parse_args(argv)
    names = [f for f in a.families.split(",") if f]
    bad = [f for f in names if f not in FAMILIES]
    if bad:
        ap.error(f"--families: unknown {bad}; allowed: {list(FAMILIES)}")
    if a.repeats < 1:
        ap.error("--repeats: must be >= 1")
    executors = tuple(e for e in a.executors.split(",") if e)
    allowed = ("auto", "sequential", "vectorized", "batched", "linear")
    if not executors or any(e not in allowed for e in executors):
        ap.error(f"--executors: expected names from {list(allowed)}, got {a.executors!r}")
    perturb: dict[str, set[str]] = {}
    for item in filter(None, a.perturb.split(",")):
        fam, _, who = item.partition(":")
        if fam not in FAMILIES or who not in ("plain", "fastest"):
            ap.error(f"--perturb: expected <family>:plain or <family>:fastest, got {item!r}")
        perturb.setdefault(fam, set()).add(who)
    options: dict[str, dict] = {}
    if a.qp:
        try:
            d, n, m = (int(v) for v in a.qp.split(","))
        except ValueError:
            ap.error(f"--qp: expected d,n,m (three integers), got {a.qp!r}")
        if min(d, n, m) < 1 or m >= d:
            ap.error(f"--qp: need d, n, m >= 1 and m < d, got {a.qp!r}")
        options["constrained"] = {"qp": (d, n, m)}
    try:
        threads = tuple(int(t) for t in a.threads.split(","))
    except ValueError:
        ap.error(f"--threads: expected a count or a comma-separated list of counts, got {a.threads!r}")
    if not threads or min(threads) < 1:
        ap.error(f"--threads: counts must be >= 1, got {a.threads!r}")
    gpu = None
    if a.device != "cpu":
        if not re.fullmatch(r"cuda(:\d+)?", a.device):
            ap.error(f"--device: expected cpu, cuda or cuda:N, got {a.device!r}")
        if not torch.cuda.is_available():
            ap.error(f"--device: {a.device!r} asked for, but CUDA is not available here; use --device cpu")
        # plain float32 for every contender (fedsolve's default, simulation.tf32 off): cuDNN's convolutions would
        # otherwise run in TF32 for the references only
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        gpu = torch.cuda.get_device_name(torch.device(a.device))
    torch.set_num_threads(threads[0])
    load0 = os.getloadavg()
    prof = machine_profile()
    print(f"fedsolve family benchmarks vs plain and fastest loops: torch {torch.__version__}, {a.threads} thread(s), "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"{os.cpu_count()} CPUs, {a.repeats} interleaved repeat(s){' (SMOKE sizes)' if a.smoke else ''}; "
          f"load average {load0[0]:.2f}", flush=True)
    if gpu is not None:
        print(f"device: {a.device} ({gpu}), float32 (TF32 off)", flush=True)
    print(f"machine: {prof['cpu_model']}; one small torch op {prof['small_op_us']} us, a 512 x 512 float32 product "
          f"{prof['matmul512_gflops']} GFLOP/s (1 thread)", flush=True)
    report: dict = {"families": {}, "ratios": {}}
    failed = False
    for name in names:
        mod = importlib.import_module(f"family_{name}")
        fam: Family = mod.build(a.smoke, perturb.get(name, set()), executors, device=a.device,
                                **options.get(name, {}))
        res = run_family(fam, a.repeats, threads)
        report["families"][name] = res
        print(f"\n[{name}] {fam.workload}; {'median round after the first' if fam.unit == 'round' else 'whole run'}"
              f", tolerance {fam.tol:g}; load average {os.getloadavg()[0]:.2f}")
        cs = res["contenders"]
        ours_name = next(iter(cs))
        ours = cs[ours_name]["seconds"]
        for k, c in res["contenders"].items():
            per = ", ".join(f"{v:.4f}" for v in c["per_repeat"])
            print(f"  {k:<22} {c['seconds']:9.4f} s  rel diff {c['rel_diff']:.1e}  [{per}]  {c['config']}")
        if not all(c["agrees"] for k, c in cs.items() if k.startswith("fedsolve")):
            failed = True
            print("  CHECK FAILED: fedsolve's executors disagree: no ratio")
            continue
        others = [k for k in cs if k.startswith("fedsolve") and k != ours_name]
        seq = cs.get("fedsolve[sequential]")
        if seq is not None and ours_name != "fedsolve[sequential]":   # the headline executor against client by client
            report["ratios"][f"{name} sequential"] = seq["seconds"] / ours
            print(f"ratio {name} sequential {seq['seconds'] / ours:.2f}", flush=True)
        for ref in ("plain", "fastest"):
            c = cs.get(ref)
            if c is None:
                continue
            if not c["agrees"]:
                failed = True
                print(f"  CHECK FAILED: {ref} ends {c['rel_diff']:.2e} from fedsolve's state (tolerance {fam.tol:g}): "
                      f"no ratio")
                continue
            r = c["seconds"] / ours
            report["ratios"][f"{name} {ref}"] = r
            print(f"ratio {name} {ref} {r:.2f}", flush=True)
            for o in others:   # the same against fedsolve's other executors (not the headline figure)
                tag = o[o.index("[") + 1:-1]
                report["ratios"][f"{name}:{tag} {ref}"] = c["seconds"] / cs[o]["seconds"]
                print(f"ratio {name}:{tag} {ref} {c['seconds'] / cs[o]['seconds']:.2f}", flush=True)
        for note in fam.notes:
            print(f"  note: {note}")
    load1 = os.getloadavg()
    print(f"\nload average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    if a.json:
        report.update(machine={"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                               "load_average_start": load0, "load_average_end": load1, **prof},
                      versions={"python": platform.python_version(), "torch": torch.__version__,
                                "numpy": np.__version__},
                      threads=list(threads), repeats=a.repeats, smoke=a.smoke, device=a.device, gpu=gpu)
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
