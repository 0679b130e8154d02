"""Batched full-batch local GD for one-layer models: the ``linear`` executor.

Many local updates of the FPFC paper's suites (and of their baselines) are the same computation:
``T_i`` full-batch gradient steps, from a start point, on

    f_i(w) + (wd/2) ||w||^2 + (rho/2) ||w - anchor_i||^2

with ``f_i`` the mean multinomial-logistic or squared loss of a model that is one ``nn.Linear``.
LOCAL (start = own model), FedAvg / PACFL / CFL (start = the server's model), FedProx (anchor = the
global model, rho = mu), FPFC (start = own model, anchor = zeta_i) and IFCA (start = the cluster
model with the lowest full-batch loss) differ only in start, anchor and what is kept afterwards. An
algorithm states its update as a plain :class:`~fedsolve.core.statements.Descend` on a full-batch phase and this
executor runs all selected clients at once with closed-form gradients:

* the bias is folded in as a constant-1 feature (``[W | b]`` acts on ``[x, 1]``);
* each client's samples are cut into chunks of ``chunk`` rows (only its last chunk is padded, with
  all-zero rows, so padding contributes nothing), stored once as ``[chunks, C, in+1]``;
* every step is two ``bmm`` calls over all chunks, one fused softmax over the class dimension and a
  segment sum per client; the 1/n_i of the mean loss is applied after the segment sum.

Same numbers as the engine's sequential executor up to float rounding (tests check, per algorithm).
The reported loss is ``-log softmax`` at the label with p clamped at 1e-30 (differs from the exact
cross-entropy only when a training margin is below -69). Step counts come from the plans, so
variable work and growing schedules work. ``executor: auto`` picks it when the algorithm's round-0 statement is
such a ``Descend``, the model is one ``nn.Linear`` and the loss is supported; a later round stated otherwise runs
on the generic executor ``auto`` would have picked.

Two kernels do the steps (``kernel``, from ``simulation.linear_kernel``):

* ``torch``: the chunked ``bmm`` path above;
* ``native`` (cross-entropy only): ``kernels/softmax_gd.c``, compiled at first use (``core/native.py``),
  which runs all of a device's steps in one call with the logits kept in registers, devices spread over
  the torch thread count. Measured on S1 (``benchmarks/fpfc_s1.py``) it is several times faster.

``auto`` takes ``native`` where it applies and a C compiler is found, else ``torch``; the two agree to
float rounding (``tests/test_native_kernel.py``). The native kernel computes in float32; float64 data
(``data.dtype: float64``) runs the ``torch`` kernel in float64 (``auto`` picks it; ``native`` is refused).

Process-wide allocator setting: the first round a linear executor runs (not its construction, not an
import) calls :func:`keep_freed_memory` (glibc ``mallopt``; see there), unless ``tune_malloc=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, TypeGuard, cast

import torch
from torch import Tensor

from fedsolve.core import native
from fedsolve.core.allocator import keep_freed_memory
from fedsolve.core.executor import Executor, on_data_device
from fedsolve.core.statements import Descend, NotStated, stated

Record = dict[str, Tensor]


def linear_model_problem(problem) -> bool:
    """True when ``problem``'s model is one ``nn.Linear`` (weight + bias) with a supported loss."""
    lins = [mod for mod in problem.model.modules() if isinstance(mod, torch.nn.Linear)]
    return (
        len(lins) == 1
        and len(list(problem.model.parameters())) == 2
        and lins[0].bias is not None
        and problem.loss_name in ("cross_entropy", "squared_error")
    )


def weight_first(problem) -> bool:
    """True when the flat parameter vector of a one-``nn.Linear`` problem is ``[W, b]`` (else ``[b, W]``)."""
    return problem.layout.names[0].endswith("weight")


def with_bias_feature(X: Tensor) -> Tensor:
    """``[n, in] -> [n, in+1]``: the bias folded in as a constant-1 feature (``[W | b]`` acts on ``[x, 1]``)."""
    return torch.cat([X, X.new_ones(X.shape[0], 1)], 1)


