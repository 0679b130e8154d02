"""Batched minibatch SGD for stacked MLPs: the ``batched`` executor, and ``auto``'s per-machine calibration.

A model that is a chain of ``nn.Linear`` layers with elementwise activations between them (ReLU, tanh,
sigmoid; e.g. ``mlp`` and ``logreg`` of ``fedsolve.models``) is trained for all K selected clients at once:

* the clients' flat parameter rows are one contiguous ``[K, d]`` buffer ``P``; layer ``l``'s weight is the
  view ``[K, out, in]`` of its slice (the model's own flat layout, so nothing is converted), its gradient the
  same view of a ``[K, d]`` buffer ``G``;
* each step gathers every client's minibatch at once from the plans (``[K, B, in]``), runs the forward pass
  as ``baddbmm`` per layer and the backward pass by hand (``bmm`` for the weight gradients and the
  back-propagated errors, a sum over the batch for the biases; no autograd, no vmap), then one fused update
  ``P -= lr * (G + wd P + rho (P - anchor))`` over the stacked rows (inactive steps leave a row unchanged).

The update it runs is the algorithm's declared GD form (:meth:`Algorithm.linear_gd` -> ``GDStep``: start,
lr, proximal anchor and rho, finish), the declaration the ``linear`` executor uses; the algorithm opts in to
running it with *minibatch* gradients by setting ``linear_gd_minibatch = True`` (its ``linear_gd`` does not
use the ``full`` argument, and its ``local_update`` is ``local_sgd`` on that objective: FedAvg, FedProx,
Local). Same numbers as the sequential executor to float rounding (``tests/test_batched_mlp.py``).

``auto`` (``core.selection.make_executor``) chooses among the executors that apply by a calibration: a tiny
timing of each candidate (two SGD steps of 32 clients on the actual model and batch size, best of 5,
interleaved), measured once per machine, model signature, batch size and thread count and cached as JSON in
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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsolve.core.executor import Plan, linear_gd_owner_ok, on_data_device
from fedsolve.core.linear import keep_freed_memory


_ACTS = {nn.ReLU: "relu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.Identity: None}
_ACT_FNS = {torch.relu: "relu", F.relu: "relu", torch.tanh: "tanh", torch.sigmoid: "sigmoid"}


@dataclass(frozen=True)
class _Layer:
    w: tuple[int, int, int]           # (start in the flat vector, out, in)
    b: int | None                     # start of the bias, None without one
    act: str | None                   # activation after the layer


def mlp_layers(problem) -> list[_Layer]:
    """The layers of ``problem.model`` when it is a chain of ``nn.Linear`` + elementwise activations on the
    flattened input (traced with ``torch.fx``); raises ``ValueError`` saying why not otherwise."""
    model = problem.model
    why = None
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - any tracing failure means "not a plain MLP"
        raise ValueError(f"executor: 'batched' needs a model made of nn.Linear layers and elementwise "
                         f"activations; {type(model).__name__} could not be traced ({e})") from None
    mods = dict(gm.named_modules())
    starts = {e.name: e.start for e in problem.layout.entries}
    layers: list[list] = []
    cur = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            cur = node
        elif node.op == "call_function" and node.target in (getattr, operator.getitem):
            continue   # x.shape[0] of the flattening reshape
        elif node.op == "call_method" and node.target in ("reshape", "view", "flatten") and not layers:
            cur = node
        elif node.op == "call_module" and isinstance(mods[node.target], nn.Flatten) and not layers:
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
        elif node.args and node.args[0] is cur and layers and layers[-1][3] is None and (
                (node.op == "call_module" and type(mods[node.target]) in _ACTS)
                or (node.op == "call_function" and node.target in _ACT_FNS)):
            layers[-1][3] = (_ACTS[type(mods[node.target])] if node.op == "call_module" else _ACT_FNS[node.target])
            cur = node
        elif node.op == "output" and node.args[0] is cur:
            break
        else:
            why = f"unsupported operation {node.op} {node.target!r}"
            break
    n_lin = sum(isinstance(m, nn.Linear) for m in model.modules())
    if why is None and (not layers or len(layers) != n_lin or layers[-1][3] is not None
                        or sum(1 for _ in model.parameters()) != sum(1 + (ly[2] is not None) for ly in layers)):
        why = "its parameters are not those of a chain of nn.Linear layers ending in a linear output"
    if why is not None:
        raise ValueError(f"executor: 'batched' needs a model made of nn.Linear layers and elementwise activations "
                         f"(ReLU, Tanh, Sigmoid), e.g. 'mlp' or 'logreg'; {type(model).__name__}: {why}; use "
                         f"'auto', 'vectorized' or 'sequential'")
    if problem.loss_name not in ("cross_entropy", "squared_error"):
        raise ValueError(f"executor: 'batched' supports loss cross_entropy or squared_error, got "
                         f"{problem.loss_name!r}")
    return [_Layer(w, b, act) for w, _, b, act in layers]


def batched_sgd_applies(algorithm, problem, check_problem: bool = True) -> bool:
    """The ``batched`` executor can run ``algorithm``: it declares its GD form (``supports_linear_gd()`` and
    ``linear_gd``, defined by the class that defines ``local_update``) with ``linear_gd_minibatch = True``, its
    only work phase is ``train`` (the flag set by the class that defines ``linear_gd``: a subclass with its own
    GD form does not inherit it), and (``check_problem``) the model is a stacked-Linear chain (:func:`mlp_layers`)."""

    if not getattr(algorithm, "linear_gd_minibatch", False) or not linear_gd_owner_ok(algorithm):
        return False
    owner = lambda attr: next(k for k in type(algorithm).__mro__ if attr in k.__dict__)  # noqa: E731
    if owner("linear_gd_minibatch") is not owner("linear_gd"):   # a subclass's own GD form was not declared so
        return False
    if set(algorithm.work(0)) != {"train"}:
        return False
    if not check_problem:
        return True
    try:
        mlp_layers(problem)
    except ValueError:
        return False
    return True


class BatchedMLPExecutor:
    """The ``batched`` executor (module docstring); same ``run`` interface as ``core.executor``."""

    name = "batched"

    def __init__(self, problem, chunk: int | None = None, workers: int | None = None):
        self.layers = mlp_layers(problem)
        #: clients per chunk on the CPU (None: at most 8, at least 4 chunks a worker)
        self.chunk = chunk
        #: chunks run at once on the CPU in a thread pool, one torch thread each (None: 1, the chunks one after
        #: another with torch's own threads; a pool is opt-in: it stalled under load in CI)
        self.workers = workers
        self.tune_malloc = True
        self.ce = problem.loss_name == "cross_entropy"
        self.in_dim = self.layers[0].w[2]

    # ---------------------------------------------------------------- one step on a chunk of clients
    def _loss_grad(self, P: Tensor, G: Tensor, X: Tensor, Y: Tensor, w: Tensor, zs: list[Tensor],
                   dhs: list[Tensor]) -> Tensor:
        """Weighted mean loss ``[k]`` at ``P`` ``[k, d]`` on ``X`` ``[k, B, in]``; its gradient into ``G``.
        ``zs``/``dhs``: the activation / back-propagated error buffers (``[k, B, out]`` / ``[k, B, in]`` per layer)."""
        K = P.shape[0]
        Ws, hs = [], [X]
        for ly, z in zip(self.layers, zs):
            s, o, i = ly.w
            W = P[:, s:s + o * i].view(K, o, i)
            Ws.append(W)
            if ly.b is not None:
                torch.baddbmm(P[:, ly.b:ly.b + o].unsqueeze(1), hs[-1], W.transpose(1, 2), out=z)
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
            lse = torch.logsumexp(z, -1, keepdim=True)
            loss = ((lse.squeeze(-1) - z.gather(-1, Y.unsqueeze(-1)).squeeze(-1)) * w).sum(1)
            dz = z.sub_(lse).exp_()   # softmax
            dz.scatter_add_(-1, Y.unsqueeze(-1), torch.full_like(dz[..., :1], -1.0))
        else:
            dz = z.sub_(Y.reshape(z.shape).to(z.dtype))
            loss = (0.5 * dz.pow(2).sum(-1) * w).sum(1)
        dz = dz.mul_(w.unsqueeze(-1))
        for l in range(len(self.layers) - 1, -1, -1):
            ly, h = self.layers[l], hs[l]
            s, o, i = ly.w
            torch.bmm(dz.transpose(1, 2), h, out=G[:, s:s + o * i].view(K, o, i))
            if ly.b is not None:
                torch.sum(dz, 1, out=G[:, ly.b:ly.b + o])
            if l > 0:
                dh = torch.bmm(dz, Ws[l], out=dhs[l - 1])
                act = self.layers[l - 1].act
                if act == "relu":   # relu's own backward, in place (h is the post-activation output)
                    torch.ops.aten.threshold_backward.grad_input(dh, h, 0.0, grad_input=dh)
                elif act == "tanh":
                    dh.mul_(1 - h * h)
                elif act == "sigmoid":
                    dh.mul_(h * (1 - h))
                dz = dh
        return loss

    def _sgd_chunk(self, P: Tensor, Z: Tensor | None, Xf: Tensor, ty: Tensor, idx: Tensor, wts: Tensor,
                   active: Tensor, fixed: bool, lr: float, rho: float, wd: float) -> Tensor:
        """All steps of the clients of one chunk, in place on their rows ``P`` ``[k, d]``; their summed loss."""
        K, (S, B) = P.shape[0], idx.shape[1:]
        G = torch.empty_like(P)
        zs = [P.new_empty(K, B, ly.w[1]) for ly in self.layers]
        dhs = [P.new_empty(K, B, ly.w[2]) for ly in self.layers[1:]]
        xb = P.new_empty(K * B, Xf.shape[1])
        loss_sum = P.new_zeros(K)
        yb = None
        for s in range(S):
            if yb is None or not fixed:
                ix = idx[:, s].reshape(-1)
                torch.index_select(Xf, 0, ix, out=xb)
                yb = ty.index_select(0, ix).view(K, B, *ty.shape[1:])
            loss = self._loss_grad(P, G, xb.view(K, B, -1), yb, wts[:, s], zs, dhs)
            if wd > 0:
                G.add_(P, alpha=wd)
            if Z is not None:
                G.add_(P - Z, alpha=rho)
            live = active[:, s]
            loss_sum += loss * live
            if bool(live.all()):   # the fused update of the chunk's stacked flat rows
                P.add_(G, alpha=-lr)
            else:
                P.addcmul_(G, live.to(P.dtype).unsqueeze(1), value=-lr)
        return loss_sum

    def sgd(self, start: Tensor, lr: float, plan: Plan, data, anchor: Tensor | None = None, rho: float = 0.0,
            wd: float = 0.0) -> tuple[Tensor, Tensor]:
        """Minibatch SGD of all clients from ``start`` ``[K, d]`` over ``plan``: ``(final P, mean loss [K])``.

        On the CPU the clients run in chunks of ``chunk`` (default: at most 8, at least 4 chunks a thread): a
        chunk's weights stay in cache for all its steps, and the chunks spread over the torch thread count (one
        intra-op thread each, the count restored afterwards); on a GPU all clients are one chunk."""
        dtype = data.train_x.dtype if data.train_x.dtype == torch.float64 else torch.float32
        P = start.to(dtype).clone(memory_format=torch.contiguous_format)
        K = P.shape[0]
        active = plan.active
        S = active.shape[1] if K else 0
        steps = active.sum(1).to(dtype)
        if not S:
            return P, P.new_zeros(K)
        Z = anchor.to(dtype) if anchor is not None and rho > 0 else None
        Xf = data.train_x.reshape(data.train_x.shape[0], -1).to(dtype)
        ty = data.train_y if self.ce else data.train_y.reshape(data.train_y.shape[0], -1)
        B = max(int((plan.w > 0).sum(-1).max()), 1)
        idx, wts = plan.idx[..., :B], plan.w[..., :B].to(dtype)
        cpu = P.device.type == "cpu"
        threads = torch.get_num_threads() if cpu else 1
        # one worker unless asked for more: a pool of threads that each set their own torch thread count can
        # stall under load (seen as a run that did not answer Ctrl-C in CI), so chunks run in this thread by default
        workers = min(self.workers or 1, threads)
        # at most 8 clients a chunk; with several workers at least 4 chunks a worker, so that a worker slowed by
        # another process's job leaves the others more chunks to take (the pool hands them out as workers free up)
        size = K if not cpu else (self.chunk or max(1, min(8, math.ceil(K / (4 * workers if workers > 1 else 1)))))
        bounds = [(a, min(a + size, K)) for a in range(0, K, size)]

        def chunk(ab):
            if workers > 1:
                torch.set_num_threads(1)   # this pool thread's intra-op count
            a, b = ab
            return self._sgd_chunk(P[a:b], None if Z is None else Z[a:b], Xf, ty, idx[a:b], wts[a:b],
                                   active[a:b], plan.fixed, lr, rho, wd)

        if workers > 1 and len(bounds) > 1:   # every chunk on one thread, `workers` at a time
            torch.set_num_threads(1)
            try:
                with ThreadPoolExecutor(workers) as pool:
                    sums = list(pool.map(chunk, bounds))
            finally:
                torch.set_num_threads(threads)
        else:
            sums = [chunk(ab) for ab in bounds]
        return P, torch.cat(sums) / steps.clamp_min(1)

    # ---------------------------------------------------------------- one round
    @on_data_device
    def run(self, algo, rows, msgs, ids, plans, data, round_: int = 0):
        if not batched_sgd_applies(algo, None, check_problem=False) or not algo.supports_linear_gd():
            raise ValueError(f"executor: 'batched' does not run {algo.name} with this configuration (it runs local "
                             f"SGD declared by linear_gd with linear_gd_minibatch = True, one 'train' phase); use "
                             f"'auto', 'vectorized' or 'sequential'")
        if self.tune_malloc:   # the linear executor's process-wide allocator setting (core/linear.py)
            keep_freed_memory()
        spec = algo.linear_gd(rows, msgs, ids, round_, None)   # minibatch declarers do not use ``full``
        wd = float(getattr(algo.cfg, "weight_decay", 0.0))
        P, losses = self.sgd(spec.start, spec.lr, plans["train"], data, spec.anchor, spec.rho, wd)
        new_rows, uploads = spec.finish(P.to(spec.start.dtype))
        return new_rows, uploads, losses.to(torch.float32)


# ------------------------------------------------------------------ auto: calibration per machine
class _PlainSGD:
    """Plain local SGD as an algorithm for the calibration of the generic executors."""

    def __init__(self, problem, lr: float):
        self.problem, self.lr = problem, lr

    def local_update(self, state, msg, ctx):
        return {"w": ctx.sgd(state["w"], self.lr)}, {}


def calibration_path() -> Path:
    base = os.environ.get("FEDSOLVE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "fedsolve") / "executor_calibration.json"


def calibration_enabled() -> bool:
    return os.environ.get("FEDSOLVE_CALIBRATE", "1").strip().lower() not in ("0", "false", "off", "no")


def _machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}|{platform.machine()}|{cpu}|{os.cpu_count()}|torch {torch.__version__}"


def calibration_key(problem, batch_size: int | None) -> str:
    """Machine + model signature + batch size + threads (+ the data's device and float type)."""
    d = problem.data
    dev = d.train_x.device
    devname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    model = ",".join(f"{e.name}:{'x'.join(map(str, e.shape))}" for e in problem.layout.entries)
    return (f"{_machine()}|{devname}|{type(problem.model).__name__}[{model}]|{problem.loss_name}|"
            f"in{tuple(d.input_shape)}|{d.train_x.dtype}|batch {batch_size}|threads {torch.get_num_threads()}")


def _best_times(fns: dict, device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Best of ``repeats`` timings of each function after one warm-up (vmap tracing, allocations), the
    candidates interleaved so that a load that comes and goes hits them alike; inf for one that fails."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = {}
    for name, fn in fns.items():
        try:
            fn()
            sync()
            best[name] = math.inf
        except (RuntimeError, ValueError):   # a candidate that cannot run this model is never chosen
            best[name] = None
    for _ in range(repeats):
        for name, fn in fns.items():
            if best[name] is None:
                continue
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {k: math.inf if v is None else v for k, v in best.items()}


def measure(problem, candidates: list[str], batch_size: int | None, clients: int = 32, steps: int = 2,
            chunk_size: int | None = None) -> dict[str, float]:
    """Seconds of ``steps`` SGD steps of ``clients`` clients (the first ones) with each candidate executor."""
    from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor, Work, build_plans
    from fedsolve.core.rng import RngStreams

    d = problem.data
    ids = torch.arange(min(clients, d.num_clients))   # 32: with 2 threads, chunks of 4 (8 at one thread)
    plans = build_plans({"train": Work(steps=steps, batch_size=batch_size)}, d.train_offsets, ids, RngStreams(0), 0)
    plans["train"].idx   # built outside the timing
    x0 = problem.layout.flatten(problem.model).detach().to(d.train_x.device)
    start = x0.unsqueeze(0).repeat(ids.numel(), 1)
    lr = 1e-4
    fns = {}
    for name in candidates:
        if name.startswith("batched"):
            ex = BatchedMLPExecutor(problem, workers=1 if name == "batched:1" else None)
            fns[name] = lambda ex=ex: ex.sgd(start, lr, plans["train"], d)
        else:
            ex = SequentialExecutor() if name == "sequential" else VectorizedExecutor(chunk_size)
            fns[name] = lambda ex=ex, work=_PlainSGD(problem, lr): ex.run(work, {"w": start}, {}, ids, plans, d)
    with torch.enable_grad():
        return _best_times(fns, d.train_x.device)


def calibrated_choice(problem, candidates: list[str], batch_size: int | None,
                      chunk_size: int | None = None) -> str:
    """The fastest of ``candidates`` on this machine for this model and batch size: from the cache when
    measured before, else measured now (:func:`measure`) and cached."""
    if "batched" in candidates and torch.get_num_threads() > 1 and problem.data.train_x.device.type == "cpu":
        candidates = [*candidates, "batched:1"]   # the chunks one after another instead of on every thread
    if len(candidates) == 1:
        return candidates[0]
    key = calibration_key(problem, batch_size)
    path = calibration_path()

    def load() -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    entry = load().get(key)
    if entry and all(c in entry.get("seconds", {}) for c in candidates):
        return min(candidates, key=lambda c: entry["seconds"][c])
    secs = measure(problem, candidates, batch_size, chunk_size=chunk_size)
    if entry:
        secs = {**entry.get("seconds", {}), **secs}
    cache = load()   # merged again: another process may have written meanwhile
    cache[key] = {"seconds": secs, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass   # an unwritable cache only costs a new measurement next time
    return min(candidates, key=lambda c: secs[c])
