"""Real Flower processes on loopback: one SuperLink + SuperNodes (TLS + SuperNode authentication),
`flwr run` of the fedsolve app, and the numbers compared with the simulation.

Each node holds ONE client (``--node-config 'partition-id=i state-dir=...'``) and loads only that
partition; the ServerApp samples with the simulation's RNG and aggregates with the same Algorithm
object. The run uses the installed environment only: the SuperLink runs with
``--disable-runtime-dependency-installation`` and the app declares no dependencies, so `flwr run`
never calls `uv sync` and nothing is fetched.

Equality is exact (``==`` on every metric): the nodes run ``local_update`` client by client like the
``sequential`` executor, on the same minibatch plans (keyed by round, client id, phase).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

flwr = pytest.importorskip("flwr", reason="needs the flower extra: pip install -e '.[flower]' (flwr==1.42.0)")

from fedsolve.flower.appdir import write_app  # noqa: E402
from fedsolve.flower.launch import LocalFederation, read_history, wait_summary  # noqa: E402
from fedsolve.flower.replay import simulate_with_participation  # noqa: E402
from fedsolve.flower.task import load_task  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]

if shutil.which("flower-superlink") is None and not (Path(__import__("sys").executable).parent /
                                                     "flower-superlink").exists():
    pytest.skip("flower-superlink not found (install fedsolve[flower] in this environment)", allow_module_level=True)

NUM_CLIENTS = 3
EXPERIMENT = """\
name: flower_loopback
seeds: [3]
data:
  dataset: digits          # scikit-learn's bundled digits: no download
  num_clients: 3
  partition: dirichlet
  partition_params: {alpha: 0.5, min_size: 20}
model:
  name: mlp
  params: {hidden: [16]}
  personalization: output  # FedAPM: the head is personal
simulation:
  rounds: 3
  eval_every: 3
  sampling: {clients_per_round: 2}
  executor: sequential
defaults: {lr: 0.05, local_epochs: 1, batch_size: 32}
algorithms:
  - name: fedapm
    params: {lr: 0.5}
  - name: fpfc
    params: {lr: 0.1, local_epochs: 2, lam: 0.3}
  - name: fedavg
  - name: scaffold
