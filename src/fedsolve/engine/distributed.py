"""Client-sharded simulation on ``torch.distributed``: the third transport, beside the in-process executor and the
Flower grid (``engine/transport.py``).

N processes (ranks), started by ``torchrun``, each run the same :class:`~fedsolve.engine.loop.Simulation`: the same
config and seed, so the same client sampling, broadcasts and server state. Each rank owns a contiguous block of the
clients, balanced by their training sample counts (:func:`shard_clients`), and keeps the state rows of those clients
up to date; the rows of other ranks' clients it holds are refreshed only when every rank needs them (below). In a
round, each rank runs its own selected clients on its executor (the in-process transport over the subset), then the
uploads and train losses of all selected clients are gathered to every rank in the order of the round's ``ids``
(:func:`all_gather_rows`: one ``all_gather`` of padded tensors per dtype), so every rank aggregates the same uploads
into the same server state. At an evaluation, the rows trained since the last one are gathered to every rank (the
algorithm's report and the checkpoint read all clients' rows), each rank scores its own clients and the per-client
metrics are gathered in client order. Before a checkpoint that no evaluation precedes (``checkpoint_every``) the
rows are gathered as well, so rank 0, which alone has the run folder, writes a checkpoint of the whole run; it is
the checkpoint a single-process run writes, and either kind of run resumes from it.

Backends: ``gloo`` on CPUs (the gathered tensors travel on the CPU), ``nccl`` on GPUs (one process per GPU,
``cuda:LOCAL_RANK``; the gathered tensors travel on that GPU). :func:`launch` joins the group that torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) describes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from fedsolve.engine.metrics import evaluate
from fedsolve.engine.transport import InProcess, Record, Transport

#: the environment torchrun sets for every process (``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` default to 0 and 1)
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: the key of the train losses among the gathered upload rows (an upload key cannot start with a NUL)
_LOSS = "\0loss"


class DistributedError(RuntimeError):
    """The ranks cannot run together: another rank stopped before the run, or they run different simulations."""


@dataclass(frozen=True)
class Launch:
    """This process's place in the group: its rank, the number of ranks, its rank on its machine, the number of
    ranks on its machine and the backend (``gloo`` or ``nccl``)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is not None:
            return default
    else:
        try:
            return int(raw)
        except ValueError:
            pass
    raise ValueError(
        f"--distributed: the environment variable {name}={raw!r} is not a whole number; launch "
        f"with torchrun, which sets it"
    )


def launch(device: str = "auto", backend: str | None = None) -> Launch:
    """Join the process group that torchrun's environment describes (once per process; later calls return the
    same group). ``device`` is ``simulation.device``: a GPU run (``cuda``, or ``auto`` with a GPU) uses
    ``cuda:LOCAL_RANK`` and the ``nccl`` backend, a CPU run ``gloo``; ``backend`` overrides the choice. Raises
    ``ValueError`` with one line when the environment is not torchrun's."""
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise ValueError(
            f"--distributed: {', '.join(missing)} not set (this is not a torchrun process); launch "
            f"with: torchrun --nproc-per-node N -m fedsolve run CONFIG --distributed"
        )
    _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("MASTER_PORT")
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if gpu and device in ("auto", "cuda"):  # one process per GPU; an explicit cuda:N is used as given
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"--distributed: LOCAL_RANK {local_rank} but {torch.cuda.device_count()} GPU(s) "
                f"visible; start at most one process per GPU (--nproc-per-node)"
            )
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if gpu else "gloo"))
    return Launch(dist.get_rank(), dist.get_world_size(), local_rank, local_world, str(dist.get_backend()))


def shard_clients(sizes: Tensor, world: int) -> Tensor:
    """``owner[i]``, the rank that owns client ``i``: contiguous blocks of clients in id order, balanced by the
    sample counts ``sizes`` (client ``i`` goes to rank ``floor(world * (samples before i + half of its own) /
    all samples)``; by count when there are no samples). A rank may own no client when there are fewer clients
    than ranks."""
    n = sizes.detach().cpu().to(torch.float64).reshape(-1)
    if n.numel() == 0 or float(n.sum()) <= 0:
        n = torch.ones_like(n)
    mid = torch.cumsum(n, 0) - n / 2
    return (mid * world / n.sum()).floor().long().clamp_(0, world - 1)


