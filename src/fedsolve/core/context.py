"""The context ``local_update`` runs in: gradients on the client's planned minibatches and local SGD loops.

Written for ONE client: inside the vectorized executor every tensor here is that client's slice of a
batched tensor (``torch.func.vmap``); the sequential executor sets ``eager`` and uses plain autograd.

Block-restricted steps (:class:`ParamBlock`, :meth:`LocalContext.block_sgd`): a phase that trains one block of the
model (a personal head, a shared body) differentiates with respect to that block's parameter tensors only (the
others enter ``functional_call`` as constants) and updates that block's vector only, with the phase's affine
terms ``a * p + c`` (weight decay, proximal pulls, duals) in the same step, instead of a masked gradient of the
whole flat vector and several passes over ``[d]`` per step.

Custom objectives on parameter tensors (:class:`TensorLoss`): a local objective written on ``{name: tensor}``
(e.g. the minimax saddle loss) is differentiated with respect to the model's parameter tensors and the gradients
concatenated, as for the model's own loss, instead of through slices of the flat ``[d]`` vector (whose backward
forms and sums one ``[d]`` gradient per parameter tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value

from fedsolve.core.newton import newton
from fedsolve.core.plans import Plan
from fedsolve.core.statements import Descend, Minimize, Solved


class ParamBlock:
    """Whole parameter tensors of a :class:`~fedsolve.core.layout.ParamLayout` as one *block vector*: their
    slices of the flat ``[d]`` vector concatenated in layout order, i.e. ``full[..., mask]``.

    ``mask``: a boolean ``[d]`` mask (e.g. ``layout.mask("personal")``) that covers each parameter tensor entirely or
    not at all. ``rest`` is the complement block. ``unflatten`` gives ``{name: view}`` of a block vector for
    ``functional_call``; ``gather`` / ``scatter`` convert between the flat ``[..., d]`` vector and (block, rest).
    """

    def __init__(self, layout, mask: Tensor, _rest: ParamBlock | None = None):
        mask = torch.as_tensor(mask).to(torch.bool).cpu()
        if mask.shape != (layout.dim,):
            raise ValueError(
                f"ParamBlock: mask must be a boolean [d] vector with d = {layout.dim}, got shape {tuple(mask.shape)}"
            )
        self.mask = mask
        #: ``(name, shape, offset in the block vector, numel)`` of the block's tensors, in layout order
        self.entries: list[tuple[str, tuple[int, ...], int, int]] = []
        off = 0
        for e in layout.entries:
            part = mask[e.start : e.start + e.numel]
            inside = bool(part.all())
            if not inside and bool(part.any()):
                raise ValueError(
                    f"ParamBlock: the mask covers part of parameter {e.name!r} only; a block is made "
                    f"of whole parameter tensors"
                )
            if inside:
                self.entries.append((e.name, tuple(e.shape), off, e.numel))
                off += e.numel
        self.names = [e[0] for e in self.entries]
        self.size = off
        self.index = mask.nonzero().flatten()
        self._layout = layout
        self._rest = _rest
        #: the flat vector as maximal runs of the block's and the rest's coordinates, in order: ``(in block?,
        #: start in the flat vector, start in that part's vector, length)``; gather and scatter are slices of them
        self._runs: list[tuple[bool, int, int, int]] = []
        pos = {True: 0, False: 0}
        flags = mask.tolist()
        a = 0
        for j in range(1, len(flags) + 1):
            if j == len(flags) or flags[j] != flags[a]:
                self._runs.append((flags[a], a, pos[flags[a]], j - a))
                pos[flags[a]] += j - a
                a = j

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The block's maximal runs ``[a, b)`` of coordinates in the flat vector."""
        return tuple((f, f + n) for inside, f, _, n in self._runs if inside)

    @property
    def rest(self) -> ParamBlock:
        """The complement block (the parameters this block leaves out)."""
        if self._rest is None:
            self._rest = ParamBlock(self._layout, ~self.mask, _rest=self)
        return self._rest

    def unflatten(self, vec: Tensor) -> dict[str, Tensor]:
        """Block vector ``[..., size]`` -> ``{name: tensor[..., *shape]}`` (views)."""
        lead = vec.shape[:-1]
        return {n: vec[..., o : o + k].reshape(*lead, *sh) for n, sh, o, k in self.entries}

    def flatten(self, tensors: Mapping[str, Tensor]) -> Tensor:
        """``{name: tensor}`` (e.g. gradients) -> block vector, concatenated in layout order."""
        parts = [
            tensors[n].reshape(*tensors[n].shape[: tensors[n].dim() - len(sh)], -1) for n, sh, _, _ in self.entries
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)

    def gather(self, full: Tensor) -> Tensor:
        """The block's part of a flat ``[..., d]`` vector (``full[..., mask]``, a new tensor): its runs of
        coordinates sliced and concatenated (a whole parameter tensor is one run)."""
        parts = [full[..., f : f + n] for inside, f, _, n in self._runs if inside]
        if not parts:
            return full[..., :0].clone()
        return parts[0].clone() if len(parts) == 1 else torch.cat(parts, -1)

    def scatter(self, block: Tensor, rest: Tensor) -> Tensor:
        """The flat ``[..., d]`` vector with this block's part ``block`` and the complement's ``rest`` (the two
        with the same leading dimensions): their runs concatenated in the layout's order."""
        return torch.cat([(block if inside else rest)[..., o : o + n] for inside, _, o, n in self._runs], -1)


