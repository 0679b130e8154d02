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

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value

from fedsolve.core.probes import linear_chain
from fedsolve.problems import FederatedProblem

#: ``reg(params) -> scalar``: a regulariser of the model's parameters (``{name: tensor}``, both blocks)
Regularizer = Callable[[dict[str, Tensor]], Tensor]
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
    if not isinstance(spec, BilevelSpec):
        raise ValueError(f"problem: {problem.name!r} is not bilevel (it has no extras['bilevel'], a BilevelSpec); "
                         f"allowed: a bilevel problem kind in the config (problem: {{kind: hyper_representation}}), "
                         f"or a problem from fedsolve.families.bilevel.client_problem")
    return spec


class ridge_on:
    """``(lam/2) sum_n ||params[n]||^2`` over the named parameters (a picklable regulariser of one block)."""

    def __init__(self, names: list[str], lam: float):
        self.names, self.lam = list(names), float(lam)

    def __call__(self, params: dict[str, Tensor]) -> Tensor:
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
            raise ValueError(f"bilevel blocks {self.spec.x_block!r} (x) and {self.spec.y_block!r} (y) must be "
                             f"disjoint and cover every parameter; parameters are {lay.names}")
        for e in lay.entries:
            part = mx[e.start:e.start + e.numel]
            if bool(part.any()) and not bool(part.all()):
                raise ValueError(f"bilevel block {self.spec.x_block!r} splits parameter {e.name!r}; blocks must "
                                 f"hold whole parameters")
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
    def on(self, client: Tensor) -> "BilevelOracles":
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
            out[name] = vec[a:a + n].reshape(shape)
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


_ACT_GRAD = {  # derivative of the activation from its OUTPUT h
    "relu": lambda h: (h > 0).to(h.dtype),
    "tanh": lambda h: 1 - h * h,
    "sigmoid": lambda h: h * (1 - h),
    None: None,
}
_ACT = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, None: None}


