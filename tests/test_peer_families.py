"""benchmarks/peers/families.py at its smoke sizes: for every family one reference agrees with fedsolve (its ratio
is printed) and the other, run with a step size changed by 1%, is caught by the agreement check (no ratio, exit
status 1). A benchmark run, not a timing: the figures themselves are never checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peers" / "families.py"

#: family -> the reference whose step size is perturbed (the other one must agree); the swapped cases run as slow
CASES = {"fedapm": "fastest", "fpfc": "plain", "constrained": "fastest", "simfbo": "plain", "fedmm": "fastest"}
SWAP = {"plain": "fastest", "fastest": "plain"}
PARAMS = [(f, bad) for f, bad in sorted(CASES.items())] + [
    pytest.param(f, SWAP[bad], marks=pytest.mark.slow) for f, bad in sorted(CASES.items())]


@pytest.mark.parametrize("family,bad", PARAMS)
def test_family_agreement_check_passes_and_fails(family, bad):
    good = SWAP[bad]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--repeats", "1", "--families", family,
                        "--perturb", f"{family}:{bad}"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out                                   # a failed check sets the exit status
    assert re.search(rf"^ratio {family} {good} \d+\.\d+$", out, re.M), out
    assert f"CHECK FAILED: {bad} ends" in out, out
    assert not re.search(rf"^ratio {family}(:\w+)? {bad} ", out, re.M), out
    assert "fedsolve's executors disagree" not in out, out


def test_perturb_names_a_family_and_a_reference():
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--perturb", "fedapm:fedsolve"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "--perturb" in p.stderr


def test_threads_list_reports_each_contender_at_its_best_count():
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--repeats", "1", "--families", "simfbo",
                        "--threads", "1,2"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^ratio simfbo plain \d+\.\d+$", out, re.M), out
    # every contender's line names the count it was reported at
    assert len(re.findall(r"best at [12] of 1/2 thread\(s\)$", out, re.M)) >= 3, out
    # the machine line the ratios are read beside (they move between machines with the per-op cost)
    assert re.search(r"^machine: .+; one small torch op [\d.]+ us, a 512 x 512 float32 product [\d.]+ GFLOP/s", out,
                     re.M), out
    for bad in ("0", "1,x", ""):
        q = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--threads", bad], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
        assert q.returncode == 2 and "--threads" in q.stderr, (bad, q.stderr)


def test_op_counts_prints_ops_a_round_for_every_contender():
    """benchmarks/peers/op_counts.py: the ops a round of each contender (a count, not a timing)."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers" / "op_counts.py"), "--smoke", "--families",
                        "constrained"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    counts = dict(re.findall(r"^ops constrained (\S+) ([\d.]+)$", out, re.M))
    assert set(counts) == {"fedsolve[auto]", "plain", "fastest"}, out
    assert all(float(v) > 10 for v in counts.values()), counts   # a round issues ops: the profiler saw them
    q = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers" / "op_counts.py"), "--families", "nope"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert q.returncode == 2 and "--families" in q.stderr


def test_sequential_ratio_and_device_option():
    """``--executors vectorized,sequential`` prints the headline executor against fedsolve's client-by-client one
    (issue 48, item 2: ``ratio <family> sequential``); ``--device`` takes cpu or cuda[:N], and cuda only where CUDA
    is (one line naming the option, exit 2)."""
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--repeats", "1", "--families", "simfbo",
                        "--executors", "vectorized,sequential", "--device", "cpu"], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^ratio simfbo sequential \d+\.\d+$", out, re.M), out
    assert re.search(r"^ratio simfbo plain \d+\.\d+$", out, re.M), out
    bad = ["gpu", "cuda:x"] + ([] if torch.cuda.is_available() else ["cuda"])
    for dev in bad:
        q = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--device", dev], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
        assert q.returncode == 2 and "--device" in q.stderr and "Traceback" not in q.stderr, (dev, q.stderr)
