"""The DANN saddle loss's value and gradient written out, for a :class:`DomainAdversarialNet` of fully connected
layers (``features: mlp``): forward through the three chains (features, label classifier, domain head), then the
backward pass by hand, with no autograd graph (the local steps' hot path; the same numbers to float rounding,
``tests/test_minimax_speed.py``).

With ``z`` the features, ``s`` the class logits, ``d`` the domain logits, a row of weight ``w`` (source rows carry
their class ``y >= 0``, target rows ``y < 0``; domain label ``t = 0`` on source rows, 1 on target rows):

    f = sum_rows w [ 1{source} CE(s, y) - nu CE(d, t) ]                     (``problem.adversarial_loss``)
    df/ds = w 1{source} (softmax(s) - e_y),     df/dd = -nu w (softmax(d) - e_t)

then through each chain's ``Linear`` layers and ReLUs (``dW = g^T h``, ``db = sum g``, ``g <- (g W) * 1{h > 0}``),
the features' error the sum of what the two heads send back. CDAN and MDD (and convolutional features) keep
autograd: :func:`dann_value_and_grad` returns None for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

Layers = list[tuple[str, bool]]  # (parameter prefix of an nn.Linear, ReLU after it)


def _linear_chain(chain: nn.Module, prefix: str, flatten_first: bool = False) -> Layers | None:
    """``[(prefix.j, relu after)]`` for a chain of ``nn.Linear`` layers with ReLUs between them (an ``nn.Flatten``
    first where ``flatten_first``); None for any other layer."""
    out: Layers = []
    for j, (name, module) in enumerate(chain.named_children()):
        if isinstance(module, nn.Linear) and module.bias is not None:
            out.append((f"{prefix}.{name}", False))
        elif isinstance(module, nn.ReLU) and out and not out[-1][1]:
            out[-1] = (out[-1][0], True)
        elif not (isinstance(module, nn.Flatten) and flatten_first and j == 0):
            return None
    return out or None


def _forward(params: dict[str, Tensor], layers: Layers, h: Tensor) -> list[Tensor]:
    """The chain's input and every layer's output (after its ReLU)."""
    hs = [h]
    for name, relu in layers:
        h = torch.addmm(params[f"{name}.bias"], h, params[f"{name}.weight"].t())
        if relu:
            h = h.relu_()  # in place on the new output
        hs.append(h)
    return hs


def _backward(params: dict[str, Tensor], layers: Layers, hs: list[Tensor], g: Tensor, grads: dict, to_input: bool):
    """The chain's parameter gradients into ``grads`` from ``g`` = d f / d (its output); the error at its input
    (None where ``to_input`` is false)."""
    for j in range(len(layers) - 1, -1, -1):
        name, relu = layers[j]
        if relu:  # ReLU's own backward (h is the layer's output after it)
            g = torch.ops.aten.threshold_backward(g, hs[j + 1], 0.0)
        grads[f"{name}.weight"] = torch.mm(g.t(), hs[j])
        grads[f"{name}.bias"] = g.sum(0)
        if j or to_input:
            g = torch.mm(g, params[f"{name}.weight"])
    return g if to_input else None


def _softmax_minus_onehot(logits: Tensor, label: Tensor) -> tuple[Tensor, Tensor]:
    """``(CE(logits, label) per row, softmax(logits) - e_label)``."""
    logp = torch.log_softmax(logits, -1)
    at = label.unsqueeze(-1)
    return -logp.gather(-1, at).squeeze(-1), logp.exp().scatter_add(-1, at, torch.full_like(logp[..., :1], -1.0))


def dann_value_and_grad(model: nn.Module, nu: float) -> Callable | None:
    """``(params, x, y, w) -> (f, {name: df/dparam})`` for the DANN loss of ``model`` (a
    ``DomainAdversarialNet`` with ``features: mlp``), or None where the network or the loss is another kind."""
    if getattr(model, "kind", None) != "dann":
        return None
    chains = (
        _linear_chain(model.get_submodule("features"), "features", flatten_first=True),
        _linear_chain(model.get_submodule("classifier"), "classifier"),
        _linear_chain(model.get_submodule("domain"), "domain"),
    )
    if any(c is None for c in chains):
        return None
    feats, cls, dom = (c for c in chains if c is not None)

    def value_and_grad(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor):
        zs = _forward(params, feats, x.reshape(x.shape[0], -1))
        cs = _forward(params, cls, zs[-1])
        ds = _forward(params, dom, zs[-1])
        src = (y >= 0).to(w.dtype)
        ce, gs = _softmax_minus_onehot(cs[-1], y.clamp_min(0))
        dce, gd = _softmax_minus_onehot(ds[-1], (y < 0).long())
        value = (w * (ce * src - nu * dce)).sum()
        grads: dict[str, Tensor] = {}
        gz = _backward(params, cls, cs, gs * (w * src).unsqueeze(-1), grads, True)
        gz = gz + _backward(params, dom, ds, gd * (-nu * w).unsqueeze(-1), grads, True)
        _backward(params, feats, zs, gz, grads, False)
        return value, grads

    return value_and_grad
