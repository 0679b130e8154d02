"""Torch ops a round, per contender of the family benchmarks (``families.py``): a figure that does not move with the
machine or its load. A round whose ops are small costs about (ops x one op's dispatch cost) plus the arithmetic, so
where ``families.py``'s machine line shows a slow dispatch (microseconds a small op), the contender that issues more
ops loses ground although its arithmetic is the same.

Counts the outermost aten ops (those not called from another aten op: a contender's own calls and the ops autograd's
backward pass runs for it) that torch's profiler records over one whole run of each contender after a warm-up run,
divided by the run's rounds; prints ``ops <family> <contender> <ops a round>``.

Usage: python benchmarks/peers/op_counts.py [--families constrained,fedmm] [--smoke] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from families import FAMILIES  # noqa: E402


def count(fn) -> tuple[float, collections.Counter]:
    """Outermost aten ops a round of one run of ``fn`` (after a warm-up run), and the count of each op over the run."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        res = fn()
    ops = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::") and (
        e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))   # autograd's backward ops too
    return sum(ops.values()) / len(res.round_s), ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (the test runs it)")
    ap.add_argument("--top", type=int, default=0, help="also print each contender's N most frequent ops")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    names = [f for f in a.families.split(",") if f]
    bad = [f for f in names if f not in FAMILIES]
    if bad:
        ap.error(f"--families: unknown {bad}; allowed: {list(FAMILIES)}")
    torch.set_num_threads(1)
    out: dict = {}
    for name in names:
        fam = importlib.import_module(f"family_{name}").build(a.smoke, set(), ("auto",))
        out[name] = {}
        for who, fn in fam.contenders.items():
            per_round, ops = count(fn)
            out[name][who] = {"ops_per_round": per_round, "top": dict(ops.most_common(a.top or 10))}
            print(f"ops {name} {who} {per_round:.1f}", flush=True)
            for op, n in ops.most_common(a.top):
                print(f"    {op} {n}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
