"""Whether a function written for one client runs for many clients at once.

A family that takes a user's per-client function (e.g. a saddle function ``f(i, x, y, d)``) checks it once, when
the problem is built, so that every executor can run it: a function that branches in Python on a tensor's value
(``if i == 0``, ``int(i)``, a list indexed by ``i``) runs one client at a time but not for all clients at once,
and should be refused with one clear line then, not fail in the middle of a run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def rowwise_mismatch(fn: Callable[[Tensor], Tensor], rows: Tensor, rtol: float = 1e-5) -> str | None:
    """None when ``fn`` (one row ``[...]`` -> a tensor) runs under :func:`torch.func.vmap` over the leading
    dimension of ``rows`` and gives the values it gives row by row (to ``rtol``); else why not, in one line."""
    try:
        together = torch.func.vmap(fn)(rows)
    except Exception as e:  # noqa: BLE001  (any failure: the function cannot run for all rows at once)
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"it does not run for all clients at once ({why[:160]})"
    alone = torch.stack([fn(r) for r in rows.unbind(0)])
    scale = max(1.0, float(alone.abs().max())) if alone.numel() else 1.0
    if together.shape != alone.shape or not torch.allclose(together, alone, rtol=rtol, atol=1e-8 * scale):
        return "it gives other values for all clients at once than one client at a time"
    return None
