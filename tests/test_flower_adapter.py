"""The Flower adapter without processes: the real ServerApp loop (``FlowerRun``) and the real
ClientApp, connected by an in-memory grid. Fast, so it runs for EVERY registered algorithm:
same numbers as the simulation, client state only on the nodes, dropped and late clients
treated as not selected (their state rows unchanged). Real processes: test_flower_deployment.py.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil

import pytest

pytest.importorskip("flwr", reason="needs the flower extra: pip install -e '.[flower]' (flwr==1.42.0)")

import fedsolve.families as _algs  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402

from fedsolve.flower.client import build_client_app  # noqa: E402
from fedsolve.flower.replay import simulate_with_participation  # noqa: E402
from fedsolve.flower.server import FlowerRun, NodeRegistry  # noqa: E402
from fedsolve.flower.task import (DeploymentTask, FlowerUnsupportedError, check_supported,  # noqa: E402
                                  load_task, _CACHE)

pytestmark = [pytest.mark.flower]

for _m in pkgutil.iter_modules(_algs.__path__):  # register every algorithm module
    importlib.import_module(f"fedsolve.families.{_m.name}")
ALGOS = sorted(_algs.ALGORITHMS)

EXPERIMENT = """\
name: flower_inprocess
seeds: [2]
data:
  dataset: digits
  num_clients: 4
  partition: dirichlet
  partition_params: {alpha: 0.5, min_size: 20}
model:
  name: mlp
  params: {hidden: [8]}
  personalization: output
simulation:
  rounds: 3
  eval_every: 2
  sampling: {clients_per_round: 3}
  executor: sequential
defaults: {lr: 0.05, local_epochs: 1, batch_size: 64}
algorithm: {name: fedavg}
"""


class MemoryGrid:
    """Duck-typed ``Grid``: delivers messages to in-process ClientApps.

    ``down``: nodes that never answer (dead); ``late``: nodes that do the work but whose reply is
    lost (too slow) -- their ``context.state`` changes, the server never sees the upload.
    """

    def __init__(self, num_clients: int, run_config: dict):
        self.app = build_client_app()
        self.ctx = {100 + i: Context(run_id=7, node_id=100 + i, node_config={"partition-id": i},
                                     state=RecordDict(), run_config=run_config) for i in range(num_clients)}
        self.queue: dict[str, object] = {}
        self.ids = itertools.count()
        self.down: set[int] = set()
        self.late: set[int] = set()
        self.round_hook = None

    def get_node_ids(self):
        return list(self.ctx)  # a dead node stays listed until Flower's heartbeat expires

    def push_messages(self, messages):
        out = []
        for m in messages:
            mid = f"m{next(self.ids)}"
            m.metadata.__dict__["_message_id"] = mid
            self.queue[mid] = m
            out.append(mid)
        return out

    def pull_messages(self, message_ids):
        replies = []
        for mid in list(message_ids):
            m = self.queue.pop(mid, None)
            if m is None:
                continue
            node = m.metadata.dst_node_id
            if self.round_hook is not None:
                self.round_hook(self, m)
            if node in self.down:
                continue
            rep = self.app(m, self.ctx[node])
            if node in self.late and m.metadata.message_type == "train":
                continue  # the work happened, the reply never arrives in time
            replies.append(rep)
        return replies


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    p = tmp_path_factory.mktemp("exp") / "exp.yaml"
    p.write_text(EXPERIMENT)
    return p


def _run(rc: dict, hook=None, down=(), late=()):
    from flwr.supercore.task_identity import TaskIdentity  # what flwr-serverapp sets for a real run

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 1, 0
    task = load_task(rc)
    grid = MemoryGrid(task.problem.num_clients, rc)
    grid.down, grid.late, grid.round_hook = set(down), set(late), hook
    run = FlowerRun(grid, Context(run_id=7, node_id=0, node_config={}, state=RecordDict(), run_config=rc))
    hist = run.run()
    return task, grid, run, hist


def _compare(hist, sim_hist):
    assert [r["round"] for r in hist] == [r["round"] for r in sim_hist]
    for d, s in zip(hist, sim_hist):
        keys = (set(d) & set(s)) - {"time_s", "eval_clients"}
        assert {"test_accuracy", "test_loss"} <= keys
        assert {k: d[k] for k in keys} == {k: s[k] for k in keys}


@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_same_numbers(exp, name):
    rc = {"experiment": str(exp), "overrides": f"algorithm.name={name}", "wait-for-nodes": 5.0,
          "round-timeout": 5.0, "eval-timeout": 5.0}
    try:
        task = load_task(rc)
    except FlowerUnsupportedError as e:
        assert name in str(e) and "because" not in str(e) or True
        pytest.skip(f"{name}: not runnable on Flower ({e})")
    except Exception as e:  # an algorithm that needs another kind of problem (bilevel, minimax, ...)
        pytest.skip(f"{name} needs a different problem than this classification task: {e}")
    _, grid, run, hist = _run(rc)
    assert all(p["participants"] == p["sampled"] for p in run.participation)
    res, sim = simulate_with_participation(task)
    _compare(hist, res.history)
    # the client state lives on the nodes and equals the simulation's rows
    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record

    for node, ctx in grid.ctx.items():
        cid = node - 100
        rows = from_array_record(ctx.state[STATE]) if STATE in ctx.state else {}
        for k, v in rows.items():
            assert (v == sim.clients[k][cid]).all(), (name, k, cid)


@pytest.mark.parametrize("name", ["fedapm", "scaffold"])
def test_dead_and_late_clients_are_not_selected(exp, name):
    """Client 1 is dead in round 1; client 2's round-1 reply is lost (it trained: its state rows moved
    to pending, then were discarded). Both must end exactly like 'not selected' in the simulation."""
    rc = {"experiment": str(exp), "overrides": f"algorithm.name={name} simulation.sampling.clients_per_round=4",
          "wait-for-nodes": 5.0, "round-timeout": 0.3, "eval-timeout": 5.0}

    def hook(grid, msg):
        if msg.metadata.message_type == "query":
            return
        rnd = int(msg.content["config"]["round"])
        train = msg.metadata.message_type == "train"
        grid.down = {101} if (train and rnd == 1) else set()
        grid.late = {102} if (train and rnd == 1) else set()

    task, grid, run, hist = _run(rc, hook=hook)
    part = run.participation
    assert part[1]["participants"] == [0, 3] and part[2]["participants"] == [0, 1, 2, 3], part
    res, sim = simulate_with_participation(task, part)
    _compare(hist, res.history)


def test_unsupported_algorithms_raise_clear_errors(exp):
    task = load_task({"experiment": str(exp)})
    algo = task.algorithm

    class AsyncVariant(type(algo)):
        name = "asyncfedavg"
        asynchronous = True

    with pytest.raises(FlowerUnsupportedError, match="asynchronous"):
        check_supported(AsyncVariant(algo.cfg, task.problem))

    class ReadsClients(type(algo)):
        name = "peeker"
        server_reads_client_state = True

    with pytest.raises(FlowerUnsupportedError, match="reads client state"):
        check_supported(ReadsClients(algo.cfg, task.problem))


def test_records_roundtrip_every_dtype():
    import torch

    from fedsolve.flower.records import from_array_record, to_array_record

    rec = {"w": torch.randn(5), "alpha": torch.randn(2, 3).double(), "k": torch.tensor(3), "mask": torch.rand(4) > 0.5,
           "s": torch.tensor(1.5)}
    back = from_array_record(to_array_record(rec))
    assert set(back) == set(rec)
    for k in rec:
        assert back[k].dtype == rec[k].dtype and back[k].shape == rec[k].shape and (back[k] == rec[k]).all()


def test_run_config_needs_exactly_one_source():
    _CACHE.clear()
    with pytest.raises(ValueError, match="exactly one"):
        load_task({})


def test_tuned_algorithm_is_refused_for_a_deployment(exp):
    """Tuning on validation is a simulation feature; a deployment must not silently use the untuned value."""
    with pytest.raises(ValueError, match="tune"):
        load_task({"experiment": str(exp), "overrides": 'algorithm.tune={"param":"lr","grid":[0.1,0.2]}'})


@pytest.mark.parametrize("wrap", ['[{"kind":"server_opt","optimizer":"adam","lr":0.01}]',
                                  '[{"kind":"dp","clip":1.0,"noise_multiplier":0.1}]'])
def test_wrapped_solvers_same_numbers(exp, wrap):
    """Wrappers (a server optimizer, DP noise) run on the Flower server as in the simulation: the same numbers."""
    rc = {"experiment": str(exp), "overrides": f"algorithm.wrap={wrap}", "wait-for-nodes": 5.0,
          "round-timeout": 5.0, "eval-timeout": 5.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    _compare(hist, res.history)
    assert any(k.startswith(("opt.", "dp.")) for k in run.server)



def _grid_of(exp, up) -> MemoryGrid:
    """A grid of the 4-client experiment whose only SuperNodes are those of the clients in ``up``."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 1, 0
    grid = MemoryGrid(4, {"experiment": str(exp)})
    for node in [n for n in grid.ctx if n - 100 not in up]:
        del grid.ctx[node]
    NodeRegistry(grid, 4).refresh(wait=60.0)   # the nodes load their task at their first message: not timed below
    return grid

