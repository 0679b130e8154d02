"""BatchNorm running statistics as explicit state: batch statistics of a client's own rows, folded into its buffers.

A BatchNorm layer in training mode normalizes with the statistics of the minibatch and, as a side effect, moves
its running mean and variance (its *buffers*) toward them; in evaluation mode it normalizes with the buffers. A
federated run keeps one set of buffers per client (or a server average of them): they are state, like the
parameters, not something one module object may hold for every client. So the engine never lets a layer update
its own buffers. Inside :meth:`RunningStats.batch_statistics` every BatchNorm layer normalizes with the statistics
of the minibatch rows that carry weight (rows padded to a common shape for a vectorized call carry weight 0 and
are left out) and records those statistics; :meth:`RunningStats.fold` then moves a client's buffers as PyTorch's
layer would have moved its own:

    running_mean <- (1 - f) running_mean + f mean,    running_var <- (1 - f) running_var + f var_unbiased,
    num_batches_tracked <- num_batches_tracked + 1,   f = momentum (or 1 / num_batches_tracked when it is None).

Only ``torch.nn`` BatchNorm layers (``nn.BatchNorm1d/2d/3d`` and their subclasses) are handled; a model whose other
buffers change during a forward pass is not (``RunningStats.handles_all``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

#: the buffers of a tracked BatchNorm layer, in the order they are stored
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class RunningStats:
    """The BatchNorm layers of ``model`` and the names of their running-statistics buffers (``names``: e.g.
    ``"bn1.running_mean"``, as ``model.named_buffers()`` spells them)."""

    def __init__(self, model: nn.Module):
        self.layers: list[tuple[str, _BatchNorm]] = [
            (n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm)
        ]
        self.tracked = [(n, m) for n, m in self.layers if m.track_running_stats]
        self.names = [
            f"{n}.{b}" if n else b for n, m in self.tracked for b in BUFFERS if getattr(m, b, None) is not None
        ]
        self._model = model

    def __bool__(self) -> bool:
        return bool(self.layers)

    @property
    def handles_all(self) -> bool:
        """Every buffer of the model is a tracked BatchNorm layer's running statistic, and every BatchNorm layer
        tracks them (a layer without running statistics normalizes test batches by their own statistics, which
        padding to a common shape would change): the model's state is then fully explicit."""
        own = {n for n, _ in self._model.named_buffers()}
        return own == set(self.names) and len(self.tracked) == len(self.layers)

    def initial(self) -> dict[str, Tensor]:
        """The model's current running statistics ``{name: tensor}`` (copies): every client's starting buffers."""
        bufs = dict(self._model.named_buffers())
        return {n: bufs[n].detach().clone() for n in self.names}

    @contextlib.contextmanager
    def batch_statistics(self, mask: Tensor | None = None) -> Iterator[list]:
        """Inside the block every BatchNorm layer in training mode normalizes with the statistics of its input's
        rows where ``mask`` is true (None: all rows; a mask whose length is not the input's first dimension is
        ignored) and leaves its buffers alone; the block's value is a list that receives ``(layer index, mean,
        unbiased variance)`` per call of a tracked layer, detached, in call order (for :meth:`fold`)."""
        record: list = []
        tracked = {id(m): j for j, (_, m) in enumerate(self.tracked)}
        for _, mod in self.layers:
            # an instance attribute over the class's forward, deleted in the finally block below
            mod.forward = _masked_forward(mod, mask, record, tracked.get(id(mod)))  # type: ignore[method-assign]
        try:
            yield record
        finally:
            for _, mod in self.layers:
                del mod.forward  # the class's forward again

    def fold(self, buffers: dict[str, Tensor], record: list, live: Tensor) -> dict[str, Tensor]:
        """``buffers`` moved by each recorded call's statistics in turn (the module docstring's rule), where
        ``live`` (a boolean scalar: the step counts) is true; unchanged otherwise."""
        if not record:
            return buffers
        new = dict(buffers)
        for j, mean, var in record:
            name, mod = self.tracked[j]
            key = (name + ".") if name else ""
            seen = new[key + "num_batches_tracked"]
            count = seen + 1
            f = mod.momentum if mod.momentum is not None else 1.0 / count.to(mean.dtype)
            rm, rv = new[key + "running_mean"], new[key + "running_var"]
            new[key + "running_mean"] = torch.where(live, f * mean.to(rm.dtype) + (1 - f) * rm, rm)
            new[key + "running_var"] = torch.where(live, f * var.to(rv.dtype) + (1 - f) * rv, rv)
            new[key + "num_batches_tracked"] = torch.where(live, count, seen)
        return new


def _masked_forward(mod: _BatchNorm, mask: Tensor | None, record: list, index: int | None):
    """The training-mode forward of ``mod`` with batch statistics over the rows of ``mask`` (see
    :meth:`RunningStats.batch_statistics`); in evaluation mode the layer's own forward."""
    own = type(mod).forward

    def forward(x: Tensor) -> Tensor:
        if not mod.training:
            return own(mod, x)
        dims = [0, *range(2, x.dim())]
        if mask is None or mask.shape[0] != x.shape[0]:  # every row counts: PyTorch's own kernel
            y = F.batch_norm(x, None, None, mod.weight, mod.bias, True, 0.0, mod.eps)
            if index is not None:
                with torch.no_grad():
                    var, mean = torch.var_mean(x.detach(), dim=dims, correction=1)
                record.append((index, mean, var))
            return y
        shape = [1, -1] + [1] * (x.dim() - 2)
        m = mask.to(x.dtype).reshape(-1, *[1] * (x.dim() - 1))
        count = (m.sum() * (x[0, 0].numel())).clamp_min(1)  # an inactive padded step has no row: no NaN
        mean = (x * m).sum(dims) / count
        xc = x - mean.reshape(shape)
        var = (xc * xc * m).sum(dims) / count
        y = xc * torch.rsqrt(var + mod.eps).reshape(shape)
        if mod.weight is not None:
            y = y * mod.weight.reshape(shape) + mod.bias.reshape(shape)
        if index is not None:
            record.append((index, mean.detach(), (var * count / (count - 1).clamp_min(1)).detach()))
        return y

    return forward
