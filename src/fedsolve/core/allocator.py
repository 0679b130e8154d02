"""The one process-wide setting an executor makes: glibc's keep-freed-memory option (:func:`keep_freed_memory`).

An executor whose rounds allocate large temporaries (the vectorized executor's stacked minibatches and per-client
uploads, the linear and batched executors' blocks) calls it when its first round runs: never on import, never
when it is built. ``tune_malloc=False`` on the executor leaves the process as it is.
"""

from __future__ import annotations

_MALLOC_TUNED = False


def keep_freed_memory(threshold_bytes: int = 1 << 30) -> bool:
    """Let glibc serve large tensors from the heap and keep freed memory (``mallopt``), process-wide.

    By default every tensor above ~128 KB-32 MB is an ``mmap`` that the kernel zero-fills page by page on
    first touch and unmaps on free. FPFC's round allocates a dozen 2-8 MB temporaries (the [k, m, d_f]
    pair blocks, the [chunks, 10, C] logits), so most of the server update's time went to page faults:
    measured on this 2-core machine, ``DensePairs.update`` (m = 100, k = 30, d_f = 610) 59 ms -> 15 ms.
    The cost is that the process keeps its peak heap. The same as starting Python with
    ``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296``. No-op off glibc.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        ok = libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)) == 1
        ok = ok and libc.mallopt(M_TRIM_THRESHOLD, int(min(4 * threshold_bytes, 2**31 - 1))) == 1
    except (OSError, AttributeError):
        ok = False
    _MALLOC_TUNED = ok
    return ok
