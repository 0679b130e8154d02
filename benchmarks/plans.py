"""Host-side minibatch plan drawing (``core/plans.py: build_plans``) before and after vectorizing it, one run.

Before: the per-client loop every committed result was drawn with (a numpy Generator built per client from a
SeedSequence, ``permutation`` per pass, ``[K, S, B]`` filled by nested Python loops), kept as the specification
``reference_build_plans`` in tests/test_plans.py. After: ``build_plans`` (client ids hashed into PCG64 states at
once, passes shuffled in place in one buffer, the stack built with array operations). Both draw and stack the
plan (``idx``, ``w``, ``active``) of K clients of the MNIST MLP workload (600 rows each, batch 50, 1 epoch:
12 steps), and the two plans are checked to be bitwise identical. ``--workloads`` adds ``fullbatch`` (the same
clients, a full-batch phase of as many steps: ``[K, 12, 600]``), ``irregular`` (clients of 100-700 rows, 2.5 epochs
of batch 32: short last batches, part passes) and ``groups`` (a phase on a row group of about half the rows).

Prints per K the best process-CPU seconds of ``--repeat`` runs and ``ratio plans_k<K> before/after <x>``;
``--out`` writes the figures as JSON. Run with ``OMP_NUM_THREADS=1``.

Usage: python benchmarks/plans.py [--sizes 100,1000,10000] [--workloads mnist,fullbatch,irregular,groups]
       [--rows 600] [--batch 50] [--epochs 1] [--repeat 3] [--out results/scale/plans.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def workload(name: str, K: int, rows: int, batch: int, epochs: float, seed: int = 0):
    """``(offsets, ids, work, groups)`` of a named workload over K clients."""
    import numpy as np
    import torch

    from fedsolve.core.plans import Work

    rng = np.random.default_rng(seed)
    sizes = np.full(K, rows) if name in ("mnist", "fullbatch") else rng.integers(rows // 6, 7 * rows // 6, K)
    offsets = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]), dtype=torch.long)
    ids = torch.as_tensor(rng.permutation(K), dtype=torch.long)
    groups = None
    if name == "mnist":         # the MNIST MLP workload: every step a full batch
        work = Work(epochs=epochs, batch_size=batch)
    elif name == "fullbatch":   # full-batch gradient steps, as many as the minibatch steps above
        work = Work(steps=max(1, math.ceil(epochs * math.ceil(rows / batch))))
    elif name == "irregular":   # clients of 100-700 rows, 2.5 epochs of batch 32: short last batches, part passes
        work = Work(epochs=2.5, batch_size=32)
    elif name == "groups":      # a phase on one row group (half the rows), 1 epoch of batch 20
        work = Work(epochs=1, batch_size=20, group="upper")
        groups = (torch.as_tensor(rng.integers(0, 2, int(sizes.sum()))), ("lower", "upper"))
    else:
        raise ValueError(f"--workloads: unknown workload {name!r}; allowed: mnist, fullbatch, irregular, groups")
    return offsets, ids, {"train": work}, groups


def measure(name: str, K: int, rows: int, batch: int, epochs: float, repeat: int, seed: int = 0,
            round_: int = 3) -> dict:
    """Seconds to draw and stack K clients' plans, before and after, and whether they are identical."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_plans import reference_build_plans  # the specification: the loop before the change

    from fedsolve.core.plans import build_plans
    from fedsolve.core.rng import RngStreams

    offsets, ids, work, groups = workload(name, K, rows, batch, epochs, seed)
    rngs = RngStreams(seed)

    def after():
        p = build_plans(work, offsets, ids, rngs, round_, groups=groups)["train"]
        return p.idx, p.w, p.active, p.fixed

    def draw_only():
        return build_plans(work, offsets, ids, rngs, round_, groups=groups)["train"]

    def before():
        return reference_build_plans(work, offsets, ids, seed, round_, groups=groups)["train"]

    t_before, ref = _best(before, repeat)
    t_after, got = _best(after, repeat)
    t_draw, _ = _best(draw_only, repeat)
    same = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[:3], ref[:3])) and got[3] == ref[3]
    tag = "" if name == "mnist" else f"{name}_"
    return {"workload": f"plans_{tag}k{K}", "name": name, "clients": K, "work": repr(work["train"]),
            "shape": list(ref[0].shape), "before_s": t_before, "after_s": t_after, "after_draw_only_s": t_draw,
            "ratio": t_before / t_after, "identical": bool(same)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000", help="clients K per round, comma-separated")
    ap.add_argument("--workloads", default="mnist", help="comma-separated: mnist, fullbatch, irregular, groups")
    ap.add_argument("--rows", type=int, default=600, help="training rows per client (mean for irregular/groups)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best CPU time counts")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    load = os.getloadavg()
    rows = []
    for K in (int(s) for s in args.sizes.split(",")):
        for name in args.workloads.split(","):
            r = measure(name, K, args.rows, args.batch, args.epochs, args.repeat)
            rows.append(r)
            print(f"{r['workload']:>22} {r['shape']}: before {r['before_s']:.4f} s, after {r['after_s']:.4f} s "
                  f"(draw only {r['after_draw_only_s']:.4f} s), identical {r['identical']}", flush=True)
    for r in rows:
        print(f"ratio {r['workload']} before/after {r['ratio']:.2f}")
    load_end = os.getloadavg()
    print(f"load average {load[0]:.2f} at start, {load_end[0]:.2f} at end; numpy {np.__version__}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if args.out:
        out = {"rows": rows, "load_average_start": load, "load_average_end": load_end, "numpy": np.__version__,
               "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
               "cpu_clock": "time.process_time, best of --repeat", "repeat": args.repeat,
               "command": "python benchmarks/plans.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
