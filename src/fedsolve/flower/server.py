"""The fedsolve ServerApp: the engine's round body (``Simulation.run_round``) with the Flower grid as its transport.

Per round ``t`` (same order as the simulator):

1. refresh which node holds which client (new nodes answer a ``query`` message with their
   ``partition-id``; a restarted node replaces the old node of its client);
2. ``ids = sample_clients(cfg.sampling, m, weights, rngs.numpy("sampling", t))`` -- the very
   draw of the simulation; sampled clients without a live node are treated as not selected;
3. ``msg = algorithm.broadcast(server, ids, t)``; row ``k`` goes to client ``ids[k]`` as one
   ``ArrayRecord`` (every tensor of the record) plus a ``ConfigRecord`` (round, client id,
   work fraction, last accepted round);
4. replies that arrive within ``round-timeout`` are the round's participants; a node that
   died or is too slow is treated as NOT SELECTED: its upload is ignored and its state rows
   are not committed (the next message tells its node which round was accepted, and the node
   then commits or discards the pending rows -- FedAPM's invariance rule);
5. ``server = algorithm.aggregate(server, participants, stacked uploads, t)``;
6. every ``eval_every`` rounds (and at 0 and the end), each node scores
   ``eval_model(its rows, its row of broadcast(server, ids, None))`` on its test split and returns its per-client
   metrics; the server averages them uniformly with ``simulation.metrics.summarize``.

The server never reads client state or client data; it holds the server state, the client
weights (sampling, weighted means) and the run's bookkeeping only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedsolve.engine.io import atomic_write_text
from fedsolve.engine.loop import Callback, JsonlLogger, Simulation
from fedsolve.engine.transport import Transport
from fedsolve.flower.records import from_array_record, row, stack_rows, to_array_record
from fedsolve.flower.rounds import plan_shapes
from fedsolve.flower.task import DeploymentTask, app_threads, load_task, run_config_value

try:  # Flower's logger, so lines show up in `flwr log` / `flwr run --stream`
    from flwr.common.logger import log as _flog

    def log(msg: str, *args: Any, level: int = INFO) -> None:
        _flog(level, "[fedsolve] " + msg, *args)
except ImportError:  # pragma: no cover
    import logging

    def log(msg: str, *args: Any, level: int = INFO) -> None:
        logging.getLogger("fedsolve.flower").log(level, msg, *args)


#: How often the server polls the SuperLink for replies (Flower's own helper sleeps 3 s).
POLL_S = 0.2


def send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull replies until all arrived or ``timeout`` seconds passed."""
    if not messages:
        return []
    ids = set(grid.push_messages(messages))
    out: list[Message] = []
    end = time.monotonic() + timeout
    while ids:
        got = list(grid.pull_messages(ids))
        out.extend(got)
        ids.difference_update(m.metadata.reply_to_message_id for m in got)
        if not ids or time.monotonic() >= end:
            break
        time.sleep(POLL_S)
    return out


