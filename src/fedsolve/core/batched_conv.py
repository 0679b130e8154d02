"""Stacked small CNNs for the ``batched`` executor: K clients' convolutions as one grouped convolution.

A model whose forward pass is ``(Conv2d -> activation -> 2x2 max pooling)*`` (pooling optional), a flatten,
then a chain of ``nn.Linear`` layers with elementwise activations between them (fedsolve's ``lenet``, with or
without its hidden fc layers) is run for the k clients of a chunk at once:

* the clients' minibatches are *channel-stacked*: sample b of client j is channel block j of row b, so a batch
  is ``[B, k * C, H, W]`` and client j's weights are group j of one convolution with ``groups = k`` (weights
  ``[k * O, C, kh, kw]``): one convolution call per layer for the chunk instead of one per client;
* after the flatten, ``[B, k, F]`` is read as ``[k, B, F]`` and the fc layers are ``baddbmm`` per layer;
* the gradient of the sum of the clients' weighted mean losses with respect to the stacked parameters is
  every client's own gradient (client j's loss depends on its own group only), taken by autograd over leaf
  views of the chunk's ``[k, d]`` rows.

Padding rows of a short batch carry weight 0, so the numbers are those of the sequential executor to float
rounding (``tests/test_batched_conv.py``). The SGD loop, chunking and the update are the ``batched`` executor's
(``core/batched_mlp.py``); this module is the per-step kernel.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsolve.core.native import max_pool2x2

_ACT_MODULES = {nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid}
_ACT_FNS = {torch.relu: torch.relu, F.relu: torch.relu, torch.tanh: torch.tanh, torch.sigmoid: torch.sigmoid}
_POOLS = (max_pool2x2, torch.max_pool2d, F.max_pool2d)


@dataclass(frozen=True)
class _Op:
    kind: str  # conv | linear | act | pool | flatten
    w: tuple[int, tuple[int, ...]] | None = None  # (start, shape) of the weight in the flat vector
    b: tuple[int, int] | None = None  # (start, size) of the bias
    conv: tuple = ()  # stride, padding, dilation of a convolution
    fn: Callable[[Tensor], Tensor] | None = None  # the activation


def _pool2(node) -> bool:
    """``node`` is 2x2 max pooling with stride 2 (``max_pool2x2`` or ``max_pool2d(x, 2)``)."""
    if node.target is max_pool2x2:
        return len(node.args) == 1 and not node.kwargs
    ks = node.args[1] if len(node.args) > 1 else node.kwargs.get("kernel_size")
    rest = dict(
        zip(("stride", "padding", "dilation", "ceil_mode"), node.args[2:]),
        **{k: v for k, v in node.kwargs.items() if k != "kernel_size"},
    )
    return (
        ks in (2, (2, 2), [2, 2])
        and rest.get("stride") in (None, 2, (2, 2), [2, 2], [])
        and rest.get("padding", 0) in (0, (0, 0))
        and rest.get("dilation", 1) in (1, (1, 1))
        and not rest.get("ceil_mode", False)
        and not rest.get("return_indices", False)
    )


def _pool2_module(mod: nn.MaxPool2d) -> bool:
    """``mod`` is 2x2 max pooling with stride 2 and no padding, dilation, ceil mode or indices."""
    pair = lambda v: v if isinstance(v, tuple) else (v, v)
    return (
        pair(mod.kernel_size) == (2, 2)
        and pair(mod.stride) == (2, 2)
        and pair(mod.padding) == (0, 0)
        and pair(mod.dilation) == (1, 1)
        and not mod.ceil_mode
        and not mod.return_indices
    )


def cnn_ops(problem) -> list[_Op]:
    """The operations of ``problem.model`` when it is a stacked-CNN-able model (module docstring), traced with
    ``torch.fx``; raises ``ValueError`` saying why not otherwise."""
    model = problem.model
    try:
        gm = torch.fx.GraphModule(model, torch.fx.Tracer(autowrap_functions=(max_pool2x2,)).trace(model))
    except Exception as e:  # noqa: BLE001 - any tracing failure means "not a plain CNN"
        raise ValueError(f"{type(model).__name__} could not be traced ({e})") from None
    mods = dict(gm.named_modules())
    starts = {e.name: e.start for e in problem.layout.entries}
    ops: list[_Op] = []
    cur, flat, why = None, False, None
    for node in gm.graph.nodes:
        mod = mods.get(node.target) if node.op == "call_module" else None
        if node.op == "placeholder":
            cur = node
            continue
        if node.op == "output":
            if node.args[0] is not cur:
                why = "its output is not the last layer's"
            break
        if node.op == "call_function" and node.target in (getattr, operator.getitem):
            continue
        if not node.args or node.args[0] is not cur:
            why = f"operation {node.op} {node.target!r} is not on the chain of layers"
            break
        if isinstance(mod, nn.Conv2d) and not flat:
            if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
                why = f"convolution {node.target} has groups, a padding mode or 'same' padding"
                break
            b = (starts[f"{node.target}.bias"], mod.out_channels) if mod.bias is not None else None
            ops.append(
                _Op(
                    "conv",
                    (starts[f"{node.target}.weight"], tuple(mod.weight.shape)),
                    b,
                    (mod.stride, mod.padding, mod.dilation),
                )
            )
        elif isinstance(mod, nn.Linear) and flat:
            b = (starts[f"{node.target}.bias"], mod.out_features) if mod.bias is not None else None
            ops.append(_Op("linear", (starts[f"{node.target}.weight"], tuple(mod.weight.shape)), b))
            flat = True
        elif (mod is not None and type(mod) in _ACT_MODULES) or (
            node.op == "call_function" and node.target in _ACT_FNS
        ):
            ops.append(_Op("act", fn=_ACT_MODULES[type(mod)] if mod is not None else _ACT_FNS[node.target]))
        elif not flat and (
            (node.op == "call_function" and node.target in _POOLS and _pool2(node))
            or (isinstance(mod, nn.MaxPool2d) and _pool2_module(mod))
        ):
            ops.append(_Op("pool"))
        elif not flat and (
            (node.op == "call_method" and node.target == "flatten" and node.args[1:] == (1,) and not node.kwargs)
            or (isinstance(mod, nn.Flatten) and mod.start_dim == 1 and mod.end_dim == -1)
        ):
            ops.append(_Op("flatten"))
            flat = True
        else:
            why = f"unsupported operation {node.op} {node.target!r}"
            break
        cur = node
    if why is None:
        n_par = sum(1 for _ in model.parameters())
        if (
            n_par != sum(1 + (o.b is not None) for o in ops if o.w is not None)
            or not any(o.kind == "conv" for o in ops)
            or not ops
            or ops[-1].kind != "linear"
        ):
            why = "its parameters are not those of convolutions followed by nn.Linear layers ending in a linear output"
    if why is not None:
        raise ValueError(f"{type(model).__name__}: {why}")
    return ops


class StackedCNN:
    """One SGD step's loss and gradient for the k clients of a chunk (module docstring).

    ``X`` is channel-stacked ``[B, k * C * H * W]`` (``batch_major``); ``Y`` ``[k, B, ...]``; ``w`` ``[k, B]``."""

    batch_major = True
    fuses_update = False

    def __init__(self, problem, ops: list[_Op]):
        self.ops = ops
        self.in_shape = tuple(problem.data.input_shape)
        self.loss_fn = problem.loss_fn
        self.params = [o.w for o in ops if o.w is not None] + [
            (s, (n,)) for o in ops if o.b is not None for s, n in [o.b]
        ]

    def buffers(self, k: int, B: int, like: Tensor) -> None:
        return None

    def forward(self, leaves: dict[int, Tensor], X: Tensor, k: int) -> Tensor:
        """The chunk's outputs ``[k, B, out]`` from the leaf views ``{start: [k, size]}``.

        The convolutions run in the channels-last memory format (oneDNN's grouped convolution is faster there on
        CPU), and ReLU followed by 2x2 max pooling runs as pooling then ReLU: the same values and gradients
        (ReLU is monotone, so the window's maximum and its position are those of the pre-activations whenever
        the maximum is positive, and the gradient is 0 otherwise), on a quarter of the elements."""
        B = X.shape[0]
        C, *hw = self.in_shape
        h = X.view(B, k * C, *hw)
        if h.device.type == "cpu":
            h = h.contiguous(memory_format=torch.channels_last)
        ops, j = self.ops, 0
        while j < len(ops):
            op = ops[j]
            if op.kind == "conv":
                assert op.w is not None, "a conv op is built with its weight"
                s, shape = op.w
                W = leaves[s].reshape(k * shape[0], *shape[1:])
                if h.is_contiguous(memory_format=torch.channels_last) and not h.is_contiguous():
                    W = W.contiguous(memory_format=torch.channels_last)
                bias = leaves[op.b[0]].reshape(-1) if op.b is not None else None
                stride, padding, dilation = op.conv
                h = F.conv2d(h, W, bias, stride, padding, dilation, groups=k)
            elif op.kind == "linear":
                assert op.w is not None, "a linear op is built with its weight"
                s, (o, i) = op.w
                W = leaves[s].view(k, o, i).transpose(1, 2)
                h = torch.baddbmm(leaves[op.b[0]].unsqueeze(1), h, W) if op.b is not None else torch.bmm(h, W)
            elif op.kind == "act" and op.fn is torch.relu and j + 1 < len(ops) and ops[j + 1].kind == "pool":
                h = torch.relu(torch.max_pool2d(h, 2))
                j += 1
            elif op.kind == "act":
                assert op.fn is not None, "an act op is built with its function"
                h = op.fn(h)
            elif op.kind == "pool":
                h = torch.max_pool2d(h, 2)
            else:  # flatten: [B, k * C', H', W'] -> [k, B, C' H' W'] (client j's features are channel block j)
                h = h.contiguous().reshape(B, k, -1).transpose(0, 1)
            j += 1
        return h

    def loss_grad(
        self, P: Tensor, G: Tensor, X: Tensor, Y: Tensor, w: Tensor, bufs=None, lr: float | None = None
    ) -> Tensor:
        """Weighted mean loss ``[k]`` of each client at its rows of ``P`` ``[k, d]``; the gradients into ``G``."""
        k, B = w.shape
        leaves = {s: P[:, s : s + int(torch.Size(shape).numel())].detach().requires_grad_() for s, shape in self.params}
        with torch.enable_grad():
            out = self.forward(leaves, X, k)
            per = self.loss_fn(out.reshape(k * B, -1), Y.reshape(k * B, *Y.shape[2:])).view(k, B)
            loss = (per * w).sum(1)
            grads = torch.autograd.grad(loss.sum(), list(leaves.values()))
        for s, g in zip(leaves, grads):
            G[:, s : s + g.shape[1]].copy_(g)
        return loss.detach()