def all_gather_rows(
    local: Record | None,
    counts: list[int],
    schema: dict[str, tuple[tuple[int, ...], torch.dtype]],
    device: torch.device,
    group=None,
) -> list[Record]:
    """Every rank's record on every rank: rank ``r`` holds ``counts[r]`` rows of each key of ``schema`` (``{key:
    (row shape, dtype)}``; ``local`` is this rank's, None when it holds none). One ``all_gather`` per dtype of
    ``[max(counts), row widths]`` tensors on ``device`` (bool travels as uint8); returns the ranks' records, their
    rows on ``device``."""
    top, me = max(counts), dist.get_rank(group)
    out: list[Record] = [{} for _ in counts]
    if top == 0:
        return out
    if counts[me] and local is None:
        raise ValueError(f"all_gather_rows: rank {me} holds {counts[me]} rows, but its record is None")
    dtypes = sorted({dt for _, dt in schema.values()}, key=str)
    for dt in dtypes:
        keys = sorted(k for k, (_, d) in schema.items() if d == dt)
        wire = torch.uint8 if dt == torch.bool else dt
        widths = [math.prod(schema[k][0]) for k in keys]
        buf = torch.zeros(top, sum(widths), dtype=wire, device=device)
        if counts[me] and local is not None:
            buf[: counts[me]] = torch.cat([local[k].reshape(counts[me], -1).to(device, wire) for k in keys], 1)
        parts = [torch.empty_like(buf) for _ in counts]
        dist.all_gather(parts, buf, group=group)
        for r, part in enumerate(parts):
            for k, col in zip(keys, part[: counts[r]].split(widths, 1)):
                out[r][k] = col.reshape(counts[r], *schema[k][0]).to(dt)
    return out


def _schema(rec: Record) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {k: (tuple(v.shape[1:]), v.dtype) for k, v in rec.items()}


