"""The fastest sequential client loop we could write for a chain of Linear layers (ReLU between them) with the
cross-entropy loss: the reference ``fastest`` of ``mlp_fedavg.py`` and, for such models, of ``round_time.py``.

One client at a time, with nothing allocated per step but a ``[B, classes]`` softmax: the client's parameters are
one flat vector ``P`` (the model's ``named_parameters`` order, as fedsolve lays them out) with views per layer, its
gradient one flat vector ``G`` with the same views; every minibatch is gathered with ``index_select`` into a
preallocated buffer, the forward pass is ``addmm`` into preallocated activations, the backward pass ``mm`` into
the views of ``G`` (no autograd, no DataLoader, no optimizer object), and the step is one fused ``P -= lr G``.
Torch only (it also runs in the peers' environment).
"""

from __future__ import annotations

import torch
from torch import Tensor


class HandwrittenChain:
    """SGD of one client at a time on a Linear/ReLU chain whose parameter shapes are ``shapes``
    (``[W1, b1, W2, b2, ...]``, ``W`` of shape ``[out, in]``), minibatches of at most ``batch`` rows."""

    def __init__(self, shapes: list[tuple[int, ...]], batch: int, dtype: torch.dtype = torch.float32):
        if len(shapes) % 2 or any(len(s) != 2 for s in shapes[::2]) or any(len(s) != 1 for s in shapes[1::2]):
            raise ValueError(f"shapes: expected [weight, bias] pairs of Linear layers, got {shapes}")
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        self.P = torch.empty(sum(sizes), dtype=dtype)
        self.G = torch.empty_like(self.P)
        self.W = [v.view(s) for v, s in zip(self.P.split(sizes), shapes)]
        self.dW = [v.view(s) for v, s in zip(self.G.split(sizes), shapes)]
        self.n_lin = len(shapes) // 2
        outs = [s[0] for s in shapes[::2]]
        self.xb = torch.empty(batch, shapes[0][1], dtype=dtype)
        self.acts = [torch.empty(batch, o, dtype=dtype) for o in outs]
        self.errs = [torch.empty(batch, o, dtype=dtype) for o in outs]

    def step(self, x: Tensor, y: Tensor, ix: Tensor | None, lr: float) -> Tensor:
        """One SGD step on rows ``ix`` of ``(x, y)`` (all of them when None); the minibatch's mean loss."""
        W, dW, n_lin = self.W, self.dW, self.n_lin
        if ix is None:
            b, h, yb = len(y), x, y
        else:
            b = len(ix)
            h = torch.index_select(x, 0, ix, out=self.xb[:b])
            yb = y[ix]
        xin = h
        for k in range(n_lin):                          # forward: addmm into the preallocated activations
            out = self.acts[k][:b]
            torch.addmm(W[2 * k + 1], h, W[2 * k].t(), out=out)
            if k < n_lin - 1:
                out.relu_()
            h = out
        lp = torch.log_softmax(h, 1)
        loss = -lp.gather(1, yb[:, None]).mean()
        e = self.errs[-1][:b]                           # d loss / d logits = (softmax - onehot) / b
        torch.exp(lp, out=e)
        e[torch.arange(b), yb] -= 1.0
        e.div_(b)
        for k in range(n_lin - 1, -1, -1):              # backward: mm into the views of G
            inp = self.acts[k - 1][:b] if k else xin
            torch.mm(e.t(), inp, out=dW[2 * k])
            torch.sum(e, 0, out=dW[2 * k + 1])
            if k:
                prev = self.errs[k - 1][:b]
                torch.mm(e, W[2 * k], out=prev)
                prev.mul_(inp > 0)                      # ReLU's derivative (its output > 0)
                e = prev
        self.P.add_(self.G, alpha=-lr)
        return loss
