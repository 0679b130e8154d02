"""The fedsolve ServerApp: ``Simulation.run_round`` as synchronous Flower rounds.

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
   ``eval_model(its rows, eval_broadcast row)`` on its test split and returns its per-client
   metrics; the server averages them uniformly with ``simulation.metrics.summarize``.

The server never reads client state or client data; it holds the server state, the client
weights (sampling, weighted means) and the run's bookkeeping only.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedsolve.engine.algorithm import eval_phases
from fedsolve.core.comm import CommLedger
from fedsolve.core.rng import RngStreams
from fedsolve.flower.records import from_array_record, row, stack_rows, to_array_record
from fedsolve.flower.rounds import initial_state, plan_shapes, sample_round, weighted_train_loss, work_scales
from fedsolve.flower.task import load_task, run_config_value
from fedsolve.engine.io import atomic_write_text
from fedsolve.engine.loop import check_round, drive_rounds, eval_due
from fedsolve.engine.metrics import summarize

try:  # Flower's logger, so lines show up in `flwr log` / `flwr run --stream`
    from flwr.common.logger import log as _flog
    from logging import INFO, WARNING

    def log(msg: str, *args: Any, level: int = INFO) -> None:
        _flog(level, "[fedsolve] " + msg, *args)
except ImportError:  # pragma: no cover
    import logging

    INFO, WARNING = logging.INFO, logging.WARNING

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
        new = [n for n in self.online if n not in self.client_node.values()
               and now - self.asked.get(n, -1e9) > 60.0]
        msgs = []
        for n in new:
            self.asked[n] = now
            msgs.append(Message(RecordDict({"config": ConfigRecord({"op": "hello"})}), dst_node_id=n,
                                message_type=MessageType.QUERY, ttl=120.0))
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
                cid = int(info["partition-id"])
                if not 0 <= cid < self.m:
                    log("node %s reports partition-id %s outside 0..%s; ignored", node, cid, self.m - 1,
                        level=WARNING)
                    continue
                old = self.client_node.get(cid)
                if old is not None and old != node:
                    log("client %s moved from node %s to node %s (restart)", cid, old, node)
                self.client_node[cid] = node
            if not self.pending or time.monotonic() >= end:
                break
            time.sleep(POLL_S)

    def wait_all(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while True:
            self.refresh(wait=min(5.0, max(0.0, end - time.monotonic())))
            if len(self.live_clients()) == self.m or time.monotonic() >= end:
                break
            time.sleep(0.5)
        missing = sorted(set(range(self.m)) - set(self.live_clients()))
        if missing:
            log("starting without nodes for clients %s (they count as not selected until they join)", missing,
                level=WARNING)

    def live_clients(self) -> dict[int, int]:
        return {c: n for c, n in self.client_node.items() if n in self.online}


class FlowerRun:
    """One fedsolve run driven through a Flower ``Grid``."""

    def __init__(self, grid: Grid, context: Context):
        self.grid = grid
        self.rc = dict(context.run_config)
        rd = str(run_config_value(self.rc, "results-dir"))
        self.out = Path(rd).expanduser() if rd else None
        self.task = None
        self.history: list[dict[str, Any]] = []
        self.participation: list[dict[str, Any]] = []
        self.per_client: dict[int, dict[str, float]] = {}
        self.round_times: list[float] = []
        self.timings: list[dict[str, float]] = []   # {"round", "time_s"} per evaluation (timings.jsonl)
        self.ledger = CommLedger()
        self.registry: NodeRegistry | None = None
        self._first_loss: float | None = None

    def setup(self) -> None:
        torch.set_num_threads(int(run_config_value(self.rc, "threads")))
        self.task = load_task(self.rc, role="server")
        self.algo = self.task.algorithm
        self.cfg = self.task.simulation
        self.problem = self.task.problem
        self.m = self.problem.num_clients
        self.weights = self.problem.data.weights
        self.rngs = RngStreams(self.task.seed)
        self.round_timeout = float(run_config_value(self.rc, "round-timeout"))
        self.eval_timeout = float(run_config_value(self.rc, "eval-timeout"))
        self.server, clients = initial_state(self.problem, self.algo, self.task.seed)
        del clients  # each node rebuilds its own rows; the server keeps no client state
        self.registry = NodeRegistry(self.grid, self.m)
        self.accepted = [-1] * self.m  # last round whose upload of client i was aggregated

    # ---------------------------------------------------------------- messages
    def _config(self, cid: int, round_: int, **extra) -> ConfigRecord:
        return ConfigRecord({"round": int(round_), "client": int(cid), "accepted-round": int(self.accepted[cid]),
                             **extra})

    def _message(self, node: int, kind: str, rec: dict, cfg: ConfigRecord, round_: int, ttl: float) -> Message:
        return Message(RecordDict({"msg": to_array_record(rec), "config": cfg}), dst_node_id=node,
                       message_type=kind, ttl=max(ttl, 30.0), group_id=str(round_))

    @staticmethod
    def _client_of(rep: Message) -> int | None:
        if rep.has_error():
            return None
        try:
            return int(rep.content["info"]["client"])
        except KeyError:
            return None

    # ---------------------------------------------------------------- one round
    def run_round(self, t: int) -> dict[str, Any]:
        self.registry.refresh(wait=2.0)
        live = self.registry.live_clients()
        sampled = sample_round(self.cfg, self.m, self.weights, self.rngs, self.algo.sampling_round(self.server, t))
        scales = work_scales(self.cfg, self.m, self.rngs, t)
        ids = torch.as_tensor([i for i in sampled.tolist() if i in live], dtype=torch.long)
        info: dict[str, Any] = {"round": t, "sampled": sampled.tolist(), "sent": ids.tolist(), "participants": []}
        if ids.numel() == 0:
            self.participation.append(info)
            return {"round": t, "clients": 0, "train_loss": float("nan")}
        msgs = self.algo.broadcast(self.server, ids, t)
        shapes = plan_shapes(self.algo, self.problem.data.train_offsets, ids, self.rngs, t,
                             None if scales is None else scales[ids], groups=self.problem.data.row_groups)
        pad = {f"pad-{p}": [S, B] for p, (S, B) in shapes.items()}
        out = []
        for k, cid in enumerate(ids.tolist()):
            extra = dict(pad) if scales is None else {**pad, "scale": float(scales[cid])}
            out.append(self._message(live[cid], MessageType.TRAIN, row(msgs, k), self._config(cid, t, **extra), t,
                                     2 * self.round_timeout))
        replies = send_and_receive(self.grid, out, self.round_timeout)
        got: dict[int, Message] = {}
        for rep in replies:
            cid = self._client_of(rep)
            if cid is not None and cid in ids.tolist():
                got[cid] = rep
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            log("round %s: %s error replies (treated as not selected): %s", t + 1, len(errors), errors[:3],
                level=WARNING)
        part = sorted(got)
        info["participants"] = part
        self.participation.append(info)
        if len(part) < ids.numel():
            log("round %s: clients %s did not answer within %.0f s; treated as not selected", t + 1,
                sorted(set(ids.tolist()) - set(part)), self.round_timeout, level=WARNING)
        if not part:
            return {"round": t, "clients": 0, "train_loss": float("nan")}
        pid = torch.as_tensor(part, dtype=torch.long)
        uploads = stack_rows([from_array_record(got[c].content["upload"]) for c in part])
        self.server = self.algo.aggregate(self.server, pid, uploads, t)
        for c in part:
            self.accepted[c] = t
        if self.algo.communicates:
            keep = torch.as_tensor([ids.tolist().index(c) for c in part], dtype=torch.long)
            self.ledger.add_round(t, {k: v.index_select(0, keep) for k, v in msgs.items()}, uploads)
        train_loss = None   # an algorithm that minimises no training loss reports none (Algorithm.reports_train_loss)
        if self.algo.reports_train_loss:
            losses = torch.tensor([float(got[c].content["metrics"]["train_loss"]) for c in part], dtype=torch.float64)
            train_loss = weighted_train_loss(losses, self.weights[pid])
        self._first_loss = check_round(t, train_loss, self.server, uploads, self.algo.finite_check_keys,
                                       self._first_loss, self.cfg.divergence_factor,
                                       self.algo.divergence(self.server, self.cfg.divergence_factor))
        return {"round": t, "clients": len(part), "train_loss": float("nan") if train_loss is None else train_loss}

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, done: int, train_loss: float | None) -> dict[str, Any]:
        self.registry.refresh(wait=2.0)
        live = self.registry.live_clients()
        ids = torch.arange(self.m)
        emsg = self.algo.eval_broadcast(self.server, ids)
        phases = eval_phases(self.algo)   # evaluation-time adaptation: plans padded as the simulator's
        shapes = plan_shapes(self.algo, self.problem.data.train_offsets, ids, self.rngs, done, None,
                             phases, self.problem.data.row_groups) if phases else {}
        pad = {f"pad-{p}": [S, B] for p, (S, B) in shapes.items()}
        out = [self._message(live[c], MessageType.EVALUATE, row(emsg, c), self._config(c, done, **pad), done,
                             2 * self.eval_timeout) for c in sorted(live)]
        per: dict[int, dict[str, float]] = {}
        for rep in send_and_receive(self.grid, out, self.eval_timeout):
            cid = self._client_of(rep)
            if cid is not None:
                per[cid] = {k: float(v) for k, v in rep.content["metrics"].items()}
        missing = sorted(set(range(self.m)) - set(per))
        if missing:
            log("evaluation after round %s: no metrics from clients %s", done, missing, level=WARNING)
        self.per_client = per
        rec: dict[str, Any] = {"round": done}
        if train_loss is not None:
            rec["train_loss"] = train_loss
        rec.update(summarize([per[c] for c in sorted(per)], prefix="test_"))
        rec["eval_clients"] = len(per)
        rec["uplink_bytes"] = self.ledger.uplink_bytes
        rec["downlink_bytes"] = self.ledger.downlink_bytes
        # wall-clock time goes to timings.jsonl, as in simulation: metrics.jsonl holds only the run's numbers
        self.timings.append({"round": done, "time_s": time.perf_counter() - self._t0})
        return rec

    # ---------------------------------------------------------------- results
    def _write(self, status: str, message: str = "") -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in self.history))
        atomic_write_text(self.out / "timings.jsonl", "".join(json.dumps(r) + "\n" for r in self.timings))
        atomic_write_text(self.out / "participation.json", json.dumps(self.participation))
        atomic_write_text(self.out / "per_client.json", json.dumps({str(k): v for k, v in self.per_client.items()}))
        if status != "running":
            atomic_write_text(self.out / "summary.json", json.dumps({
                "status": status, "message": message,
                "task": self.task.name if self.task else None, "seed": self.task.seed if self.task else None,
                "algorithm": self.task.algorithm.name if self.task else None,
                "rounds": self.task.simulation.rounds if self.task else None,
                "final": self.history[-1] if self.history else {},
                "communication": self.ledger.state_dict(), "round_times": self.round_times,
                "nodes": {str(c): n for c, n in self.registry.client_node.items()} if self.registry else {},
            }, indent=2))

    def _timed_round(self, t: int) -> dict[str, Any]:
        t1 = time.perf_counter()
        info = self.run_round(t)
        self.round_times.append(time.perf_counter() - t1)
        return info

    def _after_round(self, done: int, last_loss: float | None, info: dict[str, Any]) -> None:
        """After ``done`` rounds: log, evaluate when due (the simulator's cadence), write the run's files."""
        # algorithms that minimise no training loss (Prox-AL, cProx-AL) log none
        loss = f", train loss {info['train_loss']}" if self.algo.reports_train_loss else ""
        log("round %s/%s: %s participants%s", done, self.cfg.rounds, info["clients"], loss)
        if eval_due(done, self.cfg, info["finished"]):
            rec = self.evaluate(done, last_loss)
            self.history.append(rec)
            log("eval round %s: %s", done, {k: round(v, 4) for k, v in rec.items()
                                             if k.startswith("test_") and not k.endswith(("_std", "_worst10"))})
        self._write("running")

    def run(self) -> list[dict[str, Any]]:
        self._t0 = time.perf_counter()
        try:
            self.setup()
            log("task %s: %s clients, %s rounds, seed %s", self.task.name, self.m, self.cfg.rounds, self.task.seed)
            self.registry.wait_all(float(run_config_value(self.rc, "wait-for-nodes")))
            rec0 = self.evaluate(0, None)
            if math.isfinite(rec0.get("test_loss", float("nan"))):   # the reference for "exploding", as Simulation
                self._first_loss = max(abs(rec0["test_loss"]), 1e-8)
            self.history.append(rec0)
            self._write("running")
            drive_rounds(0, self.cfg.rounds, self._timed_round, self._after_round,
                         finished=lambda: self.algo.finished(self.server))
        except BaseException as e:
            self._write("failed", f"{type(e).__name__}: {e}")
            raise
        self._write("completed")
        return self.history


def build_server_app() -> ServerApp:
    """A Flower ``ServerApp`` running the fedsolve task named in the run config."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        FlowerRun(grid, context).run()

    return app