def aug_to_flat(A: Tensor, w_first: bool) -> Tensor:
    """``[k, out, in+1]`` augmented weights ``[W | b]`` -> ``[k, d]`` flat parameters in the model's layout."""
    k = A.shape[0]
    W, b = A[:, :, :-1].reshape(k, -1), A[:, :, -1]
    return torch.cat([W, b], 1) if w_first else torch.cat([b, W], 1)


@dataclass
class _Selected:
    """The chunks of the selected clients' data, gathered once per round (see ``LinearGDExecutor``)."""

    owner: Tensor  # [B] which selected client each chunk belongs to
    XA: Tensor  # [B, C, in+1]
    CW: Tensor  # [B, 1, C]
    Y: Tensor
    inv_n: Tensor  # [k, 1, 1] 1/n_i

    @property
    def k(self) -> int:
        return self.inv_n.shape[0]


class FullBatch:
    """The selected clients' full-batch loss and gradient with the executor's kernels:
    ``loss(w [k, d]) -> [k]`` and ``grad(w [k, d]) -> [k, d]`` (mean loss, no weight decay)."""

    def __init__(self, executor: LinearGDExecutor, ids: Tensor):
        self._ex, self._ids = executor, ids
        self._sel: _Selected | None = None

    @property
    def ids(self) -> Tensor:
        """The clients (global ids) whose data this is."""
        return self._ids

    def selection(self) -> _Selected:
        """The torch kernel's chunks of these clients, gathered once and shared with the executor's steps."""
        if self._sel is None:
            self._sel = self._ex._select(self._ids)
        return self._sel

    def _loss_grad(self, w: Tensor, grad: bool) -> tuple[Tensor, Tensor | None]:
        ex, A = self._ex, self._ex._to_aug(w.to(self._ex.dtype))
        if ex.native is not None:
            loss, g = ex.native.run(self._ids, A, grad=True)
            return loss.to(torch.float32), g
        return ex._loss_grad(self.selection(), A, grad=grad)

    def loss(self, w: Tensor) -> Tensor:
        return self._loss_grad(w, grad=False)[0]

    def grad(self, w: Tensor) -> Tensor:
        g = self._loss_grad(w, grad=True)[1]
        assert g is not None, "_loss_grad(grad=True) returns the gradient"
        return self._ex._from_aug(g).to(w.dtype)


