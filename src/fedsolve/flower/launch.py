"""Start a SuperLink and SuperNodes on this machine (loopback, TLS) and run a fedsolve app.

Used by the tests and by ``python -m fedsolve.flower local``; across machines run the same
commands by hand (``docs/deployment.md``). Every process is started in its own session, so
``kill_node`` / ``pause_node`` act on exactly that SuperNode and the ClientApp processes it
spawned, nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsolve.flower.security import make_node_keys, make_tls


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def _toml_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_args(cfg: Mapping[str, Any]) -> str:
    """``{k: v}`` -> the ``'k1=v1 k2="s"'`` string of ``--node-config`` / ``--run-config``."""
    return " ".join(f"{k}={_toml_str(v)}" for k, v in cfg.items())


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before opening port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


@dataclass
class Node:
    partition: int
    proc: subprocess.Popen | None = None
    port: int = 0
    log: Path | None = None
    key: Path | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)


class LocalFederation:
    """A SuperLink + SuperNodes on 127.0.0.1 with TLS (and optionally SuperNode authentication).

    ``env`` is added to every process' environment (e.g. ``OMP_NUM_THREADS``).
    """

    def __init__(
        self,
        workdir: str | Path,
        num_nodes: int,
        *,
        auth: bool = False,
        insecure: bool = False,
        state_dirs: bool = True,
        env: Mapping[str, str] | None = None,
    ):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.auth, self.insecure = auth, insecure
        # no telemetry / update checks (offline machines, privacy); passive OpenMP waits (spinning threads stall
        # when another process holds a core)
        self.env = {
            **os.environ,
            "OMP_WAIT_POLICY": "PASSIVE",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            **(env or {}),
        }
        self.env.pop("FLWR_HOME", None)
        # the SuperLink/SuperNode start `flower-superexec` / `flwr-clientapp` by name: use this environment's
        bindir = str(Path(sys.executable).parent)
        self.env["PATH"] = bindir + os.pathsep + self.env.get("PATH", "")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.tls = None if insecure else make_tls(self.dir / "certs", ["127.0.0.1", "localhost"])
        self.nodes = [Node(i) for i in range(num_nodes)]
        if auth:
            keys = make_node_keys(self.dir / "keys", [f"node{i}" for i in range(num_nodes)])
            for n in self.nodes:
                n.key = keys[f"node{n.partition}"][0]
        if state_dirs:
            for n in self.nodes:
                n.extra_config["state-dir"] = str(self.dir / f"state{n.partition}")
        self.superlink: subprocess.Popen | None = None
        self.cli_home = self.dir / "cli-home"
        self._write_cli_config()

    # ---------------------------------------------------------------- processes
    def _popen(self, cmd: list[str], log: Path, home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "FLWR_HOME": str(home)}
        with open(log, "ab") as f:  # the child writes into its own copy of the descriptor
            return subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(self.dir), start_new_session=True
            )

    def superlink_cmd(self) -> list[str]:
        cmd = [
            _bin("flower-superlink"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-runtime-dependency-installation",
        ]
        if self.tls is None:
            cmd += ["--insecure"]
        else:
            cmd += [
                "--ssl-ca-certfile",
                str(self.tls["ca_cert"]),
                "--ssl-certfile",
                str(self.tls["server_cert"]),
                "--ssl-keyfile",
                str(self.tls["server_key"]),
            ]
        if self.auth:
            cmd += ["--enable-supernode-auth"]
        return cmd

    def start_superlink(self, timeout: float = 60.0) -> None:
        self.superlink = self._popen(self.superlink_cmd(), self.dir / "superlink.log", self.dir / "superlink-home")
        wait_port(self.port, timeout, self.superlink)

    def node_cmd(self, n: Node, key: Path | None = None) -> list[str]:
        cfg = {"partition-id": n.partition, **n.extra_config}
        cmd = [
            _bin("flower-supernode"),
            "--superlink",
            self.address,
            "--host",
            "127.0.0.1",
            "--port",
            str(n.port),
            "--node-config",
            config_args(cfg),
        ]
        cmd += ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls["ca_cert"])]
        key = key if key is not None else n.key
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        return cmd

    def start_node(self, i: int, key: Path | None = None, max_wait_time: float | None = None) -> subprocess.Popen:
        n = self.nodes[i]
        n.port = free_port()
        n.log = self.dir / f"node{i}.log"
        n.key = key if key is not None else n.key  # the key it runs with: node_failure names it
        cmd = self.node_cmd(n)
        if max_wait_time is not None:
            cmd += ["--max-wait-time", str(max_wait_time)]
        n.proc = self._popen(cmd, n.log, self.dir / f"node{i}-home")
        return n.proc

    def start_nodes(self) -> None:
        for i in range(len(self.nodes)):
            self.start_node(i)

    def _signal_node(self, i: int, sig: int) -> None:
        p = self.nodes[i].proc
        if p is not None and p.poll() is None:
            os.killpg(p.pid, sig)  # the node's own session: the SuperNode and the processes it started

    def node_failure(self, i: int) -> str | None:
        """Why SuperNode ``i`` stopped, in one line, or None while it runs (or before it started). A node the
        SuperLink refused to activate exits with code 1 and logs Flower's exit code 305 with "Failed to activate
        SuperNode" but no word of its key (the SuperLink's log says "No SuperNode found with the given public key");
        under SuperNode authentication this line names the key to register."""
        n = self.nodes[i]
        if n.proc is None or n.proc.poll() is None:
            return None
        text = f"SuperNode {i} (partition-id {n.partition}) exited with code {n.proc.returncode}"
        log = n.log.read_text(errors="replace") if n.log is not None and n.log.exists() else ""
        if "Failed to activate SuperNode" in log and self.auth:
            assert n.log is not None, "the text came from the node's log file"
            text += (
                f": the SuperLink refused to activate it (Flower's exit code 305 in {n.log.name}); its public key "
                f"{n.key}.pub is not registered: flwr supernode register {n.key}.pub fedsolve"
            )
        return text

    def kill_node(self, i: int) -> None:
        """SIGKILL the SuperNode (and its ClientApp processes), like a machine losing power."""
        self._signal_node(i, signal.SIGKILL)
        p = self.nodes[i].proc
        if p is not None:
            p.wait(timeout=30)

    def pause_node(self, i: int) -> None:
        """SIGSTOP: the node stays connected but answers nothing (a straggler)."""
        self._signal_node(i, signal.SIGSTOP)

    def resume_node(self, i: int) -> None:
        self._signal_node(i, signal.SIGCONT)

    def close(self) -> None:
        procs = [n.proc for n in self.nodes] + [self.superlink]
        for p in procs:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in procs:
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- flwr CLI
    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", 'default = "fedsolve"', "", "[superlink.fedsolve]", f'address = "{self.address}"']
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.tls["ca_cert"]}"')
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n")

    def flwr(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        env = {**self.env, "FLWR_HOME": str(self.cli_home), "COLUMNS": "200"}
        res = subprocess.run(
            [_bin("flwr"), *args], env=env, cwd=str(self.dir), capture_output=True, text=True, timeout=timeout
        )
        if check and res.returncode != 0:
            raise RuntimeError(
                f"flwr {' '.join(map(shlex.quote, args))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
            )
        return res

    def register_nodes(self) -> None:
        """Register every node's public key (SuperNode authentication)."""
        for n in self.nodes:
            assert n.key is not None, "LocalFederation(auth=True) creates the node keys"
            self.flwr("supernode", "register", str(n.key) + ".pub", "fedsolve")

    def run_app(self, app_dir: str | Path, run_config: Mapping[str, Any] | None = None) -> int:
        """``flwr run APP fedsolve --run-config ...``; returns the run id."""
        args = ["run", str(app_dir), "fedsolve", "--format", "json"]
        if run_config:
            args += ["--run-config", config_args(run_config)]
        res = self.flwr(*args)
        out = json.loads(res.stdout[res.stdout.index("{") :])
        if not out.get("success"):
            raise RuntimeError(f"flwr run failed: {res.stdout}\n{res.stderr}")
        return int(out["run-id"])

    def logs(self) -> str:
        """The stopped nodes (:meth:`node_failure`), then the tail of every process log."""
        parts = [f for i in range(len(self.nodes)) if (f := self.node_failure(i))]
        for p in [self.dir / "superlink.log"] + [n.log for n in self.nodes if n.log]:
            if p.exists():
                parts.append(f"===== {p.name}\n" + p.read_text(errors="replace")[-6000:])
        return "\n".join(parts)


def wait_summary(results_dir: str | Path, timeout: float, fed: LocalFederation | None = None) -> dict:
    """Wait for the ServerApp's ``summary.json``; raise with the logs if the run failed or timed out."""
    path = Path(results_dir) / "summary.json"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            s = json.loads(path.read_text())
            if s["status"] != "completed":
                raise RuntimeError(f"run {s['status']}: {s['message']}\n{fed.logs() if fed else ''}")
            return s
        time.sleep(0.5)
    raise TimeoutError(f"no {path} after {timeout:.0f} s\n{fed.logs() if fed else ''}")


def read_history(results_dir: str | Path) -> list[dict]:
    p = Path(results_dir) / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
