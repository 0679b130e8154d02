"""Host-side minibatch plan drawing (``core/plans.py: build_plans``) before and after vectorizing it, one run.

Before: the per-client loop every committed result was drawn with (a numpy Generator built per client from a
SeedSequence, ``permutation`` per pass, ``[K, S, B]`` filled by nested Python loops), kept as the specification
``reference_build_plans`` in tests/test_plans.py. After: ``build_plans`` (client ids hashed into PCG64 states at
once, passes shuffled in place in one buffer, the stack built with array operations). Both draw and stack the
plan (``idx``, ``w``, ``active``) of K clients of the MNIST MLP workload (600 rows each, batch 50, 1 epoch:
12 steps), and the two plans are checked to be bitwise identical. ``--full-batch`` adds the same clients with a
full-batch phase of as many steps (no randomness: ``[K, 12, 600]``, every step the client's rows in order).

Prints per K the best process-CPU seconds of ``--repeat`` runs and ``ratio plans_k<K> before/after <x>``;
``--out`` writes the figures as JSON. Run with ``OMP_NUM_THREADS=1``.

Usage: python benchmarks/plans.py [--sizes 100,1000,10000] [--rows 600] [--batch 50] [--epochs 1] [--repeat 3]
       [--out results/scale/plans.json]
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


def measure(K: int, rows: int, batch: int | None, epochs: float, repeat: int, seed: int = 0, round_: int = 3,
            steps: int | None = None) -> dict:
    """Seconds to draw and stack K clients' plans, before and after, and whether they are identical."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_plans import reference_build_plans  # the specification: the loop before the change

    from fedsolve.core.plans import Work, build_plans
    from fedsolve.core.rng import RngStreams

    offsets = torch.arange(K + 1, dtype=torch.long) * rows
    ids = torch.as_tensor(np.random.default_rng(seed).permutation(K), dtype=torch.long)
    work = {"train": Work(epochs=epochs, steps=steps, batch_size=batch)}
    rngs = RngStreams(seed)

    def after():
        p = build_plans(work, offsets, ids, rngs, round_)["train"]
        return p.idx, p.w, p.active, p.fixed

    def draw_only():
        return build_plans(work, offsets, ids, rngs, round_)["train"]

    t_before, ref = _best(lambda: reference_build_plans(work, offsets, ids, seed, round_)["train"], repeat)
    t_after, got = _best(after, repeat)
    t_draw, _ = _best(draw_only, repeat)
    same = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[:3], ref[:3])) and got[3] == ref[3]
    return {"clients": K, "rows": rows, "batch": batch, "epochs": epochs, "steps": steps, "shape": list(ref[0].shape),
            "before_s": t_before, "after_s": t_after, "after_draw_only_s": t_draw,
            "ratio": t_before / t_after, "identical": bool(same)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000", help="clients K per round, comma-separated")
    ap.add_argument("--rows", type=int, default=600, help="training rows per client")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best CPU time counts")
    ap.add_argument("--full-batch", action="store_true", help="also a full-batch phase of ceil(epochs rows / batch) "
                                                               "steps")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    load = os.getloadavg()
    rows = []
    fb_steps = max(1, math.ceil(args.epochs * math.ceil(args.rows / args.batch)))
    for K in (int(s) for s in args.sizes.split(",")):
        for name, batch, steps in [("", args.batch, None)] + ([("fullbatch_", None, fb_steps)] if args.full_batch
                                                                else []):
            r = measure(K, args.rows, batch, args.epochs, args.repeat, steps=steps)
            r["workload"] = f"plans_{name}k{K}"
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
               "cpu_clock": "time.process_time, best of --repeat", "repeat": args.repeat}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