class LinearGDExecutor(Executor):
    """The ``linear`` executor (module docstring); same ``run`` interface as ``core.executor``.

    ``tune_malloc``: call :func:`keep_freed_memory` when the first round runs (process-wide; about 1.25-4x
    less time per round, measured on FPFC). ``kernel``: ``auto``, ``native`` or ``torch`` (module docstring).
    Computes in the training data's float type (float32, or float64 with the ``torch`` kernel).
    """

    name = "linear"

    def __init__(
        self,
        problem,
        chunk: int = 256,
        tune_malloc: bool = True,
        kernel: Literal["auto", "native", "torch"] = "auto",
        fallback=None,
    ):
        if not linear_model_problem(problem):
            raise ValueError(
                "executor: 'linear' needs a model made of one nn.Linear with bias (e.g. 'logreg') "
                f"and loss cross_entropy or squared_error (got loss {problem.loss_name!r})"
            )
        if kernel not in ("auto", "native", "torch"):
            raise ValueError(f"linear_kernel: expected 'auto', 'native' or 'torch', got {kernel!r}")
        self.tune_malloc = tune_malloc
        #: the executor of the rounds whose update this one does not run (None: such a round is an error)
        self.fallback = fallback
        lin = next(mod for mod in problem.model.modules() if isinstance(mod, torch.nn.Linear))
        self.ce = problem.loss_name == "cross_entropy"
        self.out_dim, self.in_dim = lin.weight.shape
        self.w_first = weight_first(problem)
        self.C = chunk
        d = problem.data
        self.dtype = d.train_x.dtype if d.train_x.dtype == torch.float64 else torch.float32
        X = d.train_x.reshape(d.train_x.shape[0], -1).to(self.dtype)
        X = with_bias_feature(X)
        self.n = d.train_sizes.to(X.device, self.dtype)
        self.native: native.SoftmaxData | None = None
        if kernel == "native" and X.device.type != "cpu":
            raise ValueError(
                f"linear_kernel: 'native' runs on the CPU only (the data is on {X.device}); use 'auto' or 'torch'"
            )
        if kernel == "native" and self.dtype != torch.float32:
            raise ValueError(
                "linear_kernel: 'native' computes in float32 and the data is float64; use 'auto' or 'torch'"
            )
        if kernel != "torch" and X.device.type == "cpu" and self.dtype == torch.float32:  # CPU, float32 only
            lib = native.softmax_gd_kernel(self.out_dim) if self.ce else None
            if lib is not None:
                self.native = native.SoftmaxData(lib, X, d.train_y, d.train_offsets, self.out_dim)
            elif kernel == "native":
                why = (
                    "it covers cross-entropy only"
                    if not self.ce
                    else "it is turned off (FEDSOLVE_NATIVE=0)"
                    if not native.enabled()
                    else f"it supports 2 to {native.MAX_CLASSES} classes"
                    if not 2 <= self.out_dim <= native.MAX_CLASSES
                    else "no C compiler could build it"
                )
                raise ValueError(f"linear_kernel: 'native' is not available here ({why}); use 'auto' or 'torch'")
        self.kernel = "native" if self.native is not None else "torch"
        if self.native is None:
            with torch.device(X.device):
                self._chunk_data(d, X, chunk)

    def _chunk_data(self, d, X: Tensor, chunk: int) -> None:
        """The torch kernel's layout: each client's rows cut into zero-padded chunks of ``chunk`` rows."""
        off = d.train_offsets.tolist()
        first, count, XA, Y, CW = [], [], [], [], []
        c0 = 0
        for i in range(d.num_clients):
            a, b = off[i], off[i + 1]
            n = b - a
            nc = max(1, math.ceil(n / chunk))
            pad = nc * chunk - n
            XA.append(torch.cat([X[a:b], X.new_zeros(pad, X.shape[1])]).reshape(nc, chunk, -1))
            CW.append(torch.cat([torch.ones(n, dtype=X.dtype), torch.zeros(pad, dtype=X.dtype)]).reshape(nc, 1, chunk))
            if self.ce:
                yi = torch.cat([d.train_y[a:b].long(), torch.zeros(pad, dtype=torch.long)]).reshape(nc, 1, chunk)
            else:
                yi = torch.cat(
                    [d.train_y[a:b].reshape(n, -1).to(X.dtype), torch.zeros(pad, self.out_dim, dtype=X.dtype)]
                )
                yi = yi.reshape(nc, chunk, -1).transpose(1, 2)
            Y.append(yi)
            first.append(c0)
            count.append(nc)
            c0 += nc
        self.XA = torch.cat(XA).contiguous()  # [N_chunks, C, in+1]; padding rows are all zero
        self.CW = torch.cat(CW).contiguous()  # [N_chunks, 1, C]  1 on samples, 0 on padding
        self.Y = torch.cat(Y).contiguous()
        self.first = torch.tensor(first)
        self.count = torch.tensor(count)

    # ---------------------------------------------------------------- flat <-> [out, in+1]
    def _to_aug(self, w: Tensor) -> Tensor:
        k, o, i = w.shape[0], self.out_dim, self.in_dim
        if self.w_first:
            W, b = w[:, : o * i].reshape(k, o, i), w[:, o * i :]
        else:
            W, b = w[:, o:].reshape(k, o, i), w[:, :o]
        return torch.cat([W, b.unsqueeze(-1)], 2)

    def _from_aug(self, A: Tensor) -> Tensor:
        return aug_to_flat(A, self.w_first)

    # ---------------------------------------------------------------- the clients' data
    def _select(self, ids: Tensor) -> _Selected:
        cnt = self.count[ids]
        owner = torch.repeat_interleave(torch.arange(ids.numel()), cnt)
        chunk_ids = torch.repeat_interleave(self.first[ids] - torch.cumsum(cnt, 0) + cnt, cnt) + torch.arange(
            int(cnt.sum())
        )
        XA, CW, Y = (t.index_select(0, chunk_ids) for t in (self.XA, self.CW, self.Y))
        return _Selected(owner, XA, CW, Y, (1.0 / self.n[ids]).view(-1, 1, 1))

    def _loss_grad(self, sel: _Selected, A: Tensor, grad: bool, out: Tensor | None = None):
        """Mean loss ``[k]`` and, if ``grad``, its gradient ``[k, out, in+1]`` at ``A`` (``out``: a buffer)."""
        z = torch.bmm(A.index_select(0, sel.owner), sel.XA.transpose(1, 2))  # [B, out, C]
        if self.ce:
            G = torch.softmax(z, 1)
            lc = -(G.gather(1, sel.Y).clamp_min(1e-30).log() * sel.CW).sum((1, 2))
            if grad:
                G.scatter_add_(1, sel.Y, sel.CW.neg())  # -1 at the label (0 on padding, whose X rows are 0)
        else:
            G = z.sub_(sel.Y)
            lc = (0.5 * G.pow(2).sum(1, keepdim=True) * sel.CW).sum((1, 2))
        loss = torch.zeros(sel.k, dtype=lc.dtype).index_add_(0, sel.owner, lc) * sel.inv_n.view(-1)
        if not grad:
            return loss, None
        g = out.zero_() if out is not None else torch.zeros(sel.k, self.out_dim, self.in_dim + 1, dtype=self.dtype)
        return loss, g.index_add_(0, sel.owner, torch.bmm(G, sel.XA)).mul_(sel.inv_n)

    def full_batch(self, ids: Tensor) -> FullBatch:
        """Full-batch loss and gradient of clients ``ids`` with this executor's kernels."""
        return FullBatch(self, ids)

    # ---------------------------------------------------------------- one round
    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        fb = FullBatch(self, ids)  # the clients' data, gathered at most once a round (scores and steps share it)
        stmt = stated(algo, rows, msgs, round_, loss=self._probe_loss(algo, fb, round_))
        if not (stacks(stmt, plans) and plans[stmt.phase].fixed):
            if self.fallback is None:
                raise ValueError(
                    f"executor: 'linear' does not run {algo.name} in round {round_ + 1}: its local "
                    f"update is not full-batch GD on the model's loss (a Descend statement without "
                    f"objective, mask, block, stopping rule or optimizer, on a full-batch phase); use "
                    f"'auto', 'vectorized' or 'sequential'"
                )
            return self.fallback.run(algo, rows, msgs, ids, plans, data, round_)
        # stacks() held, so stmt.plain(): lr is a Python number
        return self._gd(
            stmt.start,
            cast(float, stmt.lr),
            stmt.anchor,
            float(stmt.prox),
            stmt.linear,
            plans[stmt.phase],
            fb,
            stmt.then,
            stmt.weight_decay,
        )

    @staticmethod
    def _probe_loss(algo, fb: FullBatch, round_: int):
        """``ctx.loss`` of the stacked clients for :func:`stated`: their mean losses ``[k]`` on a full-batch phase
        over all their training rows (:func:`whole_rows`), with this executor's kernels (IFCA scoring each cluster
        model)."""

        def loss(params: Tensor, phase: str = "train", step: int = 0) -> Tensor:
            if not whole_rows(algo.work(round_), phase):
                raise NotStated("loss")
            return fb.loss(params).to(params.dtype)

        return loss

    def _gd(
        self,
        start: Tensor,
        lr: float,
        anchor: Tensor | None,
        rho: float,
        linear: Tensor | None,
        plan,
        fb: FullBatch,
        then,
        wd: float,
    ):
        """Full-batch GD of the clients of ``fb`` from ``start`` over ``plan``'s steps; ``then(w, steps)``."""
        if self.tune_malloc:  # the process-wide allocator setting, when the first round runs
            keep_freed_memory()
        ids = fb.ids
        k = ids.numel()
        steps = plan.active.sum(1)
        S = int(steps.max()) if k else 0
        A = self._to_aug(start.to(self.dtype))
        Z = self._to_aug(anchor.to(self.dtype)) if anchor is not None and rho > 0 else None
        L = self._to_aug(linear.to(self.dtype)) if linear is not None else None
        done = lambda A: then(self._from_aug(A).to(start.dtype), steps.to(start.dtype))
        if self.native is not None and L is None:
            A, losses = self.native.run(ids, A, steps, Z, lr, rho if Z is not None else 0.0, wd)
            new_rows, uploads = done(A)
            return new_rows, uploads, losses.to(torch.float32)
        sel = fb.selection()
        loss_sum = torch.zeros(k, dtype=self.dtype)
        gbuf = torch.zeros(k, self.out_dim, self.in_dim + 1, dtype=self.dtype)
        for s in range(S):
            loss, g = self._loss_grad(sel, A, grad=True, out=gbuf)
            if Z is not None:
                g = g.add_(A - Z, alpha=rho)
            if wd > 0:
                g = g.add_(A, alpha=wd)
            if L is not None:
                g = g.add_(L)
            live = steps > s
            loss_sum += loss * live
            if bool(live.all()):
                A = A - lr * g
            else:
                A = torch.where(live.view(k, 1, 1), A - lr * g, A)
        losses = loss_sum / steps.clamp_min(1).to(self.dtype)
        new_rows, uploads = done(A)
        return new_rows, uploads, losses


