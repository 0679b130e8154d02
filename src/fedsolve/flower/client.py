"""The fedsolve ClientApp: one node = one fedsolve client (its ``partition-id``).

The node keeps its client's state rows (duals, personal blocks, control variates, ...) in
``context.state`` -- never on the server -- as two ``ArrayRecord`` s:

* ``fedsolve-state``: the committed rows;
* ``fedsolve-pending``: the rows produced by the last ``local_update``, committed only once
  the server says it aggregated that round's upload (``accepted-round`` in the next message).
  A round the server gave up on (node too slow, reply lost) is thus discarded, and the client
  keeps its state exactly as if it had not been selected (FedAPM's invariance rule).

With ``state-dir`` in the node config, the same records are also written to disk after each
message (atomically), so a restarted SuperNode resumes its client's state.

Node config: ``partition-id`` (required, the fedsolve client id), ``state-dir`` (optional),
``num-partitions`` (optional check against the task's number of clients).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsolve.core.rng import RngStreams
from fedsolve.engine.buffers import scored_buffers
from fedsolve.flower.records import from_array_record, to_array_record
from fedsolve.flower.rounds import client_adapt, client_eval_metrics, client_eval_params, client_update, initial_state
from fedsolve.flower.task import DeploymentTask, app_threads, load_task

META, STATE, PENDING = "fedsolve-meta", "fedsolve-state", "fedsolve-pending"


def partition_id(context: Context, task: DeploymentTask) -> int:
    nc = context.node_config
    if "partition-id" not in nc:
        raise ValueError(
            "node config: `partition-id` is required (start the SuperNode with "
            "--node-config 'partition-id=<client id>')"
        )
    cid = int(nc["partition-id"])
    m = task.problem.num_clients
    if not 0 <= cid < m:
        raise ValueError(f"node config: partition-id={cid} is outside 0..{m - 1} (the task has {m} clients)")
    if "num-partitions" in nc and int(nc["num-partitions"]) != m:
        raise ValueError(f"node config: num-partitions={nc['num-partitions']} but the task has {m} clients")
    return cid


class ClientStore:
    """This node's client state: committed rows + pending rows, in ``context.state`` (and on disk)."""

    def __init__(self, context: Context, task: DeploymentTask, cid: int):
        self.context, self.task, self.cid = context, task, cid
        sd = context.node_config.get("state-dir")
        self.path = (Path(str(sd)).expanduser() / f"run{context.run_id}-client{cid}.pt") if sd else None
        st = context.state
        if META in st:
            meta = cast(Mapping[str, int], st[META])  # save()'s ConfigRecord of ints
            if int(meta["client"]) != cid:
                raise ValueError(f"context.state holds client {meta['client']}, node config says {cid}")
            self.pending_round = int(meta["pending-round"])
            self.state = from_array_record(cast(ArrayRecord, st[STATE])) if STATE in st else {}
            self.pending = from_array_record(cast(ArrayRecord, st[PENDING])) if PENDING in st else {}
        elif self.path is not None and self.path.exists():
            d = torch.load(self.path, weights_only=True)
            self.state, self.pending, self.pending_round = d["state"], d["pending"], int(d["pending_round"])
        else:
            # the same rows Simulation.__init__ gives this client (deterministic from the seed)
            _, clients = initial_state(task.problem, task.algorithm, task.seed)
            self.state = clients.row(cid)
            self.pending, self.pending_round = {}, -1

    def resolve(self, accepted_round: int) -> None:
        """Commit the pending rows if the server aggregated that round, else drop them."""
        if self.pending_round >= 0:
            if self.pending_round == accepted_round:
                self.state = dict(self.pending)  # pending = the full rows after that round's update
            self.pending, self.pending_round = {}, -1

    def set_pending(self, round_: int, rows: dict[str, torch.Tensor]) -> None:
        merged = dict(self.state)
        for k, v in rows.items():
            if k not in self.state:
                raise KeyError(f"local_update returned unknown client state {k!r}; known: {sorted(self.state)}")
            merged[k] = v.detach().to(self.state[k].dtype).clone()
        self.pending, self.pending_round = merged, int(round_)

    def save(self) -> None:
        st = self.context.state
        st[META] = ConfigRecord({"client": self.cid, "pending-round": self.pending_round})
        st[STATE] = to_array_record(self.state)
        st[PENDING] = to_array_record(self.pending)
        if self.path is not None:
            from fedsolve.engine.io import atomic_torch_save

            atomic_torch_save(
                {"state": self.state, "pending": self.pending, "pending_round": self.pending_round}, self.path
            )