class DistributedTransport(Transport):
    """The clients sharded over the ranks of a ``torch.distributed`` group (module docstring). Every rank builds
    the same ``Simulation`` with its own ``DistributedTransport``; only rank 0 should get an ``out_dir`` and the
    callbacks that write. ``group``: the process group (default: the whole world, joined with :func:`launch`)."""

    name = "distributed"

    def __init__(self, group=None):
        if not dist.is_initialized():
            raise ValueError(
                "DistributedTransport: torch.distributed is not initialized; call "
                "fedsolve.engine.distributed.launch() first, in a process torchrun started"
            )
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        #: where gathered tensors travel: the GPU for NCCL, the CPU for gloo
        self.comm_device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(group) == "nccl"
            else torch.device("cpu")
        )
        self.started = False
        self.owner: Tensor | None = None  # [m]: the rank of each client
        self._dirty: Tensor | None = None  # [m] bool: trained since the rows were last gathered everywhere
        self._local = InProcess()

    # ---------------------------------------------------------------- agreement
    def _exchange(self, mine: dict[str, Any]) -> list[dict[str, Any]]:
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, mine, group=self.group)
        return every

    def start(self, sim) -> None:
        """Check that every rank runs the same simulation (algorithm, seed, clients, parameters, round, executor)
        and stop every rank with one message when another rank stopped before the run (:meth:`abort`). Adds the
        :class:`CheckpointSync` callback when a rank writes checkpoints."""
        mine = {
            "error": None,
            "algorithm": sim.algo.name,
            "seed": sim.seed,
            "clients": sim.problem.num_clients,
            "dim": sim.problem.layout.dim,
            "round": max(sim.round, sim.start_round),
            "evaluations": len(sim.history),
            "executor": getattr(sim.executor, "name", None),
            "checkpoints": sim.checkpoint_path is not None,
        }
        every = self._exchange(mine)
        self.started = True
        stopped = [(r, e["error"]) for r, e in enumerate(every) if e["error"] is not None]
        if stopped:
            r, why = stopped[0]
            raise DistributedError(f"--distributed: rank {r} stopped before the run ({why}); every rank stops")
        diff = [
            f"{k} (rank 0: {every[0][k]!r}, rank {r}: {e[k]!r})"
            for r, e in enumerate(every)
            for k in mine
            if k not in ("error", "checkpoints") and e[k] != every[0][k]
        ]
        if diff:
            hint = (
                "; simulation.executor 'auto' chose differently on the ranks: set it explicitly"
                if any(d.startswith("executor") for d in diff)
                else ""
            )
            raise DistributedError(
                f"--distributed: the ranks do not run the same simulation: {'; '.join(diff[:3])}"
                f"{hint}; every rank must get the same config, seed and --resume"
            )
        self._owners(sim)
        if (
            any(e["checkpoints"] for e in every)
            and sim.cfg.checkpoint_every
            and not any(isinstance(cb, CheckpointSync) for cb in sim.callbacks)
        ):
            sim.callbacks.append(CheckpointSync(self))

    def abort(self, error: BaseException) -> None:
        """This rank stopped before the run started: tell the others, which wait in :meth:`start` and then stop
        with one message naming this rank and ``error`` (a no-op once the run started: the others then stop when
        they lose contact with this rank). The caller raises ``error`` after it."""
        if self.started:
            return
        self.started = True
        text = str(error).splitlines()[0] if str(error) else ""
        self._exchange({"error": f"{type(error).__name__}: {text}" if text else type(error).__name__})

    # ---------------------------------------------------------------- ownership and rows
    def _owners_dirty(self, sim) -> tuple[Tensor, Tensor]:
        """``(owner, dirty)``, made on first use."""
        if self.owner is None or self._dirty is None:
            off = sim.problem.data.train_offsets.cpu()
            self.owner = shard_clients(off[1:] - off[:-1], self.world)
            self._dirty = torch.zeros(sim.problem.num_clients, dtype=torch.bool)
        return self.owner, self._dirty

    def _owners(self, sim) -> Tensor:
        return self._owners_dirty(sim)[0]

    def own_clients(self, sim) -> Tensor:
        """The ids of the clients this rank owns (ascending, on the CPU)."""
        return torch.nonzero(self._owners(sim) == self.rank).flatten()

    def sync_rows(self, sim) -> None:
        """Gather to every rank the state rows of the clients trained since the last gathering (each from the rank
        that owns it), so every rank holds every client's current rows."""
        owner, dirty_mask = self._owners_dirty(sim)
        dirty = torch.nonzero(dirty_mask).flatten()
        if dirty.numel() == 0:
            return
        fixed = set(sim.clients.readonly())
        first = {k: v for k, v in sim.clients.gather(dirty[:1].to(sim.device)).items() if k not in fixed}
        per_rank = [dirty[owner[dirty] == r] for r in range(self.world)]
        counts = [int(p.numel()) for p in per_rank]
        mine = per_rank[self.rank]
        local = (
            {k: v for k, v in sim.clients.gather(mine.to(sim.device)).items() if k not in fixed}
            if counts[self.rank]
            else None
        )
        parts = all_gather_rows(local, counts, _schema(first), self.comm_device, self.group)
        for r, part in enumerate(parts):
            if r != self.rank and counts[r]:
                sim.clients.scatter(per_rank[r].to(sim.device), {k: v.to(sim.device) for k, v in part.items()})
        dirty_mask.zero_()

    # ---------------------------------------------------------------- the transport
    def train(self, sim, t, ids, msgs, scale):
        """This rank's selected clients on its executor, then every selected client's upload and loss on every
        rank, in the order of ``ids``."""
        owner, dirty_mask = self._owners_dirty(sim)
        cpu_ids = ids.cpu()
        n = cpu_ids.numel()
        where = owner[cpu_ids]
        positions = [torch.nonzero(where == r).flatten() for r in range(self.world)]
        counts = [int(p.numel()) for p in positions]
        local = None
        if counts[self.rank]:
            pos = positions[self.rank]
            dpos = pos.to(ids.device)
            _, uploads, losses = self._local.train(
                sim, t, ids[dpos], {k: v[dpos] for k, v in msgs.items()}, None if scale is None else scale[pos]
            )
            local = {**uploads, _LOSS: losses.reshape(-1)}
        schema = _schema(local) if local is not None else None
        if min(counts) == 0:  # a rank without clients this round learns the uploads' shapes from one with some
            src = counts.index(next(c for c in counts if c))
            box = [schema]
            dist.broadcast_object_list(
                box, src=dist.get_global_rank(self.group, src) if self.group else src, group=self.group
            )
            schema = box[0]
        if schema is None:
            raise DistributedError("--distributed: no rank trained a client this round, so no upload shapes")
        parts = all_gather_rows(local, counts, schema, self.comm_device, self.group)
        full = {k: torch.empty((n, *shape), dtype=dt, device=sim.device) for k, (shape, dt) in schema.items()}
        for r, part in enumerate(parts):
            if counts[r]:
                p = positions[r].to(sim.device)
                for k, v in part.items():
                    full[k][p] = v.to(sim.device)
        dirty_mask[cpu_ids] = True
        losses = full.pop(_LOSS)
        return None, full, losses

    def score(self, sim, round_):
        """Every rank's rows brought up to date (:meth:`sync_rows`), this rank's clients scored, the per-client
        metrics of all clients gathered in client order (the blocks of :func:`shard_clients` are in id order)."""
        self.sync_rows(sim)
        params = sim.eval_params(round_)
        mine = self.own_clients(sim).tolist()
        per = (
            evaluate(
                sim.problem, params, sim.vectorized_eval, tuple(sim.cfg.metrics), ids=mine, buffers=sim.eval_buffers()
            )[1]
            if mine
            else []
        )
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, per, group=self.group)
        return [row for part in every for row in part], {}


class CheckpointSync:
    """Callback on every rank (added by :meth:`DistributedTransport.start` when ``simulation.checkpoint_every`` is
    set and a rank writes checkpoints): before a round's checkpoint, the rows of every client gathered to every
    rank (:meth:`DistributedTransport.sync_rows`), so rank 0's checkpoint holds the whole run. Checkpoints at
    evaluations need nothing more: the evaluation gathered the rows."""

    def __init__(self, transport: DistributedTransport):
        self.transport = transport

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        if (round_ + 1) % sim.cfg.checkpoint_every == 0:
            self.transport.sync_rows(sim)

    def on_eval(self, sim, record):
        pass

    def on_end(self, sim):
        pass
