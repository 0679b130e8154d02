"""Compiled kernels, built at first use with the machine's C compiler and cached.

Three kernels, each plain C (GCC/Clang vector extensions at most) in ``kernels/``:

* ``softmax_gd.c``: the full-batch gradient descent of the ``linear`` executor for cross-entropy
  models (:class:`SoftmaxData`);
* ``pair_update.c``: FPFC's server update of the touched pairs on the dense store
  (``families/clustered/fpfc/pairs.py``, ``DensePairs``);
* ``maxpool2.c``: the forward pass of 2x2 max pooling (:func:`max_pool2x2`, used by the LeNet model),
  whose values and indices are torch's to the bit (torch's forward is slow on CPU).

Each is compiled with ``$CC`` (default ``cc``) and ``-O3 -march=native`` into
``$FEDSOLVE_CACHE_DIR/kernels`` (default ``~/.cache/fedsolve/kernels``), keyed by a hash of the source,
the flags, the compiler and the CPU, and written atomically (a temporary file renamed into place). It is
loaded with :mod:`ctypes`, whose calls release the GIL, so work is split over ``torch.get_num_threads()``
Python threads (:func:`parallel`).

No ``-ffast-math``: GCC links ``crtfastmath.o`` into shared libraries built with it, which would turn
on flush-to-zero for the whole process at load time.

Where no compiler is found or the build fails, :func:`softmax_gd_kernel` returns None with one
warning and the executor keeps its PyTorch path (:func:`max_pool2x2` falls back to ``torch.max_pool2d``).
``FEDSOLVE_NATIVE=0`` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from fedsolve.core.cpus import cpuinfo_field

KERNEL_DIR = Path(__file__).with_name("kernels")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-fPIC", "-shared"]
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_I64 = ctypes.c_int64
SIGNATURES = {
    "softmax_gd": {"softmax_gd": [_P, _P, _I, _I, _P, _P, _P, _P, _P, _P, _F, _F, _F, _P, _P, _P]},
    "pair_update": {
        "pair_delta": [_P, _P, _P, _I64, _I64, _P, _I64, _I64, _P, _P, _P],
        "pair_write": [_P, _P, _P, _P, _I64, _I64, _P, _P, _I64, _I64, _P, _P],
    },
    "maxpool2": {"maxpool2_fwd": [_P, _I64, _I64, _I64, _P, _P, _P, _P]},
}
LANES, BLOCK = 8, 16  # as in softmax_gd.c
MAX_CLASSES = 64

_lock = threading.Lock()
_loaded: dict[tuple, ctypes.CDLL | None] = {}
_warned = False
_pool: ThreadPoolExecutor | None = None


def enabled() -> bool:
    """False when ``FEDSOLVE_NATIVE=0`` (or ``false``/``off``) is set."""
    return os.environ.get("FEDSOLVE_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    base = os.environ.get("FEDSOLVE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "fedsolve") / "kernels"


def _cpu_signature() -> str:
    return platform.machine() + (cpuinfo_field("flags") or cpuinfo_field("Features"))


def _compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc)


def _build(name: str, defines: dict[str, int] | None = None) -> Path:
    """Compile ``kernels/<name>.c`` with ``defines`` (cached; see the module docstring)."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler ({os.environ.get('CC', 'cc')!r} is not on PATH)")
    source = KERNEL_DIR / f"{name}.c"
    flags = FLAGS + [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        b"\0".join([source.read_bytes(), " ".join(flags).encode(), version.encode(), _cpu_signature().encode()])
    ).hexdigest()[:16]
    tag = "".join(f"_{k.lower()}{v}" for k, v in sorted((defines or {}).items()))
    out = cache_dir() / f"{name}{tag}_{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".so")
    os.close(fd)
    try:
        res = subprocess.run([cc, *flags, "-o", tmp, str(source)], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed: {res.stderr.strip()[:2000]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(name: str, defines: dict[str, int] | None = None) -> ctypes.CDLL | None:
    """The compiled ``kernels/<name>.c``, or None (turned off, or no compiler: one warning)."""
    global _warned
    if not enabled():
        return None
    key = (name, tuple(sorted((defines or {}).items())))
    with _lock:
        if key not in _loaded:
            try:
                lib = ctypes.CDLL(str(_build(name, defines)))
                for fn, args in SIGNATURES[name].items():
                    getattr(lib, fn).restype = None
                    getattr(lib, fn).argtypes = args
                _loaded[key] = lib
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _loaded[key] = None
                if not _warned:
                    warnings.warn(
                        f"fedsolve: compiled kernel unavailable ({e}); using the PyTorch path (slower, same results)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    _warned = True
        return _loaded[key]


def softmax_gd_kernel(num_classes: int) -> ctypes.CDLL | None:
    """The softmax-GD kernel for ``num_classes`` classes, or None (off, unsupported count, or no compiler)."""
    if not (2 <= num_classes <= MAX_CLASSES):
        return None
    return load("softmax_gd", {"NC": num_classes})


def _threads() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="fedsolve-native")
    return _pool


def parallel(fn, parts: Sequence) -> list:
    """``[fn(p) for p in parts]``, on the kernel threads when there is more than one part."""
    if len(parts) <= 1:
        return [fn(p) for p in parts]
    return [f.result() for f in [_threads().submit(fn, p) for p in parts]]


def pointer(t: Tensor | None):
    """A tensor's data address for a kernel call (None for None). The caller keeps ``t`` alive."""
    return None if t is None else ctypes.c_void_p(t.data_ptr())


class SoftmaxData:
    """The training rows of every client in the kernel's layout (blocks of 16 rows, feature-major).

    ``X`` ``[N, F]`` (bias feature included), ``y`` ``[N]`` labels, ``offsets`` ``[m+1]``: client i owns rows
    ``offsets[i]:offsets[i+1]``. Memory: about the size of ``X`` plus up to 15 padding rows per client.
    """

    def __init__(self, lib: ctypes.CDLL, X: Tensor, y: Tensor, offsets: Tensor, num_classes: int):
        self.lib, self.C = lib, num_classes
        F = X.shape[1]
        self.F = F
        off = offsets.tolist()
        n = [off[i + 1] - off[i] for i in range(len(off) - 1)]
        npad = [max(BLOCK, -(-k // BLOCK) * BLOCK) for k in n]
        start = [0]
        for k in npad:
            start.append(start[-1] + k)
        Xb = torch.zeros(start[-1], F, dtype=torch.float32)
        Y = torch.full((start[-1],), -1, dtype=torch.int32)
        for i, k in enumerate(n):
            Xb[start[i] : start[i] + k] = X[off[i] : off[i + 1]]
            Y[start[i] : start[i] + k] = y[off[i] : off[i + 1]].to(torch.int32)
        # [blocks, BLOCK, F] -> [blocks, F, BLOCK]: each block's features contiguous, rows in the lanes
        self.X = Xb.view(-1, BLOCK, F).transpose(1, 2).contiguous()
        self.y = Y
        self.start = torch.tensor(start[:-1], dtype=torch.int64)
        self.npad = torch.tensor(npad, dtype=torch.int64)
        self.n = torch.tensor(n, dtype=torch.int64)

    def _split(self, ids: Tensor, steps: Tensor) -> list[Tensor]:
        """Positions 0..k-1 shared among the threads, largest work first (LPT)."""
        nth = max(1, min(torch.get_num_threads(), ids.numel()))
        cost = (self.npad[ids] * steps.clamp_min(1)).tolist()
        parts: list[list[int]] = [[] for _ in range(nth)]
        load = [0] * nth
        for p in sorted(range(len(cost)), key=lambda p: -cost[p]):
            j = load.index(min(load))
            parts[j].append(p)
            load[j] += cost[p]
        return [torch.tensor(sorted(p), dtype=torch.long) for p in parts if p]

    def run(
        self,
        ids: Tensor,
        A: Tensor,
        steps: Tensor | None = None,
        Z: Tensor | None = None,
        lr: float = 0.0,
        rho: float = 0.0,
        wd: float = 0.0,
        grad: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """``A`` ``[k, C, F]`` float32 (one row per id). GD mode: ``steps`` ``[k]`` steps each, returns the final
        ``A`` and the mean loss over each client's steps. ``grad=True``: returns the mean loss and its gradient
        at ``A`` (no step)."""
        k, P = ids.numel(), self.C * self.F
        A = A.to(torch.float32).contiguous().clone()
        Z = None if Z is None else Z.to(torch.float32).contiguous()
        steps = torch.zeros(k, dtype=torch.int32) if steps is None else steps.to(torch.int32).contiguous()
        loss = torch.zeros(k, dtype=torch.float64)
        G = torch.empty(k, self.C, self.F) if grad else None
        if k == 0:
            return (loss, G) if G is not None else (A, loss)

        def work(pos: Tensor):
            """One thread's clients (positions ``pos``); every buffer it passes is its own."""
            dev = ids[pos]
            a = A[pos].contiguous()
            z = None if Z is None else Z[pos].contiguous()
            g = torch.empty(pos.numel(), self.C, self.F) if grad else None
            lo, npd, n, st = (
                self.start[dev].contiguous(),
                self.npad[dev].contiguous(),
                self.n[dev].contiguous(),
                steps[pos].contiguous(),
            )
            ls = torch.zeros(pos.numel(), dtype=torch.float64)
            scratch = torch.empty(P * (LANES + 1) + 16)
            off = (-scratch.data_ptr() // 4) % 8  # 32-byte alignment for the vector scratch
            ws = scratch[off:]
            self.lib.softmax_gd(
                pointer(self.X),
                pointer(self.y),
                self.F,
                pos.numel(),
                pointer(lo),
                pointer(npd),
                pointer(n),
                pointer(st),
                pointer(a),
                pointer(z),
                lr,
                rho,
                wd,
                pointer(ls),
                pointer(g),
                pointer(ws),
            )
            return pos, a, ls, g

        for pos, a, ls, g in parallel(work, self._split(ids, steps)):  # written back on this thread
            A[pos] = a
            loss[pos] = ls
            if G is not None:
                G[pos] = g
        return (loss, G) if G is not None else (A, loss)


class _MaxPool2x2(torch.autograd.Function):
    """2x2 max pooling, stride 2: forward by ``maxpool2.c``, gradient by torch's own
    ``max_pool2d_with_indices_backward`` (differentiable, so double backward works too)."""

    @staticmethod
    def forward(ctx, x: Tensor, lib) -> Tensor:
        B, C, H, W = x.shape
        out = x.new_empty(B, C, H // 2, W // 2)
        idx = torch.empty(B, C, H // 2, W // 2, dtype=torch.int64)
        hm, ha = x.new_empty(B * C * H * W // 2), torch.empty(B * C * H * W // 2, dtype=torch.int64)
        lib.maxpool2_fwd(pointer(x), B * C, H, W, pointer(hm), pointer(ha), pointer(out), pointer(idx))
        ctx.save_for_backward(x, idx)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        x, idx = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx), None


def max_pool2x2(x: Tensor) -> Tensor:
    """``torch.max_pool2d(x, 2)``, the same values and gradients to the bit, with a compiled forward on CPU.

    The compiled path takes a contiguous float32 ``[B, C, H, W]`` CPU tensor with even H and W, outside
    torch.func transforms (under ``vmap``/``grad`` of the vectorized executor, and for any other input,
    torch's own op runs)."""
    if (
        x.dim() == 4
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.is_contiguous()
        and x.shape[-1] % 2 == 0
        and x.shape[-2] % 2 == 0
        and x.numel() > 0
        and not torch._C._are_functorch_transforms_active()
    ):
        lib = load("maxpool2")
        if lib is not None:
            return _MaxPool2x2.apply(x, lib)
    return torch.max_pool2d(x, 2)
