"""Batched minibatch SGD for stacked clients: the ``batched`` executor, and ``auto``'s per-machine calibration.

The selected clients are trained k at a time (a *chunk*) in lockstep, their flat parameter rows one contiguous
``[k, d]`` block ``P`` (the model's own flat layout, so nothing is converted), by a per-step *kernel*:

* a chain of ``nn.Linear`` layers with elementwise activations between them (ReLU, tanh, sigmoid; e.g. ``mlp``
  and ``logreg`` of ``fedsolve.models``): :class:`StackedMLP`, layer ``l``'s weight the view ``[k, out, in]`` of
  its slice; the forward pass is ``baddbmm`` per layer, the backward pass by hand (``bmm`` for the weight
  gradients and the back-propagated errors; no autograd, no vmap); a plain SGD step is fused into the backward
  products (``W += -lr dz^T h``, each layer's weights updated right after its error has gone through them);
* convolutions with activations and 2x2 max pooling, then ``nn.Linear`` layers (``lenet``):
  ``core.batched_conv.StackedCNN``, the chunk's convolutions one grouped convolution (channel-stacked clients).

Each chunk's minibatches are gathered a block of steps at a time into a buffer laid out step by step (a step
reads one contiguous slab instead of gathering its rows), each step trimmed to the chunk's longest batch at
that step; clients are grouped into chunks by their number of steps (unequal work does not idle a chunk), and
the update ``P -= lr * (G + wd P + rho (P - anchor))`` runs over the stacked rows (inactive steps leave a row
unchanged) where it is not fused into the kernel; ``rho`` is a number or one coefficient per coordinate (FPFC's pull
on its fused block only).

The update it runs is the algorithm's own statement of its local update (a plain
:class:`~fedsolve.core.statements.Descend`: start, step size, weight decay, linear term, proximal pull, then;
``core/statements.py``), read from the stacked rows of the selected clients, so FedAvg, FedProx, SCAFFOLD, FedADMM,
Local, FPFC and any solver stated like them run here without declaring anything. Same numbers as the sequential
executor to float rounding (``tests/test_batched_mlp.py``, ``tests/test_batched_conv.py``).

``auto`` (``core.selection.make_executor``) chooses among the executors that apply by a calibration: a tiny
timing of each candidate (two SGD steps of 32 clients on the actual model and batch size, best of 5,
interleaved), measured once per machine, model signature, batch size, thread count and version of the
kernels (:data:`CALIBRATION_VERSION`) and cached as JSON in
``$FEDSOLVE_CACHE_DIR`` (default ``~/.cache/fedsolve``) / ``executor_calibration.json``.
``FEDSOLVE_CALIBRATE=0`` turns the measurement off (``auto`` then takes ``batched`` where it applies, else
the fixed rules of ``make_executor``); an explicit ``simulation.executor`` always forces one executor.
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsolve.core.allocator import keep_freed_memory
from fedsolve.core.batched_conv import StackedCNN, cnn_ops
from fedsolve.core.cpus import cpuinfo_field
from fedsolve.core.executor import Executor, Plan, on_data_device
from fedsolve.core.linear import coordinate_pull, kernels_take
from fedsolve.core.statements import Descend, NotStated, ProbeContext, stated

_ACTS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Identity: None}
_ACT_FNS = {torch.relu: "relu", F.relu: "relu", torch.tanh: "tanh", torch.sigmoid: "sigmoid"}


@dataclass(frozen=True)
class _Layer:
    w: tuple[int, int, int]  # (start in the flat vector, out, in)
    b: int | None  # start of the bias, None without one
    act: str | None  # activation after the layer


def mlp_layers(problem) -> list[_Layer]:
    """The layers of ``problem.model`` when it is a chain of ``nn.Linear`` + elementwise activations on the
    flattened input (traced with ``torch.fx``); raises ``ValueError`` saying why not otherwise."""
    model = problem.model
    why = None
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - any tracing failure means "not a plain MLP"
        raise ValueError(
            f"executor: 'batched' needs a model made of nn.Linear layers and elementwise "
            f"activations; {type(model).__name__} could not be traced ({e})"
        ) from None
    mods = dict(gm.named_modules())
    starts = {e.name: e.start for e in problem.layout.entries}
    layers: list[list] = []
    cur = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            cur = node
        elif node.op == "call_function" and node.target in (getattr, operator.getitem):
            continue  # x.shape[0] of the flattening reshape
        elif not layers and (
            (node.op == "call_method" and node.target in ("reshape", "view", "flatten"))
            or (node.op == "call_module" and isinstance(mods[node.target], nn.Flatten))
        ):
            cur = node
        elif node.op == "call_module" and isinstance(mods[node.target], nn.Linear) and node.args[0] is cur:
            lin = mods[node.target]
            if layers and layers[-1][1] != lin.in_features:
                why = "layer sizes do not chain"
                break
            w0 = starts[f"{node.target}.weight"]
            b0 = starts[f"{node.target}.bias"] if lin.bias is not None else None
            layers.append([(w0, lin.out_features, lin.in_features), lin.out_features, b0, None])
            cur = node
        elif (
            node.args
            and node.args[0] is cur
            and layers
            and layers[-1][3] is None
            and (
                (node.op == "call_module" and type(mods[node.target]) in _ACTS)
                or (node.op == "call_function" and node.target in _ACT_FNS)
            )
        ):
            layers[-1][3] = _ACTS[type(mods[node.target])] if node.op == "call_module" else _ACT_FNS[node.target]
            cur = node
        elif node.op == "output" and node.args[0] is cur:
            break
        else:
            why = f"unsupported operation {node.op} {node.target!r}"
            break
    n_lin = sum(isinstance(m, nn.Linear) for m in model.modules())
    if why is None and (
        not layers
        or len(layers) != n_lin
        or layers[-1][3] is not None
        or sum(1 for _ in model.parameters()) != sum(1 + (ly[2] is not None) for ly in layers)
    ):
        why = "its parameters are not those of a chain of nn.Linear layers ending in a linear output"
    if why is not None:
        raise ValueError(
            f"executor: 'batched' needs a model made of nn.Linear layers and elementwise activations "
            f"(ReLU, Tanh, Sigmoid), e.g. 'mlp' or 'logreg'; {type(model).__name__}: {why}; use "
            f"'auto', 'vectorized' or 'sequential'"
        )
    if problem.loss_name not in ("cross_entropy", "squared_error"):
        raise ValueError(f"executor: 'batched' supports loss cross_entropy or squared_error, got {problem.loss_name!r}")
    return [_Layer(w, b, act) for w, _, b, act in layers]


@dataclass(frozen=True)
class _Block:
    """A block step of the batched kernels (:func:`core.linear.block_stacks`): the flat ranges ``[a, b)`` of the
    block's tensors (merged where adjacent), the loss's ``scale`` and, for a kernel that takes it, the layers whose
    gradient the step needs."""

    ranges: tuple[tuple[int, int], ...]
    scale: float
    layers: frozenset[int] | None
    #: the block is made of whole layers (weight and bias) of a kernel that fuses its update: the step runs fused
    fusable: bool = False

    def step(self, P: Tensor, G: Tensor, live: Tensor, all_live: bool, lr, wd, L: Tensor | None, col) -> None:
        """``p -= lr (scale g + wd p + L)`` on the block's coordinates of the live rows (``col``: the values given
        one per client, as in ``_sgd_chunk``)."""
        for a, b in self.ranges:
            g = G[:, a:b]
            if self.scale != 1.0:
                g.mul_(self.scale)
            _sgd_update(P[:, a:b], g, live, all_live, lr, wd, None if L is None else L[:, a:b], col)


def _sgd_update(P: Tensor, G: Tensor, live: Tensor, all_live: bool, lr, wd, L: Tensor | None, col, Z=None, rho=0.0):
    """``P -= lr (G + wd P + L + rho (P - Z))`` on the live rows, in place (``G`` is scratch and changed); ``lr``,
    ``wd``, ``rho``: numbers, or one value per client in ``col`` (runs of a sweep batched together); ``rho`` may
    also be one value per coordinate ``[1, d]``. ``P`` may be a slice of the rows (a block step's run)."""
    if "wd" in col:
        G.addcmul_(P, col["wd"])
    elif wd > 0:  # not one per client: a number
        G.add_(P, alpha=cast(float, wd))
    if L is not None:
        G.add_(L)
    if Z is not None:
        if "rho" in col:
            G.addcmul_(P - Z, col["rho"])
        elif isinstance(rho, Tensor):  # one coefficient per coordinate [1, d]
            G.addcmul_(P - Z, rho)
        else:
            G.add_(P - Z, alpha=rho)
    if "lr" in col:  # one step size per client: -lr_k on the live rows
        P.addcmul_(G, col["lr"] * live.to(P.dtype).unsqueeze(1), value=-1.0)
    elif all_live:  # the update of the stacked flat rows (lr not one per client: a number)
        P.add_(G, alpha=-cast(float, lr))
    else:
        P.addcmul_(G, live.to(P.dtype).unsqueeze(1), value=-cast(float, lr))


class StackedMLP:
    """One SGD step of the k clients of a chunk on a stacked-Linear chain (module docstring): the forward pass as
    ``baddbmm`` per layer, the backward pass by hand. ``X`` ``[k, B, in]`` (client-major), ``Y`` ``[k, B, ...]``."""

    batch_major = False
    #: with ``lr`` given, :meth:`loss_grad` applies the plain step ``P -= lr G`` itself (fused into the backward
    #: products: ``W += -lr dz^T h`` by ``baddbmm_``, no gradient buffer is written or read)
    fuses_update = True
    #: :meth:`loss_grad` takes ``need``: the layers whose gradient a block step uses (the others' are not formed)
    partial = True

    def __init__(self, problem, layers: list[_Layer]):
        self.layers = layers
        self.ce = problem.loss_name == "cross_entropy"

    def buffers(self, k: int, B: int, like: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Activation ``[k, B, out]`` and back-propagated error ``[k, B, in]`` buffers of every layer."""
        return (
            [like.new_empty(k, B, ly.w[1]) for ly in self.layers],
            [like.new_empty(k, B, ly.w[2]) for ly in self.layers[1:]],
        )

    def loss_grad(
        self,
        P: Tensor,
        G: Tensor,
        X: Tensor,
        Y: Tensor,
        w: Tensor,
        bufs,
        lr: float | None = None,
        need: frozenset[int] | None = None,
        block: tuple[float, float, Tensor | None] | None = None,
    ) -> Tensor:
        """Weighted mean loss ``[k]`` at ``P`` ``[k, d]`` on ``X`` ``[k, B, in]``; its gradient into ``G``, or
        with ``lr`` the step ``P -= lr * gradient`` applied in place (each layer's weights after its error has
        been propagated through them). ``need``: the layers whose gradient is wanted (a block step): the others'
        parts of ``G`` are left unwritten and the error is not propagated below the lowest of them. ``block = (scale,
        a, L)`` with ``lr`` (the layers of ``need`` whole): the block step ``p <- (1 - lr a) p - lr scale g - lr L``
        fused in the same way (``L`` the clients' linear terms ``[k, d]`` or None)."""
        zs, dhs = bufs
        K = P.shape[0]
        Ws, hs = [], [X]
        for ly, z in zip(self.layers, zs):
            s, o, i = ly.w
            W = P[:, s : s + o * i].view(K, o, i)
            Ws.append(W)
            if ly.b is not None:
                torch.baddbmm(P[:, ly.b : ly.b + o].unsqueeze(1), hs[-1], W.transpose(1, 2), out=z)
            else:
                torch.bmm(hs[-1], W.transpose(1, 2), out=z)
            if ly.act == "relu":
                z.relu_()
            elif ly.act == "tanh":
                z.tanh_()
            elif ly.act == "sigmoid":
                z.sigmoid_()
            hs.append(z)
        z = hs.pop()
        if self.ce:
            zy = z.gather(-1, Y.unsqueeze(-1)).squeeze(-1)
            m = z.amax(-1, keepdim=True)
            dz = z.sub_(m).exp_()
            se = dz.sum(-1, keepdim=True)
            loss = ((se.log().add_(m)).squeeze(-1).sub_(zy) * w).sum(1)  # logsumexp - z_y
            dz.div_(se)  # softmax
            dz.scatter_add_(-1, Y.unsqueeze(-1), torch.full_like(dz[..., :1], -1.0))
        else:
            dz = z.sub_(Y.reshape(z.shape).to(z.dtype))
            loss = (0.5 * dz.pow(2).sum(-1) * w).sum(1)
        dz = dz.mul_(w.unsqueeze(-1))
        low = 0 if need is None else min(need)
        for l in range(len(self.layers) - 1, low - 1, -1):
            ly, h = self.layers[l], hs[l]
            s, o, i = ly.w
            dh = None
            if l > low:  # the error of the layer below, through this layer's weights before they move
                dh = torch.bmm(dz, Ws[l], out=dhs[l - 1])
                act = self.layers[l - 1].act
                if act == "relu":  # relu's own backward, in place (h is the post-activation output)
                    torch.ops.aten.threshold_backward.grad_input(dh, h, 0.0, grad_input=dh)
                elif act == "tanh":
                    dh.mul_(1 - h * h)
                elif act == "sigmoid":
                    dh.mul_(h * (1 - h))
            if need is not None and l not in need:
                pass
            elif lr is None:
                torch.bmm(dz.transpose(1, 2), h, out=G[:, s : s + o * i].view(K, o, i))
                if ly.b is not None:
                    torch.sum(dz, 1, out=G[:, ly.b : ly.b + o])
            elif block is not None:  # p <- (1 - lr a) p - lr scale g - lr L, on this layer's weight and bias
                scale, a, L = block
                for part in [(s, s + o * i)] + ([] if ly.b is None else [(ly.b, ly.b + o)]):
                    if a != 0:
                        P[:, part[0] : part[1]].mul_(1.0 - lr * a)
                    if L is not None:
                        P[:, part[0] : part[1]].sub_(L[:, part[0] : part[1]], alpha=lr)
                Ws[l].baddbmm_(dz.transpose(1, 2), h, alpha=-lr * scale)
                if ly.b is not None:
                    P[:, ly.b : ly.b + o].sub_(dz.sum(1), alpha=lr * scale)
            else:
                Ws[l].baddbmm_(dz.transpose(1, 2), h, alpha=-lr)
                if ly.b is not None:
                    P[:, ly.b : ly.b + o].sub_(dz.sum(1), alpha=lr)
            if dh is not None:  # None below the first layer, where the loop ends
                dz = dh
        return loss


def stacked_kernel(problem):
    """The per-step kernel of the ``batched`` executor for ``problem.model``: :class:`StackedMLP` for a chain of
    ``nn.Linear`` layers, ``core.batched_conv.StackedCNN`` for convolutions followed by one; raises
    ``ValueError`` saying why neither applies."""
    if problem.loss_name not in ("cross_entropy", "squared_error"):
        raise ValueError(f"executor: 'batched' supports loss cross_entropy or squared_error, got {problem.loss_name!r}")
    if not any(isinstance(m, nn.modules.conv._ConvNd) for m in problem.model.modules()):
        return StackedMLP(problem, mlp_layers(problem))
    try:
        return StackedCNN(problem, cnn_ops(problem))
    except ValueError as e:
        raise ValueError(
            f"executor: 'batched' needs a model made of nn.Linear layers and elementwise activations, "
            f"or a small CNN (convolutions with elementwise activations and 2x2 max pooling, then "
            f"nn.Linear layers, e.g. 'lenet'); {e}; use 'auto', 'vectorized' or 'sequential'"
        ) from None


class BatchedMLPExecutor(Executor):
    """The ``batched`` executor (module docstring): stacked MLPs (:class:`StackedMLP`) and small CNNs
    (``core.batched_conv.StackedCNN``); same ``run`` interface as ``core.executor``."""

    name = "batched"

    def __init__(self, problem, chunk: int | None = None, workers: int | None = None, fallback=None):
        self.kernel = stacked_kernel(problem)
        self.problem = problem
        #: the executor of the rounds whose update the stacked kernels do not run (None: such a round is an error)
        self.fallback = fallback
        #: clients per chunk on the CPU (None: the calibration's fastest (:func:`calibrated_chunk`) where this
        #: machine measured it, else :attr:`default_chunk`, fewer to give every worker 4 chunks)
        self.chunk = chunk
        self._calibrated: dict[int | None, int | None] = {}
        self._blocks: dict[tuple, _Block] = {}  # block steps' views, by (ParamBlock, scale)
        #: chunks run at once on the CPU in a thread pool, one torch thread each (None: 1, the chunks one after
        #: another with torch's own threads; a pool is opt-in: it stalled under load in CI)
        self.workers = workers
        self.tune_malloc = True
        self.ce = problem.loss_name == "cross_entropy"
        #: the minibatches of a chunk are gathered for this many bytes of steps at once (at least one step) into
        #: a buffer laid out step by step, so that a step reads one contiguous slab instead of gathering
        self.gather_bytes = 16 << 20
        #: clients per chunk on the CPU when ``chunk`` is None: 8 for MLPs (the weights of a chunk stay in
        #: cache), 16 for CNNs (few weights; one grouped convolution for more clients saves more calls)
        self.default_chunk = 8 if isinstance(self.kernel, StackedMLP) else 16

    # ---------------------------------------------------------------- the steps of a chunk of clients
    def _sgd_chunk(
        self,
        P: Tensor,
        Z: Tensor | None,
        Xf: Tensor,
        ty: Tensor,
        idx: Tensor,
        wts: Tensor,
        active: Tensor,
        fixed: bool,
        lr: float | Tensor,
        rho: float | Tensor,
        wd: float | Tensor,
        L: Tensor | None = None,
        train: _Block | None = None,
    ) -> Tensor:
        """All steps of the clients of one chunk, in place on their rows ``P`` ``[k, d]``; their summed loss.

        The chunk's minibatches are gathered a block of steps at a time (:attr:`gather_bytes`) into a buffer
        ``[steps, k, B, row]`` (or ``[steps, B, k, row]`` for a ``batch_major`` kernel), one ``index_select``
        per block; each step is trimmed to the longest batch of the chunk at that step (the rest is weight-0
        padding). Plain SGD steps where every client of the chunk is active are fused into the kernel's
        backward pass where it can (``fuses_update``); otherwise ``P -= lr (G + wd P + L + rho (P - anchor))``
        over the stacked rows (``L``: the clients' constant linear terms ``[k, d]``), inactive clients unchanged.
        ``lr``, ``rho`` and ``wd`` are numbers, or one value per client ``[k]`` (runs of a sweep batched together,
        ``engine/sweep.py``); ``rho`` may also be one value per coordinate ``[1, d]``. ``train``: a block step
        (:class:`_Block`): only the block's coordinates move, by ``lr (scale G + wd P + L)`` on them."""
        kern = self.kernel
        K, (S, B) = P.shape[0], idx.shape[1:]
        G = torch.empty_like(P)
        lens = (wts > 0).sum(-1).amax(0).clamp_min(1).tolist()  # per step: the chunk's longest batch
        live_all = active.all(0).tolist()
        col = {
            name: v.to(P.dtype).unsqueeze(1)
            for name, v in (("lr", lr), ("rho", rho), ("wd", wd))
            if isinstance(v, Tensor) and v.dim() == 1
        }  # one value per client
        fuse = kern.fuses_update and not col and wd == 0 and Z is None and L is None and train is None
        # a block step whose layers are whole: fused into the kernel's backward pass as well
        fuse_block = train is not None and train.fusable and kern.fuses_update and not col and Z is None
        need = {"need": train.layers} if train is not None and train.layers is not None else {}
        loss_sum = P.new_zeros(K)
        bufs: dict[int, object] = {}
        row = Xf.shape[1] * Xf.element_size()
        block = 1 if fixed else max(1, min(S, self.gather_bytes // max(1, K * B * row)))
        order = (1, 2, 0) if kern.batch_major else (1, 0, 2)  # [steps, B, k] or [steps, k, B]
        xbuf = ybuf = None
        for s in range(S):
            if s % block == 0 and (xbuf is None or not fixed):
                ix = idx[:, s : s + block]
                xbuf = Xf.index_select(0, ix.permute(*order).reshape(-1)).view(ix.shape[1], -1, Xf.shape[1])
                ybuf = ty.index_select(0, ix.transpose(0, 1).reshape(-1)).view(ix.shape[1], K, B, *ty.shape[1:])
            assert xbuf is not None and ybuf is not None, "step 0 gathers the first block"
            j = 0 if fixed else s % block
            b = lens[s]
            if kern.batch_major:
                X = xbuf[j].view(B, K * Xf.shape[1])[:b]
            else:
                X = xbuf[j].view(K, B, Xf.shape[1])[:, :b]
            if b not in bufs:
                bufs[b] = kern.buffers(K, b, P)
            fused = fuse and live_all[s]
            if fuse_block and live_all[s]:
                assert train is not None, "fuse_block implies a block step"
                blk = (train.scale, float(cast(float, wd)), L)
                loss = kern.loss_grad(P, G, X, ybuf[j][:, :b], wts[:, s, :b], bufs[b], float(lr), block=blk, **need)
                loss_sum += loss * active[:, s]
                continue
            loss = kern.loss_grad(P, G, X, ybuf[j][:, :b], wts[:, s, :b], bufs[b], lr if fused else None, **need)
            live = active[:, s]
            loss_sum += loss * live
            if fused:
                continue
            if train is not None:
                train.step(P, G, live, live_all[s], lr, wd, L, col)
                continue
            _sgd_update(P, G, live, live_all[s], lr, wd, L, col, Z, rho)
        return loss_sum

    def chunks(self, active: Tensor, size: int, samples: Tensor | None = None) -> list[Tensor]:
        """Positions of the clients of each chunk: clients sorted by their number of active steps, then by their
        number of samples (``samples`` ``[K]``; largest first: clients with similar short last batches side by
        side), at most ``size`` a chunk, a new chunk where the step count falls below 0.85 of the chunk's
        first (lockstep clients of unequal work would idle through the longest one's steps)."""
        steps = active.sum(1)
        same = samples is None or bool((samples == samples[0]).all())
        if bool((steps == steps[0]).all()) and same:
            return [torch.arange(a, min(a + size, len(steps))) for a in range(0, len(steps), size)]
        key = steps.double() * (1 + (0 if samples is None else float(samples.max()))) + (
            0 if samples is None else samples.double()
        )
        order = torch.argsort(key, descending=True, stable=True)
        out: list[Tensor] = []
        cur: list[int] = []
        first = 0
        for pos, n in zip(order.tolist(), steps[order].tolist()):
            if cur and (len(cur) >= size or n < 0.85 * first):
                out.append(torch.tensor(cur))
                cur = []
            if not cur:
                first = n
            cur.append(pos)
        out.append(torch.tensor(cur))
        return out

    def sgd(
        self,
        start: Tensor,
        lr: float | Tensor,
        plan: Plan,
        data,
        anchor: Tensor | None = None,
        rho: float | Tensor = 0.0,
        wd: float | Tensor = 0.0,
        linear: Tensor | None = None,
        train: _Block | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Minibatch SGD of all clients from ``start`` ``[K, d]`` over ``plan``: ``(final P, mean loss [K])``.
        ``rho``: a number, one per client ``[K]`` or one per coordinate ``[1, d]`` (the pull toward ``anchor``).
        ``train``: a block step (only the block's coordinates of ``P`` move; ``_sgd_chunk``).

        On the CPU the clients run in chunks (:meth:`chunks`, ``chunk`` clients at most; default: the
        calibration's, else :attr:`default_chunk` and at least 4 chunks a worker): a chunk's weights stay in
        cache for all its steps; on a GPU all clients are one chunk."""
        dtype = data.train_x.dtype if data.train_x.dtype == torch.float64 else torch.float32
        P = start.to(dtype).clone(memory_format=torch.contiguous_format)
        K = P.shape[0]
        if plan.active.device != P.device:  # a plan drawn on the CPU, called directly (e.g. the calibration)
            plan = plan.to(P.device)
        active = plan.active
        S = active.shape[1] if K else 0
        steps = active.sum(1).to(dtype)
        if not S:
            return P, P.new_zeros(K)
        Z = anchor.to(dtype) if anchor is not None and (isinstance(rho, Tensor) or rho > 0) else None
        if isinstance(rho, Tensor) and rho.dim() == 2:
            rho = rho.to(dtype)
        L = linear.to(dtype) if linear is not None else None
        Xf = data.train_x.reshape(data.train_x.shape[0], -1).to(dtype)
        ty = data.train_y if self.ce else data.train_y.reshape(data.train_y.shape[0], -1)
        B = max(int((plan.w > 0).sum(-1).max()), 1)
        idx, wts = plan.idx[..., :B], plan.w[..., :B].to(dtype)
        cpu = P.device.type == "cpu"
        threads = torch.get_num_threads() if cpu else 1
        # one worker unless asked for more: a pool of threads that each set their own torch thread count can
        # stall under load (seen as a run that did not answer Ctrl-C in CI), so chunks run in this thread by default
        workers = min(self.workers or 1, threads)
        size = self.chunk
        if cpu and size is None:  # the calibration's fastest chunk size for this batch size, looked up once
            bs = None if plan.fixed else B
            if bs not in self._calibrated:
                self._calibrated[bs] = calibrated_chunk(self.problem, bs, self.workers)
            size = self._calibrated[bs]
        if cpu and size is None:
            # with several workers at least 4 chunks a worker, so that a worker slowed by another process's job
            # leaves the others more chunks to take (the pool hands them out as workers free up)
            size = max(1, min(self.default_chunk, math.ceil(K / (4 * workers if workers > 1 else 1))))
        # on the CPU ``size`` is set above (the calibration's or the default)
        groups = self.chunks(active, cast(int, size), (wts > 0).sum((1, 2)).cpu()) if cpu else [torch.arange(K)]
        contiguous = all(int(g[0]) + len(g) - 1 == int(g[-1]) for g in groups) and bool(
            (torch.cat(groups) == torch.arange(K)).all()
        )

        def rows(t: Tensor, g: Tensor) -> Tensor:  # a chunk's rows: a view when the chunks are in order
            return t[int(g[0]) : int(g[0]) + len(g)] if contiguous else t[g]

        def run_chunk(g):
            if workers > 1:
                torch.set_num_threads(1)  # this pool thread's intra-op count
            Pc = rows(P, g)
            own = lambda v: rows(v, g) if isinstance(v, Tensor) and v.dim() == 1 else v
            loss = self._sgd_chunk(
                Pc,
                None if Z is None else rows(Z, g),
                Xf,
                ty,
                rows(idx, g),
                rows(wts, g),
                rows(active, g),
                plan.fixed,
                own(lr),
                own(rho),
                own(wd),
                None if L is None else rows(L, g),
                train,
            )
            if not contiguous:
                P[g] = Pc
            return loss

        if workers > 1 and len(groups) > 1:  # every chunk on one thread, `workers` at a time
            torch.set_num_threads(1)
            try:
                with ThreadPoolExecutor(workers) as pool:
                    sums = list(pool.map(run_chunk, groups))
            finally:
                torch.set_num_threads(threads)
        else:
            sums = [run_chunk(g) for g in groups]
        loss = P.new_empty(K)
        loss[torch.cat(groups)] = torch.cat(sums)
        return P, loss / steps.clamp_min(1)

    # ---------------------------------------------------------------- one round
    def descend(self, s: Descend, plans, data, tally: list[Tensor]) -> Tensor:
        """``s`` (one the kernels take) for the stacked clients: the new ``[K, d]`` rows (the block's ``[K, size]``
        for a block step); the steps' summed losses and counts are added to ``tally``."""
        plan = plans[s.phase]
        if s.block is None:
            # coordinate_pull: prox is a [d] tensor
            rho = cast(Tensor, s.prox).unsqueeze(0) if coordinate_pull(s) else float(s.prox)
            P, losses = self.sgd(s.start, s.lr, plan, data, s.anchor, rho, s.weight_decay, s.linear)
        else:
            blk, rest = s.block, cast(Tensor, s.rest)
            K = s.start.shape[0]
            full = blk.scatter(s.start, rest.expand(K, rest.shape[-1]))
            # the block's terms: (scale wd + prox) p + linear - prox anchor (as the sequential executor's block_sgd)
            a = float(s.scale) * s.weight_decay + float(s.prox)
            c = s.linear
            if s.anchor is not None and s.prox != 0:
                pull = -float(s.prox) * s.anchor
                c = pull if c is None else c + pull
            L = None if c is None else blk.scatter(c.expand(K, blk.size), full.new_zeros(K, blk.rest.size))
            P, losses = self.sgd(full, s.lr, plan, data, wd=a, linear=L, train=self._block(blk, float(s.scale)))
            P = blk.gather(P)
        steps = plan.active.sum(-1).to(losses.dtype)
        tally[0] += losses * steps
        tally[1] += steps
        return P.to(s.start.dtype)

    def _block(self, blk, scale: float) -> _Block:
        """The kernel's view of a block step on ``blk`` (a ``ParamBlock``), worked out once per block and scale."""
        key = (blk, scale)
        if key not in self._blocks:
            self._blocks[key] = self._make_block(blk.ranges, scale)
        return self._blocks[key]

    def _make_block(self, ranges: tuple[tuple[int, int], ...], scale: float) -> _Block:
        layers = None
        if getattr(self.kernel, "partial", False):  # the layers whose weight or bias meets the block
            spans = [
                [(ly.w[0], ly.w[0] + ly.w[1] * ly.w[2])] + ([] if ly.b is None else [(ly.b, ly.b + ly.w[1])])
                for ly in self.kernel.layers
            ]
            layers = frozenset(
                n for n, sp in enumerate(spans) if any(a < e and s < b for s, e in sp for a, b in ranges)
            )
            inside = lambda a0, b0: any(a <= a0 and b0 <= b for a, b in ranges)
            whole = all(inside(s, e) for n in layers for s, e in spans[n])
            return _Block(ranges, scale, layers, fusable=whole and self.kernel.fuses_update)
        return _Block(ranges, scale, layers)

    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        inner: list[Descend] = []

        def dry(s: Descend) -> Tensor:  # a step the update runs itself: checked here, run below
            if not kernels_take(s, plans):
                raise NotStated("descend")
            inner.append(s)
            return s.start

        stmt = stated(algo, rows, msgs, round_, dry)
        if not isinstance(stmt, Descend) or not kernels_take(stmt, plans):
            if self.fallback is None:
                raise ValueError(
                    f"executor: 'batched' does not run {algo.name} in round {round_ + 1}: its local "
                    f"update is not plain local SGD on the model's loss (a Descend statement without "
                    f"objective, mask, stopping rule or optimizer, on the whole model or one block); use "
                    f"'auto', 'vectorized' or 'sequential'"
                )
            return self.fallback.run(algo, rows, msgs, ids, plans, data, round_)
        if self.tune_malloc:  # the executors' process-wide allocator setting (core/allocator.py)
            keep_freed_memory()
        K = len(ids)
        tally = [torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.float64)]
        if inner:  # the update runs steps itself: again, each of them on the stacked kernels
            again = algo.local_update(rows, msgs, ProbeContext(round_, lambda s: self.descend(s, plans, data, tally)))
            assert isinstance(again, Descend), "the same update states the same statement"
            stmt = again
        P = self.descend(stmt, plans, data, tally)
        assert stmt.then is not None, "a returned Descend states its then"
        new_rows, uploads = stmt.then(P, plans[stmt.phase].active.sum(-1).to(stmt.start.dtype))
        return new_rows, uploads, (tally[0] / tally[1].clamp_min(1)).to(torch.float32)


# ------------------------------------------------------------------ auto: calibration per machine
class _PlainSGD:
    """Plain local SGD as an algorithm for the calibration of the generic executors, on the model's loss or on
    ``loss`` (the algorithm's own local objective, e.g. an adversarial one)."""

    def __init__(self, problem, lr: float, loss=None):
        self.problem, self.lr, self.loss = problem, lr, loss

    def local_update(self, state, msg, ctx):
        return {"w": ctx.sgd(state["w"], self.lr, loss=self.loss)}, {}


#: part of every calibration key: a new version of the batched kernels is measured again, not read from an old
#: entry (2: contiguous per-block minibatch buffers, fused SGD steps, stacked CNNs)
CALIBRATION_VERSION = 2


def calibration_path() -> Path:
    base = os.environ.get("FEDSOLVE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "fedsolve") / "executor_calibration.json"


def calibration_enabled() -> bool:
    return os.environ.get("FEDSOLVE_CALIBRATE", "1").strip().lower() not in ("0", "false", "off", "no")


def _machine() -> str:
    cpu = cpuinfo_field("model name") or platform.processor()
    return f"{platform.node()}|{platform.machine()}|{cpu}|{os.cpu_count()}|torch {torch.__version__}"


def calibration_key(problem, batch_size: int | None, loss=None) -> str:
    """Machine + model signature + batch size + threads + :data:`CALIBRATION_VERSION` (+ the data's device and
    float type)."""
    d = problem.data
    dev = d.train_x.device
    devname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    model = ",".join(f"{e.name}:{'x'.join(map(str, e.shape))}" for e in problem.layout.entries)
    return (
        f"{_machine()}|{devname}|{type(problem.model).__name__}[{model}]|{problem.loss_name}|"
        f"in{tuple(d.input_shape)}|{d.train_x.dtype}|batch {batch_size}|threads {torch.get_num_threads()}|"
        f"v{CALIBRATION_VERSION}" + ("" if loss is None else f"|objective {getattr(loss, '__qualname__', 'custom')}")
    )


def _best_times(fns: dict, device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Best of ``repeats`` timings of each function after one warm-up (vmap tracing, allocations), the
    candidates interleaved so that a load that comes and goes hits them alike; inf for one that fails."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best: dict[str, float | None] = {}
    for name, fn in fns.items():
        try:
            fn()
            sync()
            best[name] = math.inf
        except (RuntimeError, ValueError, IndexError):  # a candidate that cannot run this model is never chosen
            best[name] = None
    for _ in range(repeats):
        for name, fn in fns.items():
            prev = best[name]
            if prev is None:
                continue
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(prev, time.perf_counter() - t0)
    return {k: math.inf if v is None else v for k, v in best.items()}


#: clients per chunk the calibration times for the ``batched`` executor on a CPU (``batched@<chunk>``)
CHUNK_CANDIDATES = (2, 4, 8, 16)


def _batched_variant(name: str) -> tuple[int | None, int | None]:
    """``(workers, chunk)`` of a calibration name ``batched[:1][@chunk]``."""
    base, _, chunk = name.partition("@")
    return (1 if base == "batched:1" else None), (int(chunk) if chunk else None)


def measure(
    problem,
    candidates: list[str],
    batch_size: int | None,
    clients: int = 32,
    steps: int = 2,
    chunk_size: int | None = None,
    loss=None,
) -> dict[str, float]:
    """Seconds of ``steps`` SGD steps of ``clients`` clients (the first ones) with each candidate executor
    (``batched[:1][@chunk]``: the batched executor with one worker / that many clients a chunk), on the model's
    loss or on ``loss`` (the algorithm's local objective)."""
    from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor, Work, build_plans
    from fedsolve.core.rng import RngStreams

    d = problem.data
    ids = torch.arange(min(clients, d.num_clients))  # 32: with 2 threads, chunks of 4 (8 at one thread)
    plans = build_plans({"train": Work(steps=steps, batch_size=batch_size)}, d.train_offsets, ids, RngStreams(0), 0)
    _ = plans["train"].idx  # built outside the timing
    x0 = problem.layout.flatten(problem.model).detach().to(d.train_x.device)
    start = x0.unsqueeze(0).repeat(ids.numel(), 1)
    lr = 1e-4
    fns: dict[str, Callable[..., Any]] = {}
    for name in candidates:
        if name.startswith("batched"):
            workers, chunk = _batched_variant(name)
            ex = BatchedMLPExecutor(problem, chunk=chunk, workers=workers)
            fns[name] = lambda ex=ex: ex.sgd(start, lr, plans["train"], d)
        else:
            generic = SequentialExecutor() if name == "sequential" else VectorizedExecutor(chunk_size)
            work = _PlainSGD(problem, lr, loss)
            fns[name] = lambda ex=generic, work=work: ex.run(work, {"w": start}, {}, ids, plans, d)
    with torch.enable_grad():
        return _best_times(fns, d.train_x.device)


def _load_cache() -> dict:
    try:
        return json.loads(calibration_path().read_text())
    except (OSError, ValueError):
        return {}


def calibrated_choice(
    problem, candidates: list[str], batch_size: int | None, chunk_size: int | None = None, loss=None
) -> str | None:
    """The fastest of ``candidates`` on this machine for this model and batch size (and local objective
    ``loss``, when the algorithm's steps descend one other than the model's loss): from the cache when measured
    before, else measured now (:func:`measure`) and cached; None when no candidate ran (nothing is cached then,
    and the caller picks by its rule). On a CPU ``batched`` is timed at every chunk size of
    :data:`CHUNK_CANDIDATES` (up to the clients timed), and also with its chunks one after another
    (``batched:1``) when there are several threads; the answer is ``batched`` or ``batched:1``, and the executor
    reads its chunk size from the same entry (:func:`calibrated_chunk`)."""
    cpu = problem.data.train_x.device.type == "cpu"
    if "batched" in candidates and cpu:
        variants = ["batched"] + (["batched:1"] if torch.get_num_threads() > 1 else [])
        n = min(32, problem.data.num_clients)
        chunks = [c for c in CHUNK_CANDIDATES if c < n] + ([n] if n <= max(CHUNK_CANDIDATES) else [])
        candidates = [c for c in candidates if c != "batched"] + [f"{v}@{c}" for v in variants for c in chunks]
    if len(candidates) == 1:
        return candidates[0].split("@")[0]
    key = calibration_key(problem, batch_size, loss)
    path = calibration_path()
    entry = _load_cache().get(key)
    if (
        entry
        and all(c in entry.get("seconds", {}) for c in candidates)
        and any(math.isfinite(entry["seconds"][c]) for c in candidates)
    ):
        return min(candidates, key=lambda c: entry["seconds"][c]).split("@")[0]
    # the first run of a model on a machine pauses here (seconds, longer on a loaded machine): say so
    print(
        f"[fedsolve] timing the executors for this model on this machine (once; cached in {path}) ...",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    secs = measure(problem, candidates, batch_size, chunk_size=chunk_size, loss=loss)
    print(f"[fedsolve] executors timed in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if not any(math.isfinite(secs[c]) for c in candidates):
        return None
    if entry:
        secs = {**entry.get("seconds", {}), **secs}
    cache = _load_cache()  # merged again: another process may have written meanwhile
    cache[key] = {"seconds": secs, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a new measurement next time
    return min(candidates, key=lambda c: secs[c]).split("@")[0]


def calibrated_chunk(problem, batch_size: int | None, workers: int | None) -> int | None:
    """The fastest chunk size of the ``batched`` executor (``workers=1``: its ``batched:1`` form) in this
    machine's calibration for this model and batch size, or None when not measured (or the calibration is off)."""
    if not calibration_enabled():
        return None
    secs = _load_cache().get(calibration_key(problem, batch_size), {}).get("seconds", {})
    base = "batched:1" if workers == 1 and torch.get_num_threads() > 1 else "batched"
    timed = {c: t for c, t in secs.items() if c.startswith(base + "@")}
    return int(min(timed, key=timed.__getitem__).split("@")[1]) if timed else None
