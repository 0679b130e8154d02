"""What a Flower run trains: a fedsolve task built from the run config.

Every process of a run (the ServerApp and each node's ClientApp) builds the same task from
the same run config, so they agree on the algorithm, its hyper-parameters, the simulation
settings (rounds, sampling, evaluation) and the seed:

* ``experiment`` = path to an experiment YAML (``fedsolve.experiments``), with ``algorithm``
  (name or label inside it), ``seed`` and ``overrides`` (``"simulation.rounds=5 ..."``); a
  relative path is looked up in the current folder and then in the Flower app folder (the FAB,
  so a YAML shipped inside the app reaches every machine);
* or ``task`` = ``"module:function"``, a function with no arguments returning a
  :class:`DeploymentTask` (or a ``(problem, algorithm, simulation_config, seed)`` tuple).

The server uses the task's algorithm object (``init`` / ``broadcast`` / ``aggregate`` /
``broadcast`` with round None), the client weights and the simulation settings; it never reads client
state or client data. A node uses only its own partition (``partition-id`` in its node config).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsolve.engine.algorithm import Algorithm
from fedsolve.engine.loop import SimulationConfig

#: Run-config keys of a fedsolve Flower app and their defaults (also written into the app's
#: ``pyproject.toml`` by ``python -m fedsolve.flower new-app``; ``flwr run --run-config`` can only
#: override keys declared there).
RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    "experiment": "",  # path to an experiment YAML
    "algorithm": "",  # algorithm name or label inside the experiment ("" = its only/first one)
    "seed": -1,  # -1 = the experiment's first seed
    "overrides": "",  # space-separated dotted overrides, e.g. "simulation.rounds=5"
    "task": "",  # "module:function" alternative to `experiment`
    "round-timeout": 120.0,  # seconds the server waits for a round's uploads; late = not selected
    "eval-timeout": 120.0,  # seconds the server waits for evaluation replies
    "wait-for-nodes": 300.0,  # seconds to wait at start until every client's node has joined
    "results-dir": "",  # where the ServerApp writes metrics.jsonl, participation.json, summary.json
    "threads": 0,  # torch threads per app process; 0: the experiment's `threads`, as the simulation
}


class FlowerUnsupportedError(ValueError):
    """An algorithm that cannot run as synchronous Flower rounds (the message says why)."""


@dataclass
class DeploymentTask:
    problem: Any
    algorithm: Algorithm
    simulation: SimulationConfig
    seed: int
    name: str = "fedsolve"
    #: the experiment's ``threads`` (None: the machine's physical cores, the simulation's default)
    threads: int | None = None


def run_config_value(cfg: Mapping[str, Any], key: str) -> Any:
    return cfg[key] if key in cfg else RUN_CONFIG_DEFAULTS[key]


def check_supported(algo: Algorithm) -> None:
    """Raise :class:`FlowerUnsupportedError` for algorithms the synchronous adapter cannot run."""
    name = getattr(algo, "name", type(algo).__name__)
    if (
        getattr(algo, "asynchronous", False)
        or getattr(algo, "synchronous", True) is False
        or str(name).lower().startswith("async")
    ):
        raise FlowerUnsupportedError(
            f"algorithm {name!r} is asynchronous: its server applies each client's upload as it arrives "
            "(staleness, per-arrival updates), while the fedsolve Flower adapter runs synchronous rounds "
            "(sample -> broadcast -> all uploads -> aggregate). Run its synchronous variant on Flower, or "
            "simulate it with `fedsolve run`."
        )
    base = Algorithm
    for fn in ("init", "broadcast", "local_update", "aggregate", "eval_model"):
        if getattr(type(algo), fn) is getattr(base, fn):
            raise FlowerUnsupportedError(
                f"algorithm {name!r} does not implement `{fn}`, which the Flower "
                "adapter needs (see fedsolve.engine.algorithm)"
            )
    if getattr(algo, "server_reads_client_state", False):
        raise FlowerUnsupportedError(
            f"algorithm {name!r} reads client state on the server, which does not exist in a deployment "
            "(client state lives on its node in `context.state`)"
        )


def _resolve_path(p: str) -> Path:
    path = Path(p).expanduser()
    if path.is_absolute():
        return path
    candidates = [Path.cwd() / path] + [Path(s) / path for s in sys.path if s]
    for c in candidates:
        if c.exists():
            return c
    raise FileNotFoundError(
        f"run config `experiment`: {p!r} not found in the current folder or the Flower app "
        "folder; give an absolute path or ship the YAML inside the app folder"
    )


def _from_experiment(path: str, algorithm: str, seed: int, overrides: str) -> DeploymentTask:
    try:
        from fedsolve.experiments.config import load_config
        from fedsolve.experiments.runner import build_algorithm, build_problem
    except ImportError as e:  # pragma: no cover - depends on the experiments package
        raise ImportError(f"run config `experiment` needs fedsolve.experiments ({e})") from e
    cfg = load_config(_resolve_path(path), overrides.split() if overrides else None)
    specs = cfg.all_algorithms()
    if algorithm:
        match = [s for s in specs if algorithm in (s.name, s.display)]
        if not match:
            raise ValueError(
                f"run config `algorithm`: {algorithm!r} is not in the experiment; allowed: {[s.display for s in specs]}"
            )
        spec = match[0]
    else:
        if len(specs) > 1:
            raise ValueError(
                f"run config `algorithm`: the experiment lists several algorithms; choose one of "
                f"{[s.display for s in specs]}"
            )
        spec = specs[0]
    if spec.tune is not None:
        raise ValueError(
            f"algorithm {spec.display!r} has `tune:` ({spec.tune.param} over {spec.tune.grid}); tuning "
            f"runs in simulation (`fedsolve compare`): put the chosen value in its params for a "
            f"deployment, e.g. override algorithms.<i>.tune=null"
        )
    s = cfg.seeds[0] if seed is None or int(seed) < 0 else int(seed)
    problem = build_problem(cfg, s, spec=spec)
    algo = build_algorithm(cfg, spec, problem)
    return DeploymentTask(problem, algo, cfg.simulation, s, name=f"{cfg.name}/{spec.display}", threads=cfg.threads)


def _from_factory(ref: str) -> DeploymentTask:
    if ":" not in ref:
        raise ValueError(f"run config `task`: expected 'module:function', got {ref!r}")
    mod, fn = ref.split(":", 1)
    out = getattr(importlib.import_module(mod), fn)()
    if isinstance(out, DeploymentTask):
        return out
    if isinstance(out, tuple) and len(out) == 4:
        problem, algo, sim, seed = out
        return DeploymentTask(problem, algo, sim, int(seed), name=getattr(algo, "name", "task"))
    raise TypeError(
        f"run config `task`: {ref} must return a DeploymentTask or (problem, algorithm, "
        f"simulation_config, seed), got {type(out).__name__}"
    )


_CACHE: dict[tuple, DeploymentTask] = {}


def register_all_algorithms() -> None:
    """Import every family (``fedsolve.families``) so each solver is in the registry."""
    import fedsolve.families  # noqa: F401


def load_task(run_config: Mapping[str, Any], role: str = "any") -> DeploymentTask:
    """Build (once per process and role) the task described by a run config; validates Flower support.

    ``role`` ("server" / "client") keeps the ServerApp's and the ClientApp's algorithm objects apart
    when both run in one process (tests), as they are in a deployment.
    """
    key = (
        role,
        *sorted(
            (k, str(run_config.get(k, v)))
            for k, v in RUN_CONFIG_DEFAULTS.items()
            if k in ("experiment", "algorithm", "seed", "overrides", "task")
        ),
    )
    if key in _CACHE:
        return _CACHE[key]
    register_all_algorithms()
    exp, ref = str(run_config_value(run_config, "experiment")), str(run_config_value(run_config, "task"))
    if bool(exp) == bool(ref):
        raise ValueError("run config: give exactly one of `experiment` (a YAML path) or `task` ('module:function')")
    task = (
        _from_experiment(
            exp,
            str(run_config_value(run_config, "algorithm")),
            int(run_config_value(run_config, "seed")),
            str(run_config_value(run_config, "overrides")),
        )
        if exp
        else _from_factory(ref)
    )
    check_supported(task.algorithm)
    _CACHE[key] = task
    return task


def app_threads(run_config: Mapping[str, Any], task: DeploymentTask) -> int:
    """The torch threads of a ServerApp / ClientApp process: the run config's ``threads``, or (0, the default) the
    experiment's ``threads`` as a simulation of it uses (the machine's physical cores when unset), so that a
    deployment computes with the simulation's thread count and gives its numbers."""
    from fedsolve.core.cpus import physical_cores

    n = int(run_config_value(run_config, "threads"))
    return n if n > 0 else (task.threads or physical_cores())
