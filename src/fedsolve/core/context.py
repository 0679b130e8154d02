"""The context ``local_update`` runs in: gradients on the client's planned minibatches and local SGD loops.

Written for ONE client: inside the vectorized executor every tensor here is that client's slice of a
batched tensor (``torch.func.vmap``); the sequential executor sets ``eager`` and uses plain autograd.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value

from fedsolve.core.plans import Plan


class LocalContext:
    """What ``local_update`` may use: gradients on its planned minibatches and local SGD loops.

    Inside the vectorized executor every tensor here is one client's slice of a batched tensor,
    so ``local_update`` code is written for one client and never sees the client dimension.
    """

    def __init__(self, problem, plans: Mapping[str, Plan], n: Tensor, weight: Tensor, client: Tensor,
                 train_x: Tensor, train_y: Tensor, round_: int = 0):
        self._problem = problem
        self._model = problem.model
        self._layout = problem.layout
        self._loss = problem.loss_fn
        self.plans = plans
        self.n = n
        self.weight = weight
        self.client = client
        #: the communication round (a Python int, the same for every client of a vectorized call)
        self.round = int(round_)
        self._x = train_x
        self._y = train_y
        self._loss_sum = torch.zeros((), dtype=torch.float32)
        self._loss_cnt = torch.zeros((), dtype=torch.float32)
        self._fixed_batches: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        #: True in the sequential executor: plain autograd on one client (no torch.func overhead)
        self.eager = False

    # -------------------------------------------------------------- gradients
    def loss_on(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted mean loss of the model with flat ``params`` on ``(x, y)``."""
        out = functional_call(self._model, self._layout.unflatten(params), (x,))
        return (self._loss(out, y) * w).sum()

    def loss_grad(self, params: Tensor, phase: str = "train", step: int = 0,
                  loss: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """``(loss, grad)`` on minibatch ``step`` of ``phase`` (weighted mean over its samples).

        ``loss(params, x, y, w)`` replaces the model loss (e.g. a bilevel or adversarial objective).
        """
        x, y, w = self._batch(phase, step)
        if loss is None:
            return self._model_loss_grad(params, x, y, w)
        if self.eager:   # one client: plain autograd (torch.func's transform costs about 2x on small models)
            q = params.detach().requires_grad_(True)
            with torch.enable_grad():
                v = loss(q, x, y, w)
                g, = torch.autograd.grad(v, q)
            return v.detach(), g
        g, v = grad_and_value(lambda q: loss(q, x, y, w))(params)
        return v, g

    def loss(self, params: Tensor, phase: str = "train", step: int = 0) -> Tensor:
        """The model's weighted mean loss on minibatch ``step`` of ``phase``, without a gradient (a forward
        pass only: e.g. IFCA scoring each cluster model)."""
        x, y, w = self._batch(phase, step)
        with torch.no_grad():
            return self.loss_on(params, x, y, w)

    def batch(self, phase: str, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, w)`` of minibatch ``step`` of ``phase`` (for losses that need more than a gradient,
        e.g. a bilevel method's Hessian-vector products)."""
        return self._batch(phase, step)

    def _batch(self, phase: str, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, w)`` of minibatch ``step`` of ``phase``."""
        p = self.plans[phase]
        if p.fixed:  # full batch: gather once; every step (inactive ones too) sees the whole data
            if phase not in self._fixed_batches:
                ix, w = self._trimmed(p, 0)
                self._fixed_batches[phase] = (self._x[ix], self._y[ix], w)
            return self._fixed_batches[phase]
        ix, w = self._trimmed(p, step)
        return self._x[ix], self._y[ix], w

    def _trimmed(self, p: Plan, step: int) -> tuple[Tensor, Tensor]:
        """Rows and weights of minibatch ``step``; run one client at a time (``eager``), without the weight-0
        padding that only makes the clients of a vectorized call the same shape."""
        ix, w = p.idx[step], p.w[step]
        if self.eager:
            c = max(p.length(step), 1)
            ix, w = ix[:c], w[:c]
        return ix, w

    def _model_loss_grad(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        """Gradient w.r.t. the per-parameter tensors, concatenated (no slice-backward over ``[d]``)."""
        lay, model, lossf = self._layout, self._model, self._loss

        def f(pd):
            return (lossf(functional_call(model, pd, (x,)), y) * w).sum()

        if self.eager:
            leaves = {k: t.detach().requires_grad_(True) for k, t in lay.unflatten(params).items()}
            with torch.enable_grad():
                v = f(leaves)
                gs = torch.autograd.grad(v, list(leaves.values()))
            return v.detach(), torch.cat([g.reshape(-1) for g in gs])
        gd, v = grad_and_value(f)(lay.unflatten(params))
        return v, torch.cat([gd[e.name].reshape(-1) for e in lay.entries])

    def num_steps(self, phase: str = "train") -> Tensor:
        """Number of active local steps of this client in ``phase`` (a tensor)."""
        return self.plans[phase].active.sum().to(torch.float32)

    def max_steps(self, phase: str = "train") -> int:
        return int(self.plans[phase].active.shape[-1])

    def is_active(self, phase: str, step: int) -> Tensor:
        return self.plans[phase].active[step]

    def record_loss(self, loss: Tensor, active: Tensor) -> None:
        a = active.to(torch.float32)
        self._loss_sum = self._loss_sum + loss.detach() * a
        self._loss_cnt = self._loss_cnt + a

    @property
    def train_loss(self) -> Tensor:
        return self._loss_sum / self._loss_cnt.clamp_min(1.0)

    # -------------------------------------------------------------- loops
    def sgd(self, params: Tensor, lr: float | Tensor, phase: str = "train",
            extra: Callable[[Tensor], Tensor] | None = None, mask: Tensor | None = None,
            scale: float | Tensor = 1.0, until: Callable[[Tensor, Tensor], Tensor] | None = None,
            loss: Callable | None = None) -> Tensor:
        """Plain (minibatch) gradient descent over the planned steps of ``phase``.

        Each step: ``g = scale * grad f(params) + extra(params)``; ``g *= mask``;
        ``params -= lr * g``. Inactive steps (variable local work) leave ``params`` unchanged.
        ``until(params, g) -> bool`` stops this client for good once true (inexactness rules).
        """
        steps = self.max_steps(phase)
        done = torch.zeros((), dtype=torch.bool)
        for s in range(steps):
            fval, g = self.loss_grad(params, phase, s, loss)
            if not (isinstance(scale, (int, float)) and scale == 1.0):
                g = g * scale
            if extra is not None:
                g = g + extra(params)
            if mask is not None:
                g = g * mask
            live = self.plans[phase].active[s]
            if until is not None:
                done = done | until(params, g)
                live = live & ~done
            self.record_loss(fval, live)
            # one fused pass over the [d] vector: params - lr * g on active steps, unchanged otherwise
            params = torch.addcmul(params, g, live.to(params.dtype) * (-lr))
        return params