class NodeRegistry:
    """Which Flower node holds which fedsolve client (learned with ``query`` messages)."""

    def __init__(self, grid: Grid, num_clients: int):
        self.grid = grid
        self.m = num_clients
        self.client_node: dict[int, int] = {}
        self.asked: dict[int, float] = {}  # node id -> time of the last query
        self.pending: dict[str, int] = {}  # query message id -> node id
        self.online: set[int] = set()

    def refresh(self, wait: float = 0.0) -> None:
        """Ask new nodes for their partition; collect answers for up to ``wait`` seconds."""
        self.online = set(int(n) for n in self.grid.get_node_ids())
        now = time.monotonic()
        new = [n for n in self.online if n not in self.client_node.values() and now - self.asked.get(n, -1e9) > 60.0]
        msgs = []
        for n in new:
            self.asked[n] = now
            msgs.append(
                Message(
                    RecordDict({"config": ConfigRecord({"op": "hello"})}),
                    dst_node_id=n,
                    message_type=MessageType.QUERY,
                    ttl=120.0,
                )
            )
        if msgs:
            for mid, msg in zip(self.grid.push_messages(msgs), msgs):
                self.pending[mid] = msg.metadata.dst_node_id
        end = time.monotonic() + wait
        while self.pending:
            for rep in self.grid.pull_messages(list(self.pending)):
                node = self.pending.pop(rep.metadata.reply_to_message_id, None)
                if node is None or rep.has_error():
                    continue
                info = rep.content["info"]
                cid = int(cast(int, info["partition-id"]))  # the ClientApp's query answer (flower/client.py)
                if not 0 <= cid < self.m:
                    log("node %s reports partition-id %s outside 0..%s; ignored", node, cid, self.m - 1, level=WARNING)
                    continue
                old = self.client_node.get(cid)
                if old is not None and old != node:
                    log("client %s moved from node %s to node %s (restart)", cid, old, node)
                self.client_node[cid] = node
            if not self.pending or time.monotonic() >= end:
                break
            time.sleep(POLL_S)

    def wait_all(self, timeout: float, every: float = 10.0) -> None:
        """Wait up to ``timeout`` seconds (run-config ``wait-for-nodes``) until every client has a live node,
        logging every ``every`` seconds how many have one. At the first such line where every connected node has
        answered and there are fewer nodes than clients, say that the nodes cannot cover the clients and how to
        make them match (each SuperNode holds one client)."""
        start = time.monotonic()
        end, tick, warned = start + timeout, start + every, False
        while True:
            self.refresh(wait=min(5.0, max(0.0, end - time.monotonic())))
            now = time.monotonic()
            if len(self.live_clients()) == self.m or now >= end:
                break
            if now >= tick:
                tick = now + every
                log(
                    "waiting for nodes: %s of %s clients have a node (%s nodes connected; %.0f s of wait-for-nodes "
                    "left)",
                    len(self.live_clients()),
                    self.m,
                    len(self.online),
                    end - now,
                )
                if not warned and not self.pending and len(self.online) < self.m:
                    warned = True
                    log(
                        "%s SuperNodes are connected for %s clients (data.num_clients) and each node holds one "
                        "client: unless %s more nodes join, the run starts after wait-for-nodes with clients %s "
                        "only. Start one SuperNode per client (partition-id 0..%s), or make the clients match the "
                        "nodes: add data.num_clients=%s to the run config's overrides (flwr run APP FEDERATION "
                        "--run-config 'overrides=\"data.num_clients=%s\"')",
                        len(self.online),
                        self.m,
                        self.m - len(self.online),
                        sorted(self.live_clients()),
                        self.m - 1,
                        len(self.online),
                        len(self.online),
                        level=WARNING,
                    )
            time.sleep(0.5)
        missing = sorted(set(range(self.m)) - set(self.live_clients()))
        if missing:
            log(
                "starting without nodes for clients %s (they count as not selected until they join)",
                missing,
                level=WARNING,
            )

    def live_clients(self) -> dict[int, int]:
        return {c: n for c, n in self.client_node.items() if n in self.online}