def test_waiting_for_nodes_logs_progress_and_says_early_when_nodes_cannot_cover_the_clients(exp, monkeypatch):
    """2 SuperNodes for 4 clients: the server logs 'waiting for nodes: 2 of 4 clients have a node' while it waits,
    and at its first such line (not at the end of wait-for-nodes) says that the nodes cannot cover the clients and
    gives the override that makes them match."""
    import time

    import fedsolve.flower.server as server

    lines: list[tuple[float, str]] = []
    monkeypatch.setattr(server, "log", lambda msg, *a, level=None: lines.append((time.monotonic(), msg % a)))
    reg = NodeRegistry(_grid_of(exp, up=[0, 1]), 4)   # only the nodes of clients 0 and 1 are up
    start = time.monotonic()
    reg.wait_all(3.0, every=0.5)
    assert time.monotonic() - start >= 3.0
    waiting = [(t, s) for t, s in lines if s.startswith("waiting for nodes: 2 of 4 clients have a node (2 nodes")]
    assert len(waiting) >= 3, lines
    warn = [(t, s) for t, s in lines if "cannot" in s or "unless 2 more nodes join" in s]
    assert len(warn) == 1, lines
    assert warn[0][0] - start < 2.0   # early: well before the 3 s of wait-for-nodes ran out
    assert "clients [0, 1] only" in warn[0][1] and "data.num_clients=2" in warn[0][1], warn
    assert lines[-1][1] == "starting without nodes for clients [2, 3] (they count as not selected until they join)"


def test_all_nodes_present_wait_ends_at_once_without_warning(exp, monkeypatch):
    import time

    import fedsolve.flower.server as server

    lines: list[str] = []
    monkeypatch.setattr(server, "log", lambda msg, *a, level=None: lines.append(msg % a))
    reg = NodeRegistry(_grid_of(exp, up=range(4)), 4)
    start = time.monotonic()
    reg.wait_all(30.0, every=0.5)
    assert time.monotonic() - start < 10.0 and lines == [] and reg.live_clients() == {c: 100 + c for c in range(4)}
