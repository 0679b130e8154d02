"""BatchNorm running statistics of a federated model: kept per client, or averaged by the server.

A model with BatchNorm layers carries buffers (running mean and variance, a count of batches) besides its
parameters. They are state and, like every state here, rows keyed by client (``core/norm.py`` explains how a
client's steps move them). ``FederatedProblem(buffers=...)`` (config: ``model.buffers``) chooses who owns them:

* ``average`` (the default): the server holds one set; every participant starts its local work from it, sends back
  its moved buffers, and the server takes their weighted mean (sample shares, as FedAvg weights the models; the
  count of batches rounded). Every client is scored with the server's set. This is what one global model means:
  the buffers travel with the parameters, as when a whole ``state_dict`` is averaged, so a client that never took
  part is scored with statistics of the data that trained the model, not with the initial ones.
* ``local`` (FedBN, Li et al. 2021): each client keeps its own set as client state rows, never sent; a client is
  scored with its own (one that never took part: the initial statistics). Algorithms whose clients never talk to
  the server (``communicates = False``) always keep them local.

The :class:`RunningBuffers` wrapper adds this to any solver (the engine applies it, :func:`with_buffers`): the
solver sees its own state and messages only; the buffers live under :data:`KEY`-prefixed names in the client
state rows or the server state and messages, so checkpoints, ``--resume``, the ledger (``average`` sends them)
and the Flower transport carry them like any other state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsolve.core.context import LocalContext
from fedsolve.core.statements import is_statement
from fedsolve.engine.algorithm import Algorithm, expand
from fedsolve.engine.wrappers import Wrapper

#: the prefix of a buffer's key in client state rows, server state, messages and uploads
KEY = "buffer:"

Record = dict[str, Tensor]


def _strip(record):
    """``record`` without the buffer keys (what the inner solver sees)."""
    return {k: v for k, v in record.items() if not k.startswith(KEY)}


class RunningBuffers(Wrapper):
    """``inner`` with the model's running statistics kept per client (``local``) or averaged by the server
    (``average``); see the module docstring."""

    def __init__(self, inner: Algorithm, mode: str):
        super().__init__(inner)
        self.mode = mode if inner.communicates else "local"
        self.names = list(inner.problem.running_stats.names)

    def _keys(self) -> list[str]:
        return [KEY + n for n in self.names]

    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        start = self.problem.running_stats.initial()
        for n, v in start.items():
            if self.mode == "local":
                clients.set_default(KEY + n, v.to(x0.device))
            else:
                server[KEY + n] = v.to(x0.device)
        return server, clients

    def broadcast(self, server, ids, round_):
        msg = self.inner.broadcast(_strip(server), ids, round_)
        if self.mode == "average":
            msg = {**msg, **{k: expand(server[k], ids) for k in self._keys()}}
        return msg

    def local_update(self, state, msg, ctx):
        if not isinstance(ctx, LocalContext):  # a probe of the statement, or a data-free update: nothing moves
            return self.inner.local_update(_strip(state), _strip(msg), ctx)
        own = state if self.mode == "local" else msg
        ctx.buffers = {n: own[KEY + n] for n in self.names}
        out = self.inner.local_update(_strip(state), _strip(msg), ctx)
        rows, upload = ctx.run(out) if is_statement(out) else out
        moved = {KEY + n: v for n, v in ctx.buffers.items()}
        if self.mode == "local":
            return {**rows, **moved}, upload
        return rows, {**upload, **moved}

    def aggregate(self, server, ids, uploads, round_):
        new = dict(self.inner.aggregate(_strip(server), ids, _strip(uploads), round_))
        for k in self._keys():
            if self.mode == "local":
                continue
            if k not in uploads:  # an update that read no data moved no buffer
                new[k] = server[k]
                continue
            w = self.client_weights[ids].to(uploads[k].device, torch.float64)
            mean = (w.reshape(-1, *[1] * (uploads[k].dim() - 1)) * uploads[k].double()).sum(0) / w.sum()
            new[k] = mean.to(server[k].dtype) if server[k].is_floating_point() else mean.round().to(server[k].dtype)
        return new

    def eval_model(self, state, msg):
        return self.inner.eval_model(_strip(state), _strip(msg))

    def report(self, server, clients, final: bool = False):
        return self.inner.report(_strip(server), clients, final)

    def scored(self, state: Record, msg: Record) -> dict[str, Tensor]:
        """The buffers the clients of ``state`` (their rows) are scored with, given the scoring message ``msg``:
        ``{buffer name: [..., *shape]}``."""
        own = state if self.mode == "local" else msg
        return {n: own[KEY + n] for n in self.names}


def with_buffers(algo: Algorithm) -> Algorithm:
    """``algo`` inside :class:`RunningBuffers` when its problem's model has BatchNorm layers that track running
    statistics (and it is not wrapped so already); ``algo`` itself otherwise."""
    stats = getattr(algo.problem, "running_stats", None)
    if not stats or not stats.names or _buffers_wrapper(algo) is not None:
        return algo
    return RunningBuffers(algo, getattr(algo.problem, "buffers", "average"))


def without_buffers(algo: Algorithm) -> Algorithm:
    """``algo`` without its outermost :class:`RunningBuffers` wrapper (``algo`` itself when it has none): the solver
    to build a fresh run from (the simulation adds the wrapper again)."""
    return algo.inner if isinstance(algo, RunningBuffers) else algo


def _buffers_wrapper(algo) -> RunningBuffers | None:
    while algo is not None:
        if isinstance(algo, RunningBuffers):
            return algo
        algo = vars(algo).get("inner")
    return None


def scored_buffers(algo: Algorithm, state: Record, msg: Record) -> dict[str, Tensor] | None:
    """The running statistics the clients with state rows ``state`` are scored with, given the scoring message
    ``msg`` (``broadcast(server, ids, None)``): ``{buffer name: rows}``, or None when ``algo`` keeps none."""
    wrapper = _buffers_wrapper(algo)
    return None if wrapper is None else wrapper.scored(state, msg)


def run_buffers(algo: Algorithm, server: Record, clients, m: int) -> dict[str, Tensor] | None:
    """The running statistics each of the ``m`` clients of a run is scored with, from the server state and the
    client states (``ClientStates``): ``{buffer name: [m, ...]}``, or None when ``algo`` keeps none."""
    wrapper = _buffers_wrapper(algo)
    if wrapper is None:
        return None
    if wrapper.mode == "local":
        return {n: clients[KEY + n] for n in wrapper.names}
    return {n: expand(server[KEY + n], torch.arange(m)) for n in wrapper.names}
