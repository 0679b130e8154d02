"""Federated bilevel problems: per client an upper loss f_i(x, y) and a lower loss g_i(x, y).

    min_x Phi(x) = sum_i p_i f_i(x, y*(x))   s.t.   y*(x) = argmin_y sum_i p_i g_i(x, y)      (SimFBO eq. 1)

x and y are two disjoint named blocks of ONE model's flat parameter vector (``ParamLayout`` blocks:
e.g. x = the representation layers, y = the head; or x = a ridge strength held by the model as an extra
parameter that the forward pass ignores). f_i is the model loss on the client's ``upper`` row group
(its validation split) plus an optional regulariser ``upper_reg``; g_i is the model loss on the
``lower`` row group (its training split) plus ``lower_reg`` (e.g. (lam/2)||y||^2, which makes g_i
strongly convex in y for a linear head).

:class:`BilevelOracles` gives the derivatives the solvers need on one minibatch ``(inputs, targets,
weights)``, all through ``torch.func`` (double backward for the second-order ones; no Hessian is
ever formed), so they run one client at a time or under ``vmap`` (the vectorized executor):

* ``grad_y_g``, ``grad_f`` (= (grad_x f, grad_y f));
* ``second_g(x, y, v)`` = (grad2_xy g v, grad2_yy g v): ONE double-backward pass of <grad_y g, v>
  with respect to (x, y) (the mixed Jacobian-vector and the Hessian-vector product);
* ``hvp_yy_g`` and ``jvp_xy_g``: the two halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value

from fedsolve.problems import FederatedProblem

#: ``reg(params) -> scalar``: a regulariser of the flat parameter vector (both blocks)
Regularizer = Callable[[Tensor], Tensor]
Batch = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class BilevelSpec:
    """What makes a :class:`~fedsolve.problems.FederatedProblem` bilevel (``problem.extras["bilevel"]``).

    Args:
        x_block, y_block: names of the layout blocks holding x (upper variable) and y (lower variable);
            disjoint, together every parameter of the model.
        upper_group, lower_group: row groups (``FederatedData.group_names``) f_i and g_i are computed on.
        lower_reg, upper_reg: regularisers added to g_i / f_i (functions of the flat parameters).
        name: a short description for reports.
    """

    x_block: str = "x"
    y_block: str = "y"
    upper_group: str = "upper"
    lower_group: str = "lower"
    lower_reg: Regularizer | None = None
    upper_reg: Regularizer | None = None
    name: str = "bilevel"


def bilevel_spec(problem: FederatedProblem) -> BilevelSpec:
    """The problem's :class:`BilevelSpec`, or a clear error naming what is missing."""
    spec = problem.extras.get("bilevel")
    if not isinstance(spec, BilevelSpec):
        raise ValueError(f"problem {problem.name!r} is not bilevel: it needs extras['bilevel'] (a BilevelSpec); "
                         f"use a bilevel problem kind, e.g. problem: {{kind: hyper_representation}}")
    return spec


class ridge_on:
    """``(lam/2) ||params[idx]||^2`` (a picklable regulariser of one block, given by its indices)."""

    def __init__(self, idx: Tensor, lam: float):
        self.idx, self.lam = idx, float(lam)

    def __call__(self, params: Tensor) -> Tensor:
        return 0.5 * self.lam * params[..., self.idx].pow(2).sum(-1)


