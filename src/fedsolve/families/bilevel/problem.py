"""Federated bilevel problems: per client an upper loss f_i(x, y) and a lower loss g_i(x, y).

    min_x Phi(x) = sum_i p_i f_i(x, y*(x))   s.t.   y*(x) = argmin_y sum_i p_i g_i(x, y)      (SimFBO eq. 1)

x and y are two disjoint named blocks of ONE model's flat parameter vector (``ParamLayout`` blocks:
e.g. x = the representation layers, y = the head; or x = a ridge strength held by the model as an extra
parameter that the forward pass ignores). f_i is the model loss on the client's ``upper`` row group
(its validation split) plus an optional regulariser ``upper_reg``; g_i is the model loss on the
``lower`` row group (its training split) plus ``lower_reg`` (e.g. (lam/2)||y||^2, which makes g_i
strongly convex in y for a linear head). Or f_i and g_i are the client's own plain torch functions
(``families/bilevel/functions.py``: ``BilevelSpec.functions``).

:class:`BilevelOracles` gives the derivatives the solvers need on one minibatch ``(inputs, targets,
weights)``, all through ``torch.func`` (double backward for the second-order ones; no Hessian is
ever formed): pure tensor code of one client (``on(i)``: the oracles of client i, for problems whose
losses depend on the client):

* ``grad_y_g``, ``grad_f`` (= (grad_x f, grad_y f));
* ``second_g(x, y, v)`` = (grad2_xy g v, grad2_yy g v): ONE double-backward pass of <grad_y g, v>
  with respect to (x, y) (the mixed Jacobian-vector and the Hessian-vector product);
* ``hvp_yy_g`` and ``jvp_xy_g``: the two halves;
* ``surrogate`` (barGrad f_i = grad_x f - grad2_xy g v) and ``ls_grad`` (grad_v R_i = grad2_yy g v - grad_y f),
  SimFBO's x- and v-directions;
* ``outputs(x, y, inputs)``: the model's predictions (evaluation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value

from fedsolve.problems import FederatedProblem

#: ``reg(params) -> scalar``: a regulariser of the model's parameters (``{name: tensor}``, both blocks)
Regularizer = Callable[[dict[str, Tensor]], Tensor | float]
Batch = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class BilevelSpec:
    """What makes a :class:`~fedsolve.problems.FederatedProblem` bilevel (``problem.extras["bilevel"]``).

    Args:
        x_block, y_block: names of the layout blocks holding x (upper variable) and y (lower variable);
            disjoint, together every parameter of the model.
        upper_group, lower_group: row groups (``FederatedData.group_names``) f_i and g_i are computed on.
        lower_reg, upper_reg: regularisers added to g_i / f_i (functions of the ``{name: tensor}`` parameters).
        name: a short description for reports.
        functions: client i's own f_i and g_i as plain torch functions (``families/bilevel/functions.py``), in
            place of the model loss on the row groups; None: the model loss.
    """

    x_block: str = "x"
    y_block: str = "y"
    upper_group: str = "upper"
    lower_group: str = "lower"
    lower_reg: Regularizer | None = None
    upper_reg: Regularizer | None = None
    name: str = "bilevel"
    functions: Any = None


def bilevel_spec(problem: FederatedProblem) -> BilevelSpec:
    """The problem's :class:`BilevelSpec`, or a clear error naming what is missing."""
    spec = problem.extras.get("bilevel")
    if not isinstance(spec, BilevelSpec):  # a problem of another kind: a config error (ValueError)
        why = (
            f"problem: {problem.name!r} is not bilevel (it has no extras['bilevel'], a BilevelSpec); allowed: a "
            f"bilevel problem kind in the config (problem: {{kind: hyper_representation}}), or a problem from "
            f"fedsolve.families.bilevel.client_problem"
        )
        raise ValueError(why)
    return spec


class ridge_on:
    """``(lam/2) sum_n ||params[n]||^2`` over the named parameters (a picklable regulariser of one block)."""

    def __init__(self, names: list[str], lam: float):
        self.names, self.lam = list(names), float(lam)

    def __call__(self, params: dict[str, Tensor]) -> Tensor | float:  # 0.0 over no names
        return 0.5 * self.lam * sum(params[n].pow(2).sum() for n in self.names)