class TensorLoss:
    """A local objective written on the model's parameter tensors: ``fn(params, x, y, w) -> scalar`` with
    ``params`` a ``{name: tensor}`` dict of the layout's tensors and ``(x, y, w)`` one weighted minibatch.

    Called on a flat ``[d]`` vector (``loss(vec, x, y, w)``) it unflattens it first, so it stands wherever a flat
    objective does; :meth:`LocalContext.loss_grad` and :meth:`LocalContext.sgd` recognise it and take the
    gradient with respect to the parameter tensors (the same gradient, without a backward through slices).

    ``value_and_grad(params, x, y, w) -> (value, {name: gradient})``: the objective's gradient written out (no
    autograd), which they use instead where given (not with BatchNorm layers, whose batch statistics the written-out
    form does not know), e.g. ``families/minimax/dann_grad.py``."""

    def __init__(
        self,
        layout,
        fn: Callable[[dict[str, Tensor], Tensor, Tensor, Tensor], Tensor],
        value_and_grad: Callable[..., tuple[Tensor, dict[str, Tensor]]] | None = None,
    ):
        self.layout = layout
        self.fn = fn
        self.value_and_grad = value_and_grad
        #: the executor calibration keys objectives by it: the wrapped function's name, marked as differentiated
        #: per tensor (a calibration of the same function through the flat vector timed other work) or by hand
        self.__qualname__ = (
            f"{getattr(fn, '__qualname__', 'custom')}[{'tensors' if value_and_grad is None else 'by hand'}]"
        )

    def __call__(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        return self.fn(self.layout.unflatten(params), x, y, w)


class _Normed(Protocol):
    """What :meth:`LocalContext._normed` returns: ``p -> (value, [(mean, unbiased variance), ...])`` and the
    BatchNorm layer indices of its last call in ``layers``."""

    layers: list[int]

    def __call__(self, p: Any) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]: ...