class GridTransport(Transport):
    """The clients on Flower SuperNodes (module docstring): the engine's round body and evaluator run here on the
    server; each selected client's message goes to its node, which keeps the client's state and data."""

    holds_clients = False
    name = "flower"

    def __init__(self, grid: Grid, rc: dict[str, Any], m: int):
        self.grid = grid
        self.registry = NodeRegistry(grid, m)
        self.round_timeout = float(run_config_value(rc, "round-timeout"))
        self.eval_timeout = float(run_config_value(rc, "eval-timeout"))
        self.wait_for_nodes = float(run_config_value(rc, "wait-for-nodes"))
        self.accepted = [-1] * m  # last round whose upload of client i was aggregated
        self.participation: list[dict[str, Any]] = []
        self._sampled: list[int] = []

    def start(self, sim) -> None:
        self.registry.wait_all(self.wait_for_nodes)

    # ---------------------------------------------------------------- messages
    def _config(self, cid: int, round_: int, **extra) -> ConfigRecord:
        return ConfigRecord(
            {"round": int(round_), "client": int(cid), "accepted-round": int(self.accepted[cid]), **extra}
        )

    def _message(self, node: int, kind: str, rec: dict, cfg: ConfigRecord, round_: int, ttl: float) -> Message:
        return Message(
            RecordDict({"msg": to_array_record(rec), "config": cfg}),
            dst_node_id=node,
            message_type=kind,
            ttl=max(ttl, 30.0),
            group_id=str(round_),
        )

    @staticmethod
    def _client_of(rep: Message) -> int | None:
        if rep.has_error():
            return None
        try:
            return int(cast(Mapping[str, int], rep.content["info"])["client"])  # the ClientApp's _info record
        except KeyError:
            return None

    # ---------------------------------------------------------------- the transport
    def participants(self, sim, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The sampled clients with a live node (the others count as not selected)."""
        self.registry.refresh(wait=2.0)
        live = self.registry.live_clients()
        self._sampled = ids.tolist()
        sent = [i for i in self._sampled if i in live]
        if not sent:
            self.participation.append({"round": t, "sampled": self._sampled, "sent": [], "participants": []})
        return torch.as_tensor(sent, dtype=torch.long)

    def train(self, sim, t, ids, msgs, scale):
        live = self.registry.live_clients()
        data = sim.problem.data
        shapes = plan_shapes(sim.algo, data.train_offsets, ids.cpu(), sim.rngs, t, scale, groups=data.row_groups)
        pad = {f"pad-{p}": [S, B] for p, (S, B) in shapes.items()}
        sent = ids.tolist()
        out = []
        for k, cid in enumerate(sent):
            extra = dict(pad) if scale is None else {**pad, "scale": float(scale[k])}
            out.append(
                self._message(
                    live[cid], MessageType.TRAIN, row(msgs, k), self._config(cid, t, **extra), t, 2 * self.round_timeout
                )
            )
        replies = send_and_receive(self.grid, out, self.round_timeout)
        got: dict[int, Message] = {}
        for rep in replies:
            cid = self._client_of(rep)
            if cid is not None and cid in sent:
                got[cid] = rep
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            log(
                "round %s: %s error replies (treated as not selected): %s",
                t + 1,
                len(errors),
                errors[:3],
                level=WARNING,
            )
        part = sorted(got)
        self.participation.append({"round": t, "sampled": self._sampled, "sent": sent, "participants": part})
        if len(part) < len(sent):
            log(
                "round %s: clients %s did not answer within %.0f s; treated as not selected",
                t + 1,
                sorted(set(sent) - set(part)),
                self.round_timeout,
                level=WARNING,
            )
        for c in part:
            self.accepted[c] = t
        answered = torch.as_tensor([sent.index(c) for c in part], dtype=torch.long)
        uploads = (
            stack_rows([from_array_record(cast(ArrayRecord, got[c].content["upload"])) for c in part]) if part else {}
        )
        metrics = [cast(Mapping[str, float], got[c].content["metrics"]) for c in part]  # {"train_loss": float}
        losses = torch.tensor([float(mr.get("train_loss", float("nan"))) for mr in metrics], dtype=torch.float64)
        return answered, uploads, losses

    def score(self, sim, round_):
        self.registry.refresh(wait=2.0)
        live = self.registry.live_clients()
        m = sim.problem.num_clients
        ids = torch.arange(m)
        emsg = sim.algo.broadcast(sim.server, ids, None)
        phases = sim.algo.work(None)  # evaluation-time adaptation: plans padded as the simulator's
        shapes = (
            plan_shapes(
                sim.algo,
                sim.problem.data.train_offsets,
                ids,
                sim.rngs,
                round_,
                None,
                phases,
                sim.problem.data.row_groups,
            )
            if phases
            else {}
        )
        pad = {f"pad-{p}": [S, B] for p, (S, B) in shapes.items()}
        out = [
            self._message(
                live[c],
                MessageType.EVALUATE,
                row(emsg, c),
                self._config(c, round_, **pad),
                round_,
                2 * self.eval_timeout,
            )
            for c in sorted(live)
        ]
        per: dict[int, dict[str, float]] = {}
        for rep in send_and_receive(self.grid, out, self.eval_timeout):
            cid = self._client_of(rep)
            if cid is not None:
                # the ClientApp's evaluation metrics: {name: float}
                per[cid] = {k: float(v) for k, v in cast(Mapping[str, float], rep.content["metrics"]).items()}
        missing = sorted(set(range(m)) - set(per))
        if missing:
            log("evaluation after round %s: no metrics from clients %s", round_, missing, level=WARNING)
        self.per_client = per
        return [per[c] for c in sorted(per)], {"eval_clients": len(per)}


class FlowerRun:
    """One fedsolve run driven through a Flower ``Grid``: the engine's :class:`~fedsolve.engine.Simulation` (its
    round body, evaluator, checks and callbacks) with the :class:`GridTransport`; the server writes the run's files
    under ``results-dir`` (metrics.jsonl and timings.jsonl as a simulation does, participation.json,
    per_client.json and summary.json)."""

    def __init__(self, grid: Grid, context: Context):
        self.grid = grid
        self.rc = dict(context.run_config)
        rd = str(run_config_value(self.rc, "results-dir"))
        self.out = Path(rd).expanduser() if rd else None
        self.task: DeploymentTask | None = None
        self.sim: Simulation | None = None
        self.transport: GridTransport | None = None

    @property
    def participation(self) -> list[dict[str, Any]]:
        return self.transport.participation if self.transport else []

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.sim.history if self.sim else []

    @property
    def server(self) -> dict[str, torch.Tensor]:
        """The server state (the simulation's, on the server)."""
        assert self.sim is not None, "the server state exists once setup() has built the simulation"
        return self.sim.server

    def setup(self) -> None:
        self.task = load_task(self.rc, role="server")
        torch.set_num_threads(app_threads(self.rc, self.task))
        problem = self.task.problem
        self.transport = GridTransport(self.grid, self.rc, problem.num_clients)
        callbacks: list[Callback] = [_Log(self.task.simulation), _Files(self)]
        if self.out is not None:
            callbacks.insert(0, JsonlLogger(self.out / "metrics.jsonl", self.out / "timings.jsonl"))
        self.sim = Simulation(
            problem,
            self.task.algorithm,
            self.task.simulation,
            self.task.seed,
            callbacks=callbacks,
            transport=self.transport,
        )

    def _write(self, status: str, message: str = "") -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        t = self.transport
        atomic_write_text(self.out / "participation.json", json.dumps(self.participation))
        per = t.per_client if t is not None and hasattr(t, "per_client") else {}
        atomic_write_text(self.out / "per_client.json", json.dumps({str(k): v for k, v in per.items()}))
        if status != "running":
            sim, task = self.sim, self.task
            atomic_write_text(
                self.out / "summary.json",
                json.dumps(
                    {
                        "status": status,
                        "message": message,
                        "task": task.name if task else None,
                        "seed": task.seed if task else None,
                        "algorithm": task.algorithm.name if task else None,
                        "rounds": task.simulation.rounds if task else None,
                        "final": self.history[-1] if self.history else {},
                        "communication": sim.ledger.state_dict() if sim else {},
                        "round_times": sim.round_times if sim else [],
                        "nodes": {str(c): n for c, n in t.registry.client_node.items()} if t else {},
                    },
                    indent=2,
                ),
            )

    def run(self) -> list[dict[str, Any]]:
        try:
            self.setup()
            assert self.task is not None and self.sim is not None, "setup() sets them"
            log(
                "task %s: %s clients, %s rounds, seed %s",
                self.task.name,
                self.task.problem.num_clients,
                self.task.simulation.rounds,
                self.task.seed,
            )
            self.sim.run()
        except BaseException as e:
            self._write("failed", f"{type(e).__name__}: {e}")
            raise
        self._write("completed")
        return self.history


class _Log:
    """Callback: the server's log lines, a line per round and per evaluation."""

    def __init__(self, cfg):
        self.cfg = cfg

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        loss = f", train loss {info['train_loss']}" if sim.algo.reports_train_loss else ""
        log("round %s/%s: %s participants%s", round_ + 1, self.cfg.rounds, info["clients"], loss)

    def on_eval(self, sim, record):
        log(
            "eval round %s: %s",
            record["round"],
            {
                k: round(v, 4)
                for k, v in record.items()
                if k.startswith("test_") and not k.endswith(("_std", "_worst10"))
            },
        )

    def on_end(self, sim):
        pass


class _Files:
    """Callback: participation.json after every round (who took part is known as soon as a round ends, and a
    watcher of the deployment reads it there), per_client.json with it after every evaluation."""

    def __init__(self, run: FlowerRun):
        self.run = run

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        if self.run.out is not None:
            self.run.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run.out / "participation.json", json.dumps(self.run.participation))

    def on_eval(self, sim, record):
        self.run._write("running")

    def on_end(self, sim):
        pass


def build_server_app() -> ServerApp:
    """A Flower ``ServerApp`` running the fedsolve task named in the run config."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        FlowerRun(grid, context).run()

    return app