class BilevelOracles:
    """Derivative oracles of one bilevel problem on one client's minibatch (pure tensor code).

    ``x`` and ``y`` are flat blocks (``[d_x]``, ``[d_y]``: the block's parameters concatenated in layout
    order); :meth:`join` puts them back into the model's flat parameter vector and :meth:`split` takes them
    out. Derivatives are taken with respect to the per-parameter tensors (views of the flat blocks), so no
    backward pass ever scatters into a full-length vector.
    """

    def __init__(self, problem: FederatedProblem, spec: BilevelSpec | None = None):
        self.problem = problem
        self.spec = spec if spec is not None else bilevel_spec(problem)
        lay = problem.layout
        mx, my = lay.mask(self.spec.x_block), lay.mask(self.spec.y_block)
        if bool((mx & my).any()) or not bool((mx | my).all()):
            raise ValueError(
                f"bilevel blocks {self.spec.x_block!r} (x) and {self.spec.y_block!r} (y) must be "
                f"disjoint and cover every parameter; parameters are {lay.names}"
            )
        for e in lay.entries:
            part = mx[e.start : e.start + e.numel]
            if bool(part.any()) and not bool(part.all()):
                raise ValueError(
                    f"bilevel block {self.spec.x_block!r} splits parameter {e.name!r}; blocks must "
                    f"hold whole parameters"
                )
        groups = problem.data.group_names
        for g in (self.spec.upper_group, self.spec.lower_group):
            if g not in groups:
                raise ValueError(f"bilevel row group {g!r} not in the data's group_names {list(groups)}")
        self.x_idx = torch.nonzero(mx).flatten()
        self.y_idx = torch.nonzero(my).flatten()
        self._inv = torch.argsort(torch.cat([self.x_idx, self.y_idx]))
        self.dx, self.dy = int(self.x_idx.numel()), int(self.y_idx.numel())
        self._xs = [(e.name, e.shape, e.numel) for e in lay.entries if bool(mx[e.start])]
        self._ys = [(e.name, e.shape, e.numel) for e in lay.entries if bool(my[e.start])]

    # ---------------------------------------------------------------- blocks
    def on(self, client: Tensor) -> BilevelOracles:
        """The oracles of client ``client`` (a 0-dim index): these same ones, since f_i and g_i are the model loss
        on the client's own minibatches (:class:`~fedsolve.families.bilevel.functions.FunctionOracles` binds the
        client's own functions)."""
        return self

    def join(self, x: Tensor, y: Tensor) -> Tensor:
        """(x, y) -> the model's flat parameters (a gather: differentiable, pure tensor code)."""
        return torch.cat([x, y], -1)[..., self._inv]

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        return params[..., self.x_idx], params[..., self.y_idx]

    @staticmethod
    def _views(vec: Tensor, spec) -> dict[str, Tensor]:
        out, a = {}, 0
        for name, shape, n in spec:
            out[name] = vec[a : a + n].reshape(shape)
            a += n
        return out

    @staticmethod
    def _flat(d: dict[str, Tensor], spec) -> Tensor:
        return torch.cat([d[name].reshape(-1) for name, _, _ in spec])

    # ---------------------------------------------------------------- losses on parameter dicts
    def _loss(self, reg: Regularizer | None, px: dict, py: dict, b: Batch) -> Tensor:
        inp, tgt, w = b
        params = {**px, **py}
        out = functional_call(self.problem.model, params, (inp,))
        val = (self.problem.loss_fn(out, tgt) * w).sum()
        return val + reg(params) if reg is not None else val

    def _f(self, px, py, b):
        return self._loss(self.spec.upper_reg, px, py, b)

    def _g(self, px, py, b):
        return self._loss(self.spec.lower_reg, px, py, b)

    def outputs(self, x: Tensor, y: Tensor, inp: Tensor) -> Tensor:
        """The model's outputs for the inputs ``inp`` with parameters (x, y) (no loss, no derivative)."""
        return functional_call(self.problem.model, {**self._views(x, self._xs), **self._views(y, self._ys)}, (inp,))

    def f(self, x: Tensor, y: Tensor, b: Batch) -> Tensor:
        """Upper loss f_i(x, y) on a minibatch of the upper split."""
        return self._f(self._views(x, self._xs), self._views(y, self._ys), b)

    def g(self, x: Tensor, y: Tensor, b: Batch) -> Tensor:
        """Lower loss g_i(x, y) on a minibatch of the lower split."""
        return self._g(self._views(x, self._xs), self._views(y, self._ys), b)

    # ---------------------------------------------------------------- first order
    def grad_y_g(self, x: Tensor, y: Tensor, b: Batch) -> tuple[Tensor, Tensor]:
        """(grad_y g, g)."""
        gy, val = grad_and_value(self._g, argnums=1)(self._views(x, self._xs), self._views(y, self._ys), b)
        return self._flat(gy, self._ys), val

    def grad_f(self, x: Tensor, y: Tensor, b: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """(grad_x f, grad_y f, f)."""
        (gx, gy), val = grad_and_value(self._f, argnums=(0, 1))(self._views(x, self._xs), self._views(y, self._ys), b)
        return self._flat(gx, self._xs), self._flat(gy, self._ys), val

    def grad_y_f(self, x: Tensor, y: Tensor, b: Batch) -> Tensor:
        """grad_y f (no x-gradient computed)."""
        gy = grad(self._f, argnums=1)(self._views(x, self._xs), self._views(y, self._ys), b)
        return self._flat(gy, self._ys)

    # ---------------------------------------------------------------- second order (double backward)
    def _inner(self, v: Tensor, b: Batch):
        """(px, py) -> <grad_y g(px, py), v>."""
        vd = self._views(v, self._ys)

        def inner(px, py):
            gy = grad(self._g, argnums=1)(px, py, b)
            return sum((gy[k] * vd[k]).sum() for k in gy)

        return inner

    def second_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> tuple[Tensor, Tensor]:
        """(grad2_xy g v, grad2_yy g v) = grad_(x,y) <grad_y g(x, y), v> (one double-backward pass)."""
        jx, hy = grad(self._inner(v, b), argnums=(0, 1))(self._views(x, self._xs), self._views(y, self._ys))
        return self._flat(jx, self._xs), self._flat(hy, self._ys)

    def hvp_yy_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> Tensor:
        """grad2_yy g(x, y) v."""
        hy = grad(self._inner(v, b), argnums=1)(self._views(x, self._xs), self._views(y, self._ys))
        return self._flat(hy, self._ys)

    def jvp_xy_g(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> Tensor:
        """grad2_xy g(x, y) v = grad_x <grad_y g(x, y), v> (a d_x vector)."""
        jx = grad(self._inner(v, b), argnums=0)(self._views(x, self._xs), self._views(y, self._ys))
        return self._flat(jx, self._xs)

    def g_derivatives(self, x: Tensor, y: Tensor, v: Tensor, b: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """(grad_y g, grad2_xy g v, grad2_yy g v) on ONE lower minibatch (SimFBO's shared-batch step)."""
        gy, _ = self.grad_y_g(x, y, b)
        jv, hv = self.second_g(x, y, v, b)
        return gy, jv, hv

    def surrogate(self, x: Tensor, y: Tensor, v: Tensor, bf: Batch, bg: Batch) -> tuple[Tensor, Tensor]:
        """(barGrad f_i(x, y, v), f_i) with barGrad f_i = grad_x f(bf) - grad2_xy g(bg) v (Sec. 2.2; combined per
        parameter tensor, flattened once)."""
        px, py = self._views(x, self._xs), self._views(y, self._ys)
        gx, val = grad_and_value(self._f, argnums=0)(px, py, bf)
        jx = grad(self._inner(v, bg), argnums=0)(px, py)
        return self._flat({k: gx[k] - jx[k] for k in gx}, self._xs), val

    def ls_grad(self, x: Tensor, y: Tensor, v: Tensor, bg: Batch, bf: Batch, with_value: bool = False):
        """grad_v R_i(x, y, v) = grad2_yy g(bg) v - grad_y f(bf) (the linear-system direction, eq. 2); with
        ``with_value``: (grad_v R_i, f_i on bf)."""
        if not with_value:
            return self.hvp_yy_g(x, y, v, bg) - self.grad_y_f(x, y, bf)
        gy, val = grad_and_value(self._f, argnums=1)(self._views(x, self._xs), self._views(y, self._ys), bf)
        return self.hvp_yy_g(x, y, v, bg) - self._flat(gy, self._ys), val


def project_ball(v: Tensor, r: float | None) -> Tensor:
    """P_r(v) = min{1, r/||v||} v over the whole flat vector (identity when r is None)."""
    if r is None:
        return v
    nrm = v.norm()
    return v * torch.clamp(r / nrm.clamp_min(1e-300), max=1.0)
