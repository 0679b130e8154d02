"""How many physical CPU cores this process may use: the default torch thread count of a run.

Hyper-threads share a core's arithmetic units, so a second torch thread on the same core gains little and
costs synchronisation; PyTorch's own default is likewise one thread per physical core. Counted here:

- the CPUs this process may run on (``os.sched_getaffinity``: ``taskset``, a container's cpuset), grouped
  into physical cores by Linux's topology files (``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``:
  the CPUs that share cpuN's core);
- capped by a cgroup v2 CPU quota (``/sys/fs/cgroup/cpu.max``, e.g. ``200000 100000`` = 2 CPUs), which is how
  a container limited to N CPUs usually sees the whole machine;
- elsewhere (macOS, Windows, no topology files) the logical CPU count, ``os.cpu_count()``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def physical_cores(root: str | Path = "/", cpus: set[int] | None = None) -> int:
    """The physical cores among ``cpus`` (default: the CPUs this process may run on), at most the cgroup's CPU
    quota, at least 1. ``root`` is where ``sys/`` lies (a test passes a fake tree)."""
    root = Path(root)
    if cpus is None:
        cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    cores: set[str] = set()
    for c in sorted(cpus):
        f = root / f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"
        try:
            cores.add(f.read_text().strip())
        except OSError:  # no topology file: count the CPU as its own core
            cores.add(f"cpu{c}")
    n = len(cores) or os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    return max(1, min(n, quota) if quota is not None else n)


def cgroup_cpu_quota(root: str | Path = "/") -> int | None:
    """The cgroup v2 CPU quota in whole CPUs (rounded up), or None when there is none (``max``) or no file."""
    try:
        quota, period = (Path(root) / "sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


#: instruction-set extensions that decide which BLAS and compiled-kernel paths run, widest first
SIMD = ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd", "neon")


def cpuinfo_field(name: str, root: str | Path = "/") -> str:
    """The value of the first ``name`` line of ``/proc/cpuinfo`` (e.g. ``model name``, ``flags``), "" where there
    is none (not Linux, or the kernel does not list it)."""
    try:
        with open(Path(root) / "proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.split(":", 1)[0].strip() == name), "")
    except OSError:
        return ""


def cpu_description(root: str | Path = "/") -> dict[str, str | None]:
    """The CPU a result was computed on, as provenance records it: its ``model`` name and its widest ``simd``
    extension of :data:`SIMD` (two CPUs sold under one name can differ there, and with it the rounding of a
    float32 product), None where unknown."""
    flags = set((cpuinfo_field("flags", root) or cpuinfo_field("Features", root)).split())
    return {"model": cpuinfo_field("model name", root) or None, "simd": next((s for s in SIMD if s in flags), None)}
