"""The bilevel oracles in closed form for the hyper-representation problem of an MLP (SimFBO spec 2.8): no autograd,
one forward pass per minibatch (:class:`MLPHeadOracles`; ``oracles.make_oracles`` picks it where it applies)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedsolve.core.probes import linear_chain
from fedsolve.families.bilevel.problem import Batch, BilevelOracles, BilevelSpec, ridge_on
from fedsolve.problems import FederatedProblem

# a layer without an activation (act None) is looked up in neither table
_ACT_GRAD: dict[str, Callable[[Tensor], Tensor]] = {  # derivative of the activation from its OUTPUT h
    "relu": lambda h: (h > 0).to(h.dtype),
    "tanh": lambda h: 1 - h * h,
    "sigmoid": lambda h: h * (1 - h),
}
_ACT: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


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
        if spec.lower_reg is not None and not (
            isinstance(spec.lower_reg, ridge_on) and set(spec.lower_reg.names) == head
        ):
            return "g_i's regulariser is not a ridge_on of y"
        return None

    def __init__(self, problem: FederatedProblem, spec: BilevelSpec | None = None):
        super().__init__(problem, spec)
        why = self.why_not(problem, self.spec)
        if why is not None:
            raise ValueError(f"oracles: 'mlp' needs an MLP hyper-representation problem; {why}")
        reg = self.spec.lower_reg
        assert reg is None or isinstance(reg, ridge_on), "why_not admits no other regulariser"
        self.lam = reg.lam if reg is not None else 0.0
        pos = {}  # flat start in the model -> (block, offset in the block)
        starts = {e.name: e.start for e in problem.layout.entries}
        for spec_, blk in ((self._xs, "x"), (self._ys, "y")):
            off = 0
            for name, _, n in spec_:
                pos[starts[name]] = (blk, off)
                off += n
        layers = linear_chain(problem)
        self._hidden = [
            (pos[ly.w[0]][1], ly.w[1], ly.w[2], pos[ly.b][1] if ly.b is not None else None, ly.act)
            for ly in layers[:-1]
        ]
        h = layers[-1]
        self._head = (pos[h.w[0]][1], h.w[1], h.w[2], pos[h.b][1] if h.b is not None else None)
        self._y_has_bias = h.b is not None

    # ---------------------------------------------------------------- pieces
    def _forward(self, x: Tensor, inp: Tensor) -> list[Tensor]:
        """[input, h_1, ..., h_L]: the hidden layers' outputs (h_L = the representation)."""
        hs = [inp.reshape(inp.shape[0], -1).to(x.dtype)]
        for wo, o, i, bo, act in self._hidden:
            s = hs[-1] @ x[wo : wo + o * i].view(o, i).T
            if bo is not None:
                s = s + x[bo : bo + o]
            hs.append(_ACT[act](s) if act is not None else s)
        return hs

    def _head_wb(self, y: Tensor) -> tuple[Tensor, Tensor | None]:
        wo, o, i, bo = self._head
        return y[wo : wo + o * i].view(o, i), (y[bo : bo + o] if bo is not None else None)

    def _y_flat(self, dW: Tensor, db: Tensor | None) -> Tensor:
        """A y-shaped vector from the head's (weight, bias) parts, in the block's order."""
        wo, _, _, bo = self._head
        parts = [(wo, dW.reshape(-1))]
        if bo is not None:
            assert db is not None, "the callers pass the bias part whenever the head has a bias"
            parts.append((bo, db))
        return torch.cat([t for _, t in sorted(parts, key=lambda t: t[0])])

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
            # the passes' weight gradients in ONE product over all their rows (sum_p ds_p^T a_p = [ds]^T [a])
            d_all = ds[0] if len(ds) == 1 else torch.cat(ds)
            a_all = passes[0][0][l] if len(ds) == 1 else torch.cat([hs[l] for hs, _ in passes])
            parts.append((wo, (d_all.T @ a_all).reshape(-1)))
            if bo is not None:
                parts.append((bo, d_all.sum(0)))
            if l > 0:
                W = x[wo : wo + o * i].view(o, i)
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