"""
#: metrics the ServerApp computes (the simulation adds diagnostics that read client state)
SKIP = {"time_s", "eval_clients"}


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("flower-app")
    exp = base / "loopback.yaml"
    exp.write_text(EXPERIMENT)
    return write_app(base / "app", experiment=exp, threads=1)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = LocalFederation(tmp_path_factory.mktemp("federation"), NUM_CLIENTS, auth=True,
                          env={"OMP_NUM_THREADS": "1", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"})
    try:
        fed.start_superlink()
        fed.register_nodes()
        fed.start_nodes()
        yield fed
    finally:
        fed.close()


def _run(fed: LocalFederation, app: Path, out: Path, cfg: dict, timeout: float = 600) -> tuple[list, list, dict]:
    fed.run_app(app, {**cfg, "results-dir": str(out)})
    summary = wait_summary(out, timeout, fed)
    return read_history(out), json.loads((out / "participation.json").read_text()), summary


def _task(app: Path, cfg: dict):
    return load_task({"experiment": str(app / "loopback.yaml"), **cfg})


def _assert_same(deployed: list[dict], simulated: list[dict], complete_only: bool = False) -> None:
    """Every metric equal; ``complete_only``: skip evaluations some dead node did not answer (their
    uniform mean is over fewer clients than the simulation's)."""
    assert [r["round"] for r in deployed] == [r["round"] for r in simulated]
    assert deployed[-1]["eval_clients"] == NUM_CLIENTS
    for d, s in zip(deployed, simulated):
        if complete_only and d["eval_clients"] < NUM_CLIENTS:
            continue
        keys = (set(d) & set(s)) - SKIP
        assert {"test_accuracy", "test_loss", "uplink_bytes"} <= keys
        assert {k: d[k] for k in keys} == {k: s[k] for k in keys}, f"round {d['round']}"


@pytest.mark.parametrize("algorithm", ["fedapm", "fpfc"])
def test_deployment_matches_simulation(federation, app_dir, tmp_path, algorithm):
    # a generous round timeout: on a loaded 2-core machine a node's reply once missed the default 120 s, and this
    # test is about equal numbers when nobody drops (dropping is tested below)
    hist, part, summary = _run(federation, app_dir, tmp_path / "res", {"algorithm": algorithm, "round-timeout": 600.0})
    assert summary["status"] == "completed" and summary["algorithm"] == algorithm
    assert all(p["participants"] == p["sampled"] for p in part), part  # nobody dropped
    res, _ = simulate_with_participation(_task(app_dir, {"algorithm": algorithm}), threads=1)   # the app's threads
    _assert_same(hist, res.history)
    assert hist[-1]["eval_clients"] == NUM_CLIENTS


def _wait_round(out: Path, done: int, timeout: float = 300) -> list:
    """Wait until the ServerApp has finished round index ``done`` (0-based)."""
    end = time.monotonic() + timeout
    p = out / "participation.json"
    while time.monotonic() < end:
        if p.exists():
            part = json.loads(p.read_text())
            if len(part) > done:
                return part
        if (out / "summary.json").exists():
            raise AssertionError((out / "summary.json").read_text())
        time.sleep(0.3)
    raise TimeoutError(f"round {done} not reached")


FAULT_CFG = {"algorithm": "fedapm", "round-timeout": 30.0,
             "overrides": "simulation.rounds=6 simulation.eval_every=3 simulation.sampling.clients_per_round=3"}


def test_killed_node_is_not_selected_and_rejoins(federation, app_dir, tmp_path):
    """SIGKILL one SuperNode after round 1: the run goes on; its client counts as not selected (its
    state rows stay as they were); the restarted node (same key, same state-dir) rejoins."""
    out = tmp_path / "res"
    federation.run_app(app_dir, {**FAULT_CFG, "results-dir": str(out)})
    _wait_round(out, 0)
    federation.kill_node(1)
    _wait_round(out, 2)
    federation.start_node(1)
    summary = wait_summary(out, 600, federation)
    hist = read_history(out)
    part = json.loads((out / "participation.json").read_text())
    missed = [p["round"] for p in part if 1 not in p["participants"]]
    assert 1 in missed and 2 in missed, part
    assert 1 in part[-1]["participants"], part  # rejoined
    assert summary["status"] == "completed" and hist[-1]["eval_clients"] == NUM_CLIENTS
    res, _ = simulate_with_participation(_task(app_dir, FAULT_CFG), part, threads=1)   # the app's threads
    _assert_same(hist, res.history, complete_only=True)


def test_slow_node_past_timeout_is_not_selected(federation, app_dir, tmp_path):
    """A node that answers nothing for longer than round-timeout (SIGSTOP, then SIGCONT) is treated
    as not selected; the late work it does on resuming is discarded (state unchanged)."""
    out = tmp_path / "res"
    federation.run_app(app_dir, {**FAULT_CFG, "results-dir": str(out)})
    _wait_round(out, 0)
    federation.pause_node(2)
    try:
        _wait_round(out, 1)
    finally:
        federation.resume_node(2)
    summary = wait_summary(out, 600, federation)
    hist = read_history(out)
    part = json.loads((out / "participation.json").read_text())
    assert 2 not in part[1]["participants"], part
    assert 2 in part[-1]["participants"], part
    assert summary["status"] == "completed" and hist[-1]["eval_clients"] == NUM_CLIENTS
    res, _ = simulate_with_participation(_task(app_dir, FAULT_CFG), part, threads=1)   # the app's threads
    _assert_same(hist, res.history, complete_only=True)


def test_unregistered_supernode_is_refused(federation, tmp_path):
    """SuperNode authentication: a node whose public key was not registered cannot join."""
    from fedsolve.flower.security import make_node_keys

    key, _ = make_node_keys(tmp_path, ["intruder"])["intruder"]
    extra = len(federation.nodes)
    from fedsolve.flower.launch import Node

    federation.nodes.append(Node(0, extra_config={}))
    try:
        proc = federation.start_node(extra, key=key, max_wait_time=10)
        rc = proc.wait(timeout=120)
        assert rc == 1   # Flower's exit code 305 is only in the log
        log = federation.nodes[extra].log.read_text()
        assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log and "intruder" not in log
        why = federation.node_failure(extra)   # the launcher names the key to register
        assert why == (f"SuperNode {extra} (partition-id 0) exited with code 1: the SuperLink refused to activate it "
                       f"(Flower's exit code 305 in node{extra}.log); its public key {key}.pub is not registered: "
                       f"flwr supernode register {key}.pub fedsolve"), why
        assert why in federation.logs()
    finally:
        federation.kill_node(extra) if federation.nodes[extra].proc.poll() is None else None
        federation.nodes.pop()
