"""The per-round logic of ``fedsolve.engine.Simulation``, split into its server part and its
one-client part, so a Flower ServerApp and a node's ClientApp reproduce a simulated round
exactly (same sampling RNG, same minibatch plans, same order of operations as the
``sequential`` executor).

Server:  ids = sample(t); scale = work fractions; msg = broadcast(server, ids, t);
         ... uploads of the clients that answered ...; server = aggregate(server, ids', uploads, t)
Client:  plan = build_plans(work, ., [i], rngs, t, scale_i)  (keyed by (round, client id, phase),
         so the node holding client i rebuilds the very plan the simulator draws);
         rows, upload = local_update(rows, msg_i, ctx_i)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from torch.func import functional_call

from fedsolve.core.context import LocalContext
from fedsolve.core.executor import carry_out
from fedsolve.core.plans import Plan, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.core.statements import Descend
from fedsolve.engine.metrics import client_metrics
from fedsolve.engine.sampling import sample_clients

Record = dict[str, Tensor]


# ------------------------------------------------------------------ server side
def sample_round(sim_cfg, num_clients: int, weights: Tensor, rngs: RngStreams, t: int) -> Tensor:
    """Sorted ids sampled in round ``t`` (``Simulation.run_round``'s draw)."""
    return sample_clients(sim_cfg.sampling, num_clients, weights, rngs.numpy("sampling", t))


def work_scales(sim_cfg, num_clients: int, rngs: RngStreams, t: int) -> Tensor | None:
    """Per-client fraction of local work in round ``t`` (``None`` unless ``work.variable=uniform``)."""
    if sim_cfg.work.variable != "uniform":
        return None
    g = rngs.numpy("work", t)
    return torch.as_tensor(g.uniform(sim_cfg.work.min_fraction, 1.0, size=num_clients))


def initial_state(problem, algorithm, seed: int):
    """``(server state, ClientStates)`` exactly as ``Simulation.__init__`` creates them."""
    rngs = RngStreams(seed)
    x0 = problem.init_params(rngs.torch("init"))
    return algorithm.init(x0, rngs)


def weighted_train_loss(losses: Tensor, weights: Tensor) -> float:
    w = weights.double()
    return float((losses.double() * w).sum() / w.sum())


# ------------------------------------------------------------------ client side
def local_offsets(cid: int, num_clients: int, n: int) -> Tensor:
    """Offsets that give client ``cid`` rows ``0:n`` (its node's own tensors) and others none."""
    off = torch.zeros(num_clients + 1, dtype=torch.long)
    off[cid + 1 :] = n
    return off


def plan_shapes(
    algorithm,
    train_offsets: Tensor,
    ids: Tensor,
    rngs: RngStreams,
    t: int,
    scale: Tensor | None,
    phases: Mapping | None = None,
    groups=None,
) -> dict[str, tuple[int, int]]:
    """``{phase: (S, B)}``: steps and batch width of round ``t``'s stacked plan over ``ids`` for
    ``phases`` (default: the round's ``algorithm.work(t)``).

    The simulator pads every client's plan to the round's largest (S, B) (e.g. full-batch phases
    pad to the largest client); padded rows have weight 0 but change the shape of the reductions,
    so the node pads its own plan the same way to get bit-identical gradients. Needs only the
    clients' sizes (offsets) and, for phases on a row group, the rows' group ids (``groups``), no data.
    """
    plans = build_plans(algorithm.work(t) if phases is None else phases, train_offsets, ids, rngs, t, scale, groups)
    return {p: (int(pl.idx.shape[1]), int(pl.idx.shape[2])) for p, pl in plans.items()}


def _pad(pl: Plan, S: int, B: int) -> Plan:
    K, S0, B0 = pl.idx.shape
    if (S0, B0) == (S, B):
        return pl
    if S < S0 or B < B0:
        raise ValueError(f"plan padding ({S}, {B}) smaller than the client's own plan ({S0}, {B0})")
    idx = torch.zeros(K, S, B, dtype=pl.idx.dtype)  # padding rows point at the client's first row (a = 0)
    w = torch.zeros(K, S, B, dtype=pl.w.dtype)
    act = torch.zeros(K, S, dtype=pl.active.dtype)
    idx[:, :S0, :B0], w[:, :S0, :B0], act[:, :S0] = pl.idx, pl.w, pl.active
    return Plan(idx, w, act)


def _client_context(
    algorithm,
    phases: Mapping,
    cid: int,
    num_clients: int,
    weight: Tensor,
    train_x: Tensor,
    train_y: Tensor,
    rngs: RngStreams,
    t: int,
    scale: float | None,
    pad: Mapping[str, tuple[int, int]] | None,
    groups=None,
) -> LocalContext:
    """ONE client's ``LocalContext`` for ``phases`` in round ``t`` on its own data: the minibatch plan is
    drawn from the client's own stream ``("batches", t, cid, phase)`` and padded to the ``pad`` shapes."""
    n = int(train_x.shape[0])
    ids = torch.tensor([cid], dtype=torch.long)
    sc = None if scale is None else torch.tensor([scale], dtype=torch.float64)
    plans = build_plans(phases, local_offsets(cid, num_clients, n), ids, rngs, t, sc, groups)
    if pad:
        plans = {p: _pad(pl, *pad[p]) if p in pad else pl for p, pl in plans.items()}
    ctx = LocalContext(
        algorithm.problem,
        {p: pl.row(0) for p, pl in plans.items()},
        torch.tensor(float(n), dtype=torch.float32),
        weight.to(torch.float32),
        ids[0],
        train_x,
        train_y,
        t,
    )
    ctx.eager = True  # the sequential executor's path, so deployment == simulation bit for bit
    return ctx


def client_update(
    algorithm,
    cid: int,
    num_clients: int,
    weight: Tensor,
    train_x: Tensor,
    train_y: Tensor,
    state: Mapping[str, Tensor],
    msg: Mapping[str, Tensor],
    rngs: RngStreams,
    t: int,
    scale: float | None,
    pad: Mapping[str, tuple[int, int]] | None = None,
    groups=None,
) -> tuple[Record, Record, Tensor]:
    """ONE client's ``local_update`` in round ``t`` on its own data: (new rows, upload, train loss).

    Mirrors ``SequentialExecutor.run`` for one client; the minibatch plan is drawn from the
    client's own stream ``("batches", t, cid, phase)`` and padded to the round's ``pad`` shapes.
    ``groups``: ``(the client's train_groups, group_names)`` when phases draw from row groups.
    """
    ctx = _client_context(
        algorithm, algorithm.work(t), cid, num_clients, weight, train_x, train_y, rngs, t, scale, pad, groups
    )
    new_state, upload = carry_out(algorithm.local_update(dict(state), dict(msg), ctx), ctx)
    return new_state, upload, ctx.train_loss


def client_eval_params(algorithm, state: Mapping[str, Tensor], eval_msg: Mapping[str, Tensor]) -> Tensor:
    return algorithm.eval_model(dict(state), dict(eval_msg))


def client_adapt(
    algorithm,
    params: Tensor,
    cid: int,
    num_clients: int,
    weight: Tensor,
    train_x: Tensor,
    train_y: Tensor,
    rngs: RngStreams,
    t: int,
    pad: Mapping[str, tuple[int, int]] | None = None,
    groups=None,
) -> Tensor:
    """ONE client's evaluation-time adaptation after ``t`` rounds, as ``Simulation.eval_params`` runs it: ``params``
    is what ``eval_model`` returned, a ``Descend`` statement (e.g. Per-FedAvg's) carried out on the phases of
    ``work(None)``, or the parameters themselves."""
    if not isinstance(params, Descend):
        return params
    ctx = _client_context(
        algorithm, algorithm.work(None), cid, num_clients, weight, train_x, train_y, rngs, t, None, pad, groups
    )
    return ctx.descend(params)


def client_eval_metrics(
    problem,
    params: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    which: tuple[str, ...],
    buffers: Mapping[str, Tensor] | None = None,
) -> dict[str, float]:
    """Per-client test metrics (``simulation.metrics.client_metrics``) of flat ``params`` (and the client's
    BatchNorm running statistics ``buffers``, ``engine.buffers.scored_buffers``; None: the model's own)."""
    model, layout = problem.model, problem.layout
    with torch.no_grad():
        model.eval()
        try:
            out = functional_call(model, {**layout.unflatten(params), **(buffers or {})}, (test_x,))
        finally:
            model.train()
    return client_metrics(problem, out, test_y, which)