def _setup(msg: Message, context: Context) -> tuple[DeploymentTask, int, ClientStore, Any]:
    task = load_task(context.run_config, role="client")
    torch.set_num_threads(app_threads(context.run_config, task))
    cid = partition_id(context, task)
    cfg = cast(ConfigRecord, msg.content["config"])  # GridTransport._config's record (flower/server.py)
    client = cast(int, cfg["client"])
    if int(client) != cid:
        raise ValueError(f"message for client {client} reached the node of client {cid}")
    store = ClientStore(context, task, cid)
    store.resolve(int(cast(int, cfg["accepted-round"])))
    return task, cid, store, cfg


def _groups(data, cid: int):
    """Client ``cid``'s row groups for ``build_plans`` on its own rows (None without groups)."""
    g = data.client_train_groups(cid)
    return None if g is None else (g, data.group_names)


def _plan_pads(cfg: ConfigRecord) -> dict[str, tuple[int, int]]:
    """The ``pad-<phase>`` entries of a message's config: the simulator's plan shapes per phase (``[S, B]``)."""
    return {
        k[4:]: cast(tuple[int, int], tuple(int(a) for a in cast(list[int], v)))
        for k, v in cfg.items()
        if k.startswith("pad-")
    }


def _info(cid: int, round_: int) -> ConfigRecord:
    return ConfigRecord({"client": cid, "round": int(round_)})


def build_client_app() -> ClientApp:
    """A Flower ``ClientApp`` running the fedsolve task named in the run config on this node's client."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        task = load_task(context.run_config, role="client")
        cid = partition_id(context, task)
        d = task.problem.data
        return Message(
            RecordDict(
                {
                    "info": ConfigRecord(
                        {
                            "partition-id": cid,
                            "n-train": int(d.train_sizes[cid]),
                            "n-test": int(d.test_sizes[cid]),
                            "algorithm": task.algorithm.name,
                        }
                    )
                }
            ),
            reply_to=msg,
        )

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        task, cid, store, cfg = _setup(msg, context)
        t = int(cfg["round"])
        algo, data = task.algorithm, task.problem.data
        x, y = data.client_train(cid)
        scale = float(cfg["scale"]) if "scale" in cfg else None
        pad = _plan_pads(cfg)
        rows, upload, loss = client_update(
            algo,
            cid,
            task.problem.num_clients,
            data.weights[cid],
            x,
            y,
            store.state,
            from_array_record(cast(ArrayRecord, msg.content["msg"])),
            RngStreams(task.seed),
            t,
            scale,
            pad,
            _groups(data, cid),
        )
        store.set_pending(t, rows)
        store.save()
        return Message(
            RecordDict(
                {
                    "upload": to_array_record(upload),
                    "metrics": MetricRecord({"train_loss": float(loss)}),
                    "info": _info(cid, t),
                }
            ),
            reply_to=msg,
        )

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        task, cid, store, cfg = _setup(msg, context)
        store.save()
        eval_msg = from_array_record(cast(ArrayRecord, msg.content["msg"]))
        params = client_eval_params(task.algorithm, store.state, eval_msg)
        data = task.problem.data
        pad = _plan_pads(cfg)
        train_x, train_y = data.client_train(cid)
        params = client_adapt(
            task.algorithm,
            params,
            cid,
            task.problem.num_clients,
            data.weights[cid],
            train_x,
            train_y,
            RngStreams(task.seed),
            int(cfg["round"]),
            pad,
            _groups(data, cid),
        )
        x, y = data.client_test(cid)
        metrics = client_eval_metrics(
            task.problem,
            params,
            x,
            y,
            tuple(task.simulation.metrics),
            scored_buffers(task.algorithm, store.state, eval_msg),
        )
        # flwr's stubs: MetricRecord takes dict[str, <its value union>] (invariant), not a Mapping
        rec = MetricRecord(metrics)  # type: ignore[arg-type]  # a dict[str, float] is a valid metric record
        return Message(RecordDict({"metrics": rec, "info": _info(cid, int(cfg["round"]))}), reply_to=msg)

    return app