class MLPHeadOracles(BilevelOracles):
    """The same oracles in closed form for the hyper-representation problem of an MLP (spec 2.8), no autograd.

    Applies when the model is a chain of ``nn.Linear`` layers with elementwise activations
    (:func:`~fedsolve.core.probes.linear_chain`), y is exactly its last (output) layer, x the
    hidden layers, both losses are cross entropy, g_i's regulariser is a :class:`ridge_on` of y's parameters
    and f_i has none. With h = the representation (x's output), z = W2 h + b2, p = softmax(z), e = one-hot
    label, r = w (p - e) per sample (w: the minibatch weights) and, for v = (VW, vb), u = VW h + vb and
    dp = p * u - p (p . u):

        grad_y g      = (r^T h + lam W2,  sum r + lam b2)                 grad_y f: the same, lam = 0
        grad2_yy g v  = ((w dp)^T h + lam VW,  sum w dp + lam vb)
        grad_x f      = backprop of dh = r W2 through the hidden layers
        grad2_xy g v  = backprop of dh = r VW + (w dp) W2 through the hidden layers

    (the x-derivative of a function of h needs only first-order backprop through h(x)). Every oracle runs one
    forward pass per minibatch and shares it between the derivatives it returns; the x-part of the surrogate
    accumulates grad_x f's and grad2_xy g v's weight gradients in one addmm per layer. Pure
    tensor code of one client. ``tests/test_bilevel.py`` checks every oracle against
    the torch.func path.
    """

    @staticmethod
    def why_not(problem: FederatedProblem, spec: BilevelSpec) -> str | None:
        """Why the closed forms do not apply to this problem (None: they do)."""
        if spec.functions is not None:
            return "f_i and g_i are the clients' own functions"
        try:
            layers = linear_chain(problem)
        except ValueError as e:
            return str(e)
        if problem.loss_name != "cross_entropy":
            return f"loss {problem.loss_name!r} is not cross_entropy"
        lay = problem.layout
        names = {e.start: e.name for e in lay.entries}
        head = {names[layers[-1].w[0]]} | ({names[layers[-1].b]} if layers[-1].b is not None else set())
        if set(lay.block_params(spec.y_block)) != head:
            return f"y ({lay.block_params(spec.y_block)}) is not exactly the output layer {sorted(head)}"
        if spec.upper_reg is not None:
            return "f_i has a regulariser"
        if spec.lower_reg is not None and not (isinstance(spec.lower_reg, ridge_on)
                                               and set(spec.lower_reg.names) == head):
            return "g_i's regulariser is not a ridge_on of y"
        return None

    def __init__(self, problem: FederatedProblem, spec: BilevelSpec | None = None):
        super().__init__(problem, spec)
        why = self.why_not(problem, self.spec)
        if why is not None:
            raise ValueError(f"oracles: 'mlp' needs an MLP hyper-representation problem; {why}")
        self.lam = self.spec.lower_reg.lam if self.spec.lower_reg is not None else 0.0
        pos = {}   # flat start in the model -> (block, offset in the block)
        starts = {e.name: e.start for e in problem.layout.entries}
        for spec_, blk in ((self._xs, "x"), (self._ys, "y")):
            off = 0
            for name, _, n in spec_:
                pos[starts[name]] = (blk, off)
                off += n
        layers = linear_chain(problem)
        self._hidden = [(pos[ly.w[0]][1], ly.w[1], ly.w[2], pos[ly.b][1] if ly.b is not None else None, ly.act)
                        for ly in layers[:-1]]
        h = layers[-1]
        self._head = (pos[h.w[0]][1], h.w[1], h.w[2], pos[h.b][1] if h.b is not None else None)
        self._y_has_bias = h.b is not None

    # ---------------------------------------------------------------- pieces
    def _forward(self, x: Tensor, inp: Tensor) -> list[Tensor]:
        """[input, h_1, ..., h_L]: the hidden layers' outputs (h_L = the representation)."""
        hs = [inp.reshape(inp.shape[0], -1).to(x.dtype)]
        for wo, o, i, bo, act in self._hidden:
            s = hs[-1] @ x[wo:wo + o * i].view(o, i).T
            if bo is not None:
                s = s + x[bo:bo + o]
            hs.append(_ACT[act](s) if act is not None else s)
        return hs

    def _head_wb(self, y: Tensor) -> tuple[Tensor, Tensor | None]:
        wo, o, i, bo = self._head
        return y[wo:wo + o * i].view(o, i), (y[bo:bo + o] if bo is not None else None)

    def _y_flat(self, dW: Tensor, db: Tensor) -> Tensor:
        """A y-shaped vector from the head's (weight, bias) parts, in the block's order."""
        wo, o, i, bo = self._head
        parts = sorted([(wo, dW.reshape(-1))] + ([(bo, db)] if bo is not None else []), key=lambda t: t[0])
        return torch.cat([t for _, t in parts])

    def _probs(self, y: Tensor, h: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(p, p - e, per-sample cross entropy)."""
        W2, b2 = self._head_wb(y)
        z = h @ W2.T
        if b2 is not None:
            z = z + b2
        logp = torch.log_softmax(z, -1)
        p = logp.exp()
        onehot = torch.nn.functional.one_hot(tgt.long(), z.shape[-1]).to(z.dtype)
        return p, p - onehot, -(logp * onehot).sum(-1)

    def _x_grad(self, x: Tensor, *passes: tuple[list[Tensor], Tensor]) -> Tensor:
        """x-gradient of sum over ``passes = (hs, dh)`` of sum_n <dh_n, h_L(x; a_n)>: first-order backprop of each
        dh through the hidden layers, the weight gradients of the passes accumulated in one addmm per layer."""
        parts = []
        cur = [dh for _, dh in passes]
        for l in range(len(self._hidden) - 1, -1, -1):
            wo, o, i, bo, act = self._hidden[l]
            ds = [d * _ACT_GRAD[act](hs[l + 1]) if act is not None else d for (hs, _), d in zip(passes, cur)]
            gW = ds[0].T @ passes[0][0][l]
            for d, (hs, _) in zip(ds[1:], passes[1:]):
                gW = torch.addmm(gW, d.T, hs[l])
            parts.append((wo, gW.reshape(-1)))
            if bo is not None:
                parts.append((bo, sum(d.sum(0) for d in ds)))
            if l > 0:
                W = x[wo:wo + o * i].view(o, i)
                cur = [d @ W for d in ds]
        return torch.cat([t for _, t in sorted(parts, key=lambda t: t[0])])

    def _lower_parts(self, y: Tensor, v: Tensor, h: Tensor, b: Batch, need_g: bool = True):
        """(r, w dp, grad_y g, grad2_yy g v) of one lower minibatch with representation h."""
        _, tgt, w = b
        p, pe, _ = self._probs(y, h, tgt)
        w = w.to(h.dtype).unsqueeze(-1)
        VW, vb = self._head_wb(v)
        u = h @ VW.T
        if vb is not None:
            u = u + vb
        wdp = w * (p * u - p * (p * u).sum(-1, keepdim=True))
        r = w * pe
        W2, b2 = self._head_wb(y)
        lam = self.lam
        hv = self._y_flat(wdp.T @ h + lam * VW, wdp.sum(0) + lam * vb if vb is not None else None)
        gy = self._y_flat(r.T @ h + lam * W2, r.sum(0) + lam * b2 if b2 is not None else None) if need_g else None
        return r, wdp, gy, hv

    def _cross_dh(self, y: Tensor, v: Tensor, r: Tensor, wdp: Tensor) -> Tensor:
        """d/dh of <grad_y g, v> per sample: r VW + (w dp) W2."""
        VW, _ = self._head_wb(v)
        W2, _ = self._head_wb(y)
        return r @ VW + wdp @ W2

    # ---------------------------------------------------------------- the oracles
    def f(self, x, y, b):
        hs = self._forward(x, b[0])
        return (self._probs(y, hs[-1], b[1])[2] * b[2].to(hs[-1].dtype)).sum()

    def g(self, x, y, b):
        val = self.f(x, y, b)
        return val + 0.5 * self.lam * y.pow(2).sum() if self.lam else val

    def grad_y_g(self, x, y, b):
        h = self._forward(x, b[0])[-1]
        _, pe, ce = self._probs(y, h, b[1])
        w = b[2].to(h.dtype)
        r = w.unsqueeze(-1) * pe
        W2, b2 = self._head_wb(y)
        gy = self._y_flat(r.T @ h + self.lam * W2, r.sum(0) + self.lam * b2 if b2 is not None else None)
        return gy, (ce * w).sum() + 0.5 * self.lam * y.pow(2).sum()

    def _upper(self, x, y, b, with_x: bool):
        hs = self._forward(x, b[0])
        _, pe, ce = self._probs(y, hs[-1], b[1])
        w = b[2].to(hs[-1].dtype)
        r = w.unsqueeze(-1) * pe
        gy = self._y_flat(r.T @ hs[-1], r.sum(0) if self._y_has_bias else None)
        W2, _ = self._head_wb(y)
        return hs, r @ W2 if with_x else None, gy, (ce * w).sum()

    def grad_f(self, x, y, b):
        hs, dh, gy, val = self._upper(x, y, b, True)
        return self._x_grad(x, (hs, dh)), gy, val

    def grad_y_f(self, x, y, b):
        return self._upper(x, y, b, False)[2]

    def second_g(self, x, y, v, b):
        hs = self._forward(x, b[0])
        r, wdp, _, hv = self._lower_parts(y, v, hs[-1], b, need_g=False)
        return self._x_grad(x, (hs, self._cross_dh(y, v, r, wdp))), hv

    def g_derivatives(self, x, y, v, b):
        hs = self._forward(x, b[0])
        r, wdp, gy, hv = self._lower_parts(y, v, hs[-1], b)
        return gy, self._x_grad(x, (hs, self._cross_dh(y, v, r, wdp))), hv

    def hvp_yy_g(self, x, y, v, b):
        h = self._forward(x, b[0])[-1]
        return self._lower_parts(y, v, h, b, need_g=False)[3]

    def jvp_xy_g(self, x, y, v, b):
        return self.second_g(x, y, v, b)[0]

    def surrogate(self, x, y, v, bf, bg):
        hf, dhf, _, val = self._upper(x, y, bf, True)
        hg = self._forward(x, bg[0])
        r, wdp, _, _ = self._lower_parts(y, v, hg[-1], bg, need_g=False)
        # grad_x f(bf) - grad2_xy g(bg) v: the two backward passes share each layer's weight-gradient product
        return self._x_grad(x, (hf, dhf), (hg, -self._cross_dh(y, v, r, wdp))), val

    def ls_grad(self, x, y, v, bg, bf, with_value: bool = False):
        _, _, gy, val = self._upper(x, y, bf, False)
        d = self.hvp_yy_g(x, y, v, bg) - gy
        return (d, val) if with_value else d


def make_oracles(problem: FederatedProblem, kind: str = "auto") -> BilevelOracles:
    """The bilevel oracles of ``problem``: ``autograd`` (torch.func double backward, any model), ``mlp`` (the
    closed forms of :class:`MLPHeadOracles`) or ``auto`` (``mlp`` where it applies, else ``autograd``); the
    clients' own functions' oracles where the problem states them (``BilevelSpec.functions``)."""
    if kind not in ("auto", "autograd", "mlp"):
        raise ValueError(f"oracles: {kind!r} is not one of 'auto', 'autograd', 'mlp'")
    spec = bilevel_spec(problem)
    if spec.functions is not None and kind != "mlp":
        return spec.functions.oracles(problem, spec)
    if kind == "mlp" or (kind == "auto" and MLPHeadOracles.why_not(problem, spec) is None):
        return MLPHeadOracles(problem, spec)
    return BilevelOracles(problem, spec)


def project_ball(v: Tensor, r: float | None) -> Tensor:
    """P_r(v) = min{1, r/||v||} v over the whole flat vector (identity when r is None)."""
    if r is None:
        return v
    nrm = v.norm()
    return v * torch.clamp(r / nrm.clamp_min(1e-300), max=1.0)