def stacks(stmt, plans, coordinate_prox: bool = False) -> TypeGuard[Descend]:
    """The stacked kernels run ``stmt``: plain local SGD (:meth:`Descend.plain`) on a planned phase, a proximal pull
    only toward an anchor. ``coordinate_prox``: the kernels also take a pull with one coefficient per coordinate (a
    ``[d]`` tensor ``prox``, the same for every client, e.g. zero outside a fused block) toward an anchor."""
    if not isinstance(stmt, Descend) or stmt.phase not in plans:
        return False
    if coordinate_prox and coordinate_pull(stmt):
        return replace(stmt, prox=0.0).plain()
    return stmt.plain() and bool(stmt.prox == 0 or stmt.anchor is not None)


def block_stacks(stmt, plans) -> TypeGuard[Descend]:
    """The stacked kernels run ``stmt`` as a block step: SGD on the model's loss over one block of whole parameter
    tensors (``stmt.block``), the rest of the model fixed at ``stmt.rest``, with the block's own terms (weight decay,
    a linear term, a proximal pull with a number as coefficient), a loss ``scale`` that is a number, and no optimizer,
    mask, objective, stopping rule or extra term (e.g. a personalization phase of FedAPM or FedAlt)."""
    if not isinstance(stmt, Descend) or stmt.block is None or stmt.rest is None or stmt.phase not in plans:
        return False
    return isinstance(stmt.scale, (int, float)) and replace(stmt, block=None, scale=1.0).plain()


def kernels_take(stmt, plans) -> bool:
    """The stacked kernels of ``core/batched_mlp.py`` run ``stmt``: plain local SGD (:func:`stacks`, a pull with one
    coefficient per coordinate included) or a block step (:func:`block_stacks`)."""
    return stacks(stmt, plans, coordinate_prox=True) or block_stacks(stmt, plans)


def whole_rows(work, phase: str) -> bool:
    """Phase ``phase`` of ``work`` is one full batch over each client's whole training rows: the data the
    ``linear`` kernels hold, so they can answer a loss on it."""
    w = work.get(phase)
    return w is not None and w.batch_size is None and w.group is None


def coordinate_pull(stmt: Descend) -> bool:
    """``stmt``'s proximal pull has one coefficient per coordinate (a ``[d]`` tensor ``prox``) and an anchor."""
    return (
        isinstance(stmt.prox, Tensor)
        and stmt.prox.dim() == 1
        and stmt.anchor is not None
        and stmt.prox.shape[-1] == stmt.start.shape[-1]
    )