class LocalContext:
    """What ``local_update`` may use: gradients on its planned minibatches and local SGD loops.

    Inside the vectorized executor every tensor here is one client's slice of a batched tensor,
    so ``local_update`` code is written for one client and never sees the client dimension.
    """

    def __init__(
        self,
        problem,
        plans: Mapping[str, Plan],
        n: Tensor,
        weight: Tensor,
        client: Tensor,
        train_x: Tensor,
        train_y: Tensor,
        round_: int = 0,
    ):
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
        #: the model's BatchNorm layers (``core/norm.py``; None without any): every forward pass here normalizes
        #: with the statistics of the minibatch rows that carry weight and never touches the layers' own buffers
        self._stats = getattr(problem, "running_stats", None) or None
        #: this client's running statistics ``{buffer name: tensor}`` when the engine keeps them (each step's batch
        #: statistics are folded in by :meth:`record_loss`), else None
        self.buffers: dict[str, Tensor] | None = None
        self._seen: list = []  # batch statistics of the forward passes since the last recorded step

    # -------------------------------------------------------------- gradients
    def loss_on(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted mean loss of the model with flat ``params`` on ``(x, y)``."""

        def f(p):
            return (self._loss(functional_call(self._model, self._layout.unflatten(p), (x,)), y) * w).sum()

        if self._stats is None:
            return f(params)
        g = self._normed(f, w)
        v, seen = g(params)
        self._seen += [(j, m, s) for j, (m, s) in zip(g.layers, seen)]
        return v

    def loss_grad(
        self,
        params: Tensor,
        phase: str = "train",
        step: int = 0,
        loss: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(loss, grad)`` on minibatch ``step`` of ``phase`` (weighted mean over its samples).

        ``loss(params, x, y, w)`` replaces the model loss (e.g. a bilevel or adversarial objective); a
        :class:`TensorLoss` is differentiated with respect to the parameter tensors.
        """
        x, y, w = self._batch(phase, step)
        if isinstance(loss, TensorLoss) and loss.value_and_grad is not None and self._stats is None:
            v, gd = loss.value_and_grad(self._layout.unflatten(params), x, y, w)
            return v, torch.cat([gd[e.name].reshape(-1) for e in self._layout.entries])
        if loss is None or isinstance(loss, TensorLoss):
            return self._model_loss_grad(params, x, y, w, None if loss is None else loss.fn)
        if self._stats is not None:  # the objective may run the model: batch statistics as for the model's loss
            return self._normed_grad(self._normed(lambda q: loss(q, x, y, w), w), params)
        if self.eager:  # one client: plain autograd (torch.func's transform costs about 2x on small models)
            q = params.detach().requires_grad_(True)
            with torch.enable_grad():
                v = loss(q, x, y, w)
                (g,) = torch.autograd.grad(v, q)
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
                self._fixed_batches[phase] = (_rows(self._x, ix), self._y[ix], w)
            return self._fixed_batches[phase]
        ix, w = self._trimmed(p, step)
        return _rows(self._x, ix), self._y[ix], w

    def _trimmed(self, p: Plan, step: int) -> tuple[Tensor, Tensor]:
        """Rows and weights of minibatch ``step``; run one client at a time (``eager``), without the weight-0
        padding that only makes the clients of a vectorized call the same shape."""
        ix, w = p.idx[step], p.w[step]
        if self.eager:
            c = max(p.length(step), 1)
            ix, w = ix[:c], w[:c]
        return ix, w

    def _model_loss_grad(self, params: Tensor, x: Tensor, y: Tensor, w: Tensor, fn=None) -> tuple[Tensor, Tensor]:
        """Gradient w.r.t. the per-parameter tensors, concatenated (no slice-backward over ``[d]``); ``fn``: a
        :class:`TensorLoss`'s function instead of the model loss."""
        v, gd = self._dict_loss_grad(self._layout.unflatten(params), {}, x, y, w, fn)
        return v, torch.cat([gd[e.name].reshape(-1) for e in self._layout.entries])

    def _dict_loss_grad(
        self, var: dict[str, Tensor], const: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor, fn=None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Model loss (or ``fn(params, x, y, w)``, a :class:`TensorLoss`'s function) and its gradient w.r.t. the
        tensors ``var`` only; ``const`` (the model's other tensors) enter ``functional_call`` as constants: no
        gradient is formed for them or propagated below the lowest of ``var``."""
        model, lossf = self._model, self._loss

        def f(pd):
            if fn is not None:
                return fn({**const, **pd}, x, y, w)
            return (lossf(functional_call(model, {**const, **pd}, (x,)), y) * w).sum()

        if self._stats is not None:
            const = {k: t.detach() for k, t in const.items()} if self.eager else const
            return self._normed_grad(self._normed(f, w), var)
        if self.eager:
            leaves = {k: t.detach().requires_grad_(True) for k, t in var.items()}
            const = {k: t.detach() for k, t in const.items()}
            with torch.enable_grad():
                v = f(leaves)
                gs = torch.autograd.grad(v, list(leaves.values()))
            return v.detach(), dict(zip(leaves, gs))
        gd, v = grad_and_value(f)(var)
        return v, gd

    def block_loss_grad(
        self, block: ParamBlock, params: Tensor, rest: Tensor, phase: str = "train", step: int = 0
    ) -> tuple[Tensor, Tensor]:
        """``(loss, grad)`` on minibatch ``step`` of ``phase`` w.r.t. the block vector ``params`` only, the model's
        other tensors fixed at ``rest`` (``block.rest``'s vector): ``grad`` is ``[block.size]``."""
        x, y, w = self._batch(phase, step)
        v, gd = self._dict_loss_grad(block.unflatten(params), block.rest.unflatten(rest), x, y, w)
        return v, block.flatten(gd)

    def num_steps(self, phase: str = "train") -> Tensor:
        """Number of active local steps of this client in ``phase`` (a tensor)."""
        return self.plans[phase].active.sum().to(torch.float32)

    def max_steps(self, phase: str = "train") -> int:
        return int(self.plans[phase].active.shape[-1])

    def is_active(self, phase: str, step: int) -> Tensor:
        return self.plans[phase].active[step]

    def _normed(self, f: Callable, w: Tensor) -> _Normed:
        """``f`` with the model's BatchNorm layers normalizing by the statistics of the rows that carry weight ``w``
        (all rows of a trimmed, one-client batch): ``p -> (f(p), [(layer, mean, unbiased variance), ...])``. The
        layer indices are plain ints held beside the tensors (a transform's auxiliary output holds tensors only)."""
        mask = None if self.eager else w > 0
        layers: list[int] = []

        def g(p):
            assert self._stats is not None, "_normed is called only when the model has BatchNorm layers"
            with self._stats.batch_statistics(mask) as seen:
                v = f(p)
            layers[:] = [j for j, _, _ in seen]
            return v, [(m, s) for _, m, s in seen]

        normed = cast(_Normed, g)  # a plain function; it gets the ``layers`` attribute of _Normed right here
        normed.layers = layers
        return normed

    def _normed_grad(self, g: _Normed, var: Tensor | dict[str, Tensor]) -> tuple[Tensor, Any]:
        """``(value, gradient)`` of :meth:`_normed`'s ``g`` at ``var`` (a tensor or a dict of tensors); the batch
        statistics wait in ``_seen`` for :meth:`record_loss`."""
        if self.eager:
            leaves = (
                {k: t.detach().requires_grad_(True) for k, t in var.items()}
                if isinstance(var, dict)
                else var.detach().requires_grad_(True)
            )
            with torch.enable_grad():
                v, seen = g(leaves)
                gs = torch.autograd.grad(v, list(leaves.values()) if isinstance(leaves, dict) else [leaves])
            grads = dict(zip(leaves, gs)) if isinstance(leaves, dict) else gs[0]
            v = v.detach()
        else:
            grads, (v, seen) = grad_and_value(g, has_aux=True)(var)
        self._seen += [(j, m, s) for j, (m, s) in zip(g.layers, seen)]
        return v, grads

    def record_loss(self, loss: Tensor, active: Tensor) -> None:
        """The end of a step: its loss counts toward :attr:`train_loss` where ``active``, and the batch statistics of
        the step's forward passes move :attr:`buffers` (where tracked) where ``active``."""
        a = active.to(torch.float32)
        self._loss_sum = self._loss_sum + loss.detach() * a
        self._loss_cnt = self._loss_cnt + a
        if self._seen:
            if self.buffers is not None:
                assert self._stats is not None, "batch statistics are seen only when the model has BatchNorm layers"
                self.buffers = self._stats.fold(self.buffers, self._seen, active)
            self._seen = []

    @property
    def train_loss(self) -> Tensor:
        return self._loss_sum / self._loss_cnt.clamp_min(1.0)

    # -------------------------------------------------------------- stated updates
    def run(self, stmt) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Carry out a stated update (``core/statements.py``) for this client: ``(new state rows, upload)``."""
        if isinstance(stmt, Solved):
            return stmt.rows, stmt.upload
        if isinstance(stmt, Descend):
            p = self.descend(stmt)
            assert stmt.then is not None, "a returned Descend states its then"
            return stmt.then(p, self.num_steps(stmt.phase).to(p.dtype))
        if isinstance(stmt, Minimize):
            return self.minimize(stmt)
        raise TypeError(
            f"local_update returned {type(stmt).__name__}: expected a statement of "
            f"fedsolve.core.statements or a (new rows, upload) pair"
        )

    def minimize(self, s: Minimize) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """:class:`~fedsolve.core.statements.Minimize` for this client: Newton on its full batch of ``s.phase`` until
        its tolerance is met (run alone, as soon as it is; under ``vmap``, the masked caps), then ``s.then``."""
        if not self.plans[s.phase].fixed:
            raise ValueError(f"Minimize: phase {s.phase!r} must be planned as one full batch (Work(batch_size=None))")
        x, y, w = self._batch(s.phase, 0)
        u, res, _ = newton(
            s.fun, s.start, s.tol, s.max_iter, alone=self.eager, args=(x, y, w, *s.args), modified=s.modified
        )
        return s.then(u, res, lambda fn, v, *fargs: grad(fn)(v, x, y, w, *fargs))

    def descend(self, s: Descend) -> Tensor:
        """The parameters after :class:`~fedsolve.core.statements.Descend`'s steps (its docstring has the rule)."""
        affine = _affine_terms(s)
        if s.block is not None:
            if s.optimizer != "sgd" or s.mask is not None or s.objective is not None:
                raise ValueError(
                    "Descend: a block step takes plain SGD on the model's loss (no optimizer, mask or objective)"
                )
            assert s.rest is not None, "Descend(block=...) states the rest of the model's vector in ``rest``"
            return self.block_sgd(
                s.block, s.start, s.rest, s.lr, s.phase, scale=s.scale, affine=affine, extra=s.extra, until=s.until
            )
        if s.optimizer == "sgd":
            return self.sgd(
                s.start,
                s.lr,
                s.phase,
                extra=s.extra,
                mask=s.mask,
                scale=s.scale,
                until=s.until,
                loss=s.objective,
                affine=affine,
            )
        return self._adaptive(s, affine)

    def _adaptive(self, s: Descend, affine: tuple[float | Tensor, Tensor | None]) -> Tensor:
        """Momentum (heavy ball, PyTorch's ``SGD(momentum=...)`` rule) or Adam steps over the planned steps of
        ``s.phase``; the buffers start at zero and live for the phase (one local update)."""
        params = s.start
        a, c = _affine_pair(affine, params)
        buf = torch.zeros_like(params)
        sq = torch.zeros_like(params)
        count = torch.zeros((), dtype=params.dtype)
        done = torch.zeros((), dtype=torch.bool)
        b1, b2 = s.betas
        for step in range(self.max_steps(s.phase)):
            fval, g = self.loss_grad(params, s.phase, step, s.objective)
            g = _direction(g, params, s.scale, a, c)
            if s.extra is not None:
                g = g + s.extra(params)
            if s.mask is not None:
                g = g * s.mask
            live = self.plans[s.phase].active[step]
            if s.until is not None:
                done = done | s.until(params, g)
                live = live & ~done
            self.record_loss(fval, live)
            on = live.to(params.dtype)
            if s.optimizer == "momentum":
                buf = torch.where(live, s.momentum * buf + g, buf)
                direction = buf
            else:  # adam, bias-corrected
                count = count + on
                buf = torch.where(live, b1 * buf + (1 - b1) * g, buf)
                sq = torch.where(live, b2 * sq + (1 - b2) * g * g, sq)
                n = count.clamp_min(1.0)
                direction = (buf / (1 - b1**n)) / ((sq / (1 - b2**n)).sqrt() + s.eps)
            params = params - on * s.lr * direction
        return params

    # -------------------------------------------------------------- loops
    def sgd(
        self,
        params: Tensor,
        lr: float | Tensor,
        phase: str = "train",
        extra: Callable[[Tensor], Tensor] | None = None,
        mask: Tensor | None = None,
        scale: float | Tensor = 1.0,
        until: Callable[[Tensor, Tensor], Tensor] | None = None,
        loss: Callable | None = None,
        affine: tuple[float | Tensor, Tensor | None] | None = None,
    ) -> Tensor:
        """Plain (minibatch) gradient descent over the planned steps of ``phase``.

        Each step: ``g = scale * grad f(params) + a * params + c + extra(params)`` with ``affine = (a, c)`` (weight
        decay, proximal pulls and duals folded into two passes over ``[d]``; ``c`` a vector, a scalar or None);
        ``g *= mask``; ``params -= lr * g``. Inactive steps (variable local work) leave ``params`` unchanged.
        ``until(params, g) -> bool`` stops this client for good once true (inexactness rules).
        """
        steps = self.max_steps(phase)
        done = torch.zeros((), dtype=torch.bool)
        neg_lr = -lr  # once, not every step
        a, c = _affine_pair(affine, params)
        # one client at a time: a step's activity is a plain bool (no [d] pass to scale the step by it)
        step_lr = torch.as_tensor(neg_lr, dtype=params.dtype, device=params.device) if self.eager else None
        for s in range(steps):
            fval, g = self.loss_grad(params, phase, s, loss)
            g = _direction(g, params, scale, a, c)
            if extra is not None:
                g = g + extra(params)
            if mask is not None:
                g = g * mask
            live = self.plans[phase].active[s]
            if until is not None:
                done = done | until(params, g)
                live = live & ~done
            self.record_loss(fval, live)
            if step_lr is not None:
                if bool(live):
                    params = torch.addcmul(params, g, step_lr)
                continue
            # one fused pass over the [d] vector: params - lr * g on active steps, unchanged otherwise
            params = torch.addcmul(params, g, live.to(params.dtype) * neg_lr)
        return params

    def block_sgd(
        self,
        block: ParamBlock,
        params: Tensor,
        rest: Tensor,
        lr: float | Tensor,
        phase: str = "train",
        scale: float | Tensor = 1.0,
        affine: tuple[float | Tensor, Tensor | float | None] | None = None,
        extra: Callable[[Tensor], Tensor] | None = None,
        until: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Gradient descent on one block over the planned steps of ``phase``, the rest of the model fixed.

        ``params`` is the block vector (``block.gather(full)``), ``rest`` the complement's (fixed during the
        phase). Each step: ``g = scale * grad_block f + a * p + c (+ extra(p))`` with ``affine = (a, c)`` (``a`` a
        scalar, ``c`` a block vector, a scalar or None: weight decay, proximal pulls and duals in one place);
        ``p -= lr * g`` on active steps. The same as ``sgd(join(params, rest), mask=block.mask, extra=...)``
        restricted to the block, at the cost of the block's gradient and three passes over the block a step
        (per parameter tensor, no concatenation; with ``extra`` or ``until``, which see the block vector, the step
        works on the concatenated vector). ``until(params, g) -> bool`` stops this client for good once true.
        Returns the new block vector.
        """
        if block.size == 0:
            return params
        a, c = _affine_pair(affine, params)
        if c is not None and c.dim() and c.shape[-1] != block.size:
            raise ValueError(
                f"block_sgd: affine offset c must be a scalar or a block vector of {block.size} "
                f"entries, got shape {tuple(c.shape)}"
            )
        const = block.rest.unflatten(rest)
        flat = extra is not None or until is not None
        ps = block.unflatten(params)  # views of the caller's vector (never written in place)
        cs = block.unflatten(c) if c is not None and c.dim() else dict.fromkeys(block.names, c)
        done = torch.zeros((), dtype=torch.bool)
        for s in range(self.max_steps(phase)):
            x, y, w = self._batch(phase, s)
            fval, gd = self._dict_loss_grad(ps, const, x, y, w)
            live = self.plans[phase].active[s]
            if flat:
                p = block.flatten(ps)
                g = _direction(block.flatten(gd), p, scale, a, c)
                if extra is not None:
                    g = g + extra(p)
                if until is not None:
                    done = done | until(p, g)
                    live = live & ~done
                ps = block.unflatten(torch.addcmul(p, g, live.to(p.dtype) * (-lr)))
            else:
                coef = live.to(params.dtype) * (-lr)
                ps = {n: torch.addcmul(ps[n], _direction(gd[n], ps[n], scale, a, cs[n]), coef) for n in block.names}
            self.record_loss(fval, live)
        return block.flatten(ps)


def _affine_terms(s: Descend) -> tuple[float | Tensor, Tensor | None]:
    """``(a, c)`` with ``scale * weight_decay * p + linear + prox * (p - anchor) = a * p + c`` (``c`` formed once per
    local update: ``linear - prox * anchor``)."""
    a = s.prox
    if s.weight_decay > 0:
        a = s.scale * s.weight_decay + a
    c = s.linear
    if s.anchor is not None and not (isinstance(s.prox, (int, float)) and s.prox == 0):
        pull = -s.prox * s.anchor
        c = pull if c is None else c + pull
    return a, c


def _affine_pair(
    affine: tuple[float | Tensor, Tensor | float | None] | None, like: Tensor
) -> tuple[float | Tensor, Tensor | None]:
    """``(a, c)`` of an ``affine`` argument (None: no term), ``c`` a tensor like ``like`` or None."""
    a, c = affine if affine is not None else (0.0, None)
    if c is not None and not isinstance(c, Tensor):
        c = torch.as_tensor(c, dtype=like.dtype, device=like.device)
    return a, c


def _direction(g: Tensor, p: Tensor, scale: float | Tensor, a: float | Tensor, c: Tensor | None) -> Tensor:
    """``scale * g + a * p + c`` in two passes (the second in place on the first's new tensor: no allocation)."""
    if c is not None:
        q = torch.add(c, g, alpha=scale) if isinstance(scale, (int, float)) else torch.addcmul(c, g, scale)
    elif not (isinstance(scale, (int, float)) and scale == 1.0):
        q = g * scale
    else:  # q would be autograd's gradient itself, which may be an expanded view: no in-place update
        if isinstance(a, (int, float)):
            return g if a == 0 else torch.add(g, p, alpha=a)
        return torch.addcmul(g, p, a)
    if isinstance(a, (int, float)):
        return q.add_(p, alpha=a) if a != 0 else q
    return torch.addcmul(q, p, a)


def _rows(data: Tensor, ix: Tensor) -> Tensor:
    """``data[ix]``: the rows ``ix`` of ``data``; an image-shaped ``data`` is gathered through its flat
    ``[N, features]`` view (one contiguous copy per row: about 1.7x faster than indexing ``[N, C, H, W]``)."""
    if data.dim() <= 2 or not data.is_contiguous():
        return data[ix]
    return data.view(data.shape[0], -1)[ix].view(*ix.shape, *data.shape[1:])


def full_batches(plan: Plan, train_x: Tensor, train_y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The full batches of the K clients of a one-full-batch ``plan``, stacked: ``(x [K, B, ...], y [K, B],
    w [K, B])``, padded with weight 0 to the longest client (as under ``vmap``)."""
    w = plan.w[:, 0]
    B = max(int((w > 0).sum(-1).max()), 1)
    ix = plan.idx[:, 0, :B]
    return train_x[ix], train_y[ix], w[:, :B]