class BilevelOracles:
    """Derivative oracles of one bilevel problem on one client's minibatch (pure tensor code).

    ``x`` and ``y`` are the flat blocks (``[d_x]``, ``[d_y]``); :meth:`join` puts them back into the
    model's flat parameter vector and :meth:`split` takes them out.
    """

    def __init__(self, problem: FederatedProblem, spec: BilevelSpec | None = None):
        self.problem = problem
        self.spec = spec if spec is not None else bilevel_spec(problem)
        lay = problem.layout
        mx, my = lay.mask(self.spec.x_block), lay.mask(self.spec.y_block)
        if bool((mx & my).any()) or not bool((mx | my).all()):
            raise ValueError(f"bilevel blocks {self.spec.x_block!r} (x) and {self.spec.y_block!r} (y) must be "
                             f"disjoint and cover every parameter; parameters are {lay.names}")
        groups = problem.data.group_names
        for g in (self.spec.upper_group, self.spec.lower_group):
            if g not in groups:
                raise ValueError(f"bilevel row group {g!r} not in the data's group_names {list(groups)}")
        self.x_idx = torch.nonzero(mx).flatten()
        self.y_idx = torch.nonzero(my).flatten()
        self._inv = torch.argsort(torch.cat([self.x_idx, self.y_idx]))
        self.dx, self.dy = int(self.x_idx.numel()), int(self.y_idx.numel())

    # ---------------------------------------------------------------- blocks
    def join(self, x: Tensor, y: Tensor) -> Tensor:
        """(x, y) -> the model's flat parameters (a gather: differentiable and vmap-friendly)."""
        return torch.cat([x, y], -1)[..., self._inv]

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        return params[..., self.x_idx], params[..., self.y_idx]

    # ---------------------------------------------------------------- losses
    def _model_loss(self, params: Tensor, b: Batch) -> Tensor:
        inp, tgt, w = b
        out = functional_call(self.problem.model, self.problem.layout.unflatten(params), (inp,))
        return (self.problem.loss_fn(out, tgt) * w).sum()

    def f(self, x: Tensor, y: Tensor, b: Batch) -> Tensor:
        """Upper loss f_i(x, y) on a minibatch of the upper split."""
        p = self.join(x, y)
        reg = self.spec.upper_reg
        return self._model_loss(p, b) + (reg(p) if reg is not None else 0.0)

    def g(self, x: Tensor, y: Tensor, b: Batch) -> Tensor:
        """Lower loss g_i(x, y) on a minibatch of the lower split."""
        p = self.join(x, y)
        reg = self.spec.lower_reg
        return self._model_loss(p, b) + (reg(p) if reg is not None else 0.0)

    # ---------------------------------------------------------------- first order
    def grad_y_g(self, x: Tensor, y: Tensor, b: Batch) -> tuple[Tensor, Tensor]:
        """(grad_y g, g)."""
        return grad_and_value(self.g, argnums=1)(x, y, b)

    def grad_f(self, x: Tensor, y: Tensor, b: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """(grad_x f, grad_y f, f)."""
        (gx, gy), val = grad_and_value(self.f, argnums=(0, 1))(x, y, b)
        return gx, gy, val

    # ---------------------------------------------------------------- second order (double backward)
    def second_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> tuple[Tensor, Tensor]:
        """(grad2_xy g v, grad2_yy g v) = grad_(x,y) <grad_y g(x, y), v> (one double-backward pass)."""
        def inner(xx, yy):
            return (grad(self.g, argnums=1)(xx, yy, b) * v).sum()

        return grad(inner, argnums=(0, 1))(x, y)

    def hvp_yy_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> Tensor:
        """grad2_yy g(x, y) v."""
        return grad(lambda yy: (grad(self.g, argnums=1)(x, yy, b) * v).sum())(y)

    def jvp_xy_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> Tensor:
        """grad2_xy g(x, y) v = grad_x <grad_y g(x, y), v> (a d_x vector)."""
        return grad(lambda xx: (grad(self.g, argnums=1)(xx, y, b) * v).sum())(x)

    def surrogate(self, x: Tensor, y: Tensor, v: Tensor, bf: Batch, bg: Batch) -> Tensor:
        """The local surrogate hypergradient barGrad f_i(x, y, v) = grad_x f - grad2_xy g v (Sec. 2.2)."""
        gx, _, _ = self.grad_f(x, y, bf)
        return gx - self.jvp_xy_g(x, y, v, bg)


def project_ball(v: Tensor, r: float | None) -> Tensor:
    """P_r(v) = min{1, r/||v||} v over the whole flat vector (identity when r is None)."""
    if r is None:
        return v
    nrm = v.norm()
    return v * torch.clamp(r / nrm.clamp_min(1e-300), max=1.0)
