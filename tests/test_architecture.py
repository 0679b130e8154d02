"""Structural limits of issue 44, held by tests so that later work cannot quietly undo them:

* the algorithm base class has at most eight public methods;
* no file under families/ mentions an executor (solvers state their updates; executors compile them);
* no solver file over 300 lines, Prox-AL FL's at most 250;
* no loop over rounds outside the engine's one loop (protocols are schedules);
* a solver written as the docs say, stated like FedAvg, gets FedAvg's executor and numbers on the MLP workload.
* no import circle between modules (function-level imports included).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import fedsolve
from fedsolve.core.states import ClientStates
from fedsolve.core.statements import Descend
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, weighted_mean

pytestmark = pytest.mark.fast

SRC = Path(fedsolve.__file__).parent
FAMILIES = SRC / "families"
EXECUTOR_WORDS = re.compile(r"executor|vectorized|vmap|batched|sequential|stacked|eager|linear_gd|gdstep|calibrat",
                            re.IGNORECASE)


def test_the_algorithm_base_has_at_most_eight_public_methods():
    public = sorted(n for n, v in vars(Algorithm).items() if not n.startswith("_") and inspect.isfunction(v))
    assert len(public) <= 8, public
    assert public == ["aggregate", "broadcast", "eval_model", "init", "local_update", "report", "setup", "work"]


def test_no_family_file_mentions_an_executor():
    bad = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in FAMILIES.rglob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1) if EXECUTOR_WORDS.search(line)]
    assert not bad, "\n".join(bad)


def test_solver_files_stay_small():
    """Every module that defines a registered solver is at most 300 lines; Prox-AL FL's at most 250."""
    import sys

    from fedsolve.families import ALGORITHMS

    files = {Path(sys.modules[cls.__module__].__file__) for cls in ALGORITHMS.values()
             if cls.__module__.startswith("fedsolve.families")}
    sizes = {p.relative_to(SRC).as_posix(): len(p.read_text().splitlines()) for p in files}
    assert len(sizes) >= 20, sizes
    assert sizes["families/constrained/proxal.py"] <= 250, sizes["families/constrained/proxal.py"]
    assert not {k: v for k, v in sizes.items() if v > 300}


def test_no_loop_over_rounds_outside_the_engine():
    """Drivers do not step a Simulation round by round: protocols are schedules run by the engine's loop."""
    pattern = re.compile(r"\b(sim|simulation|self\.sim|run)\.step\(")
    bad = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if "engine" not in p.relative_to(SRC).parts
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, bad


class _MyAvg(Algorithm):
    """A solver written from docs/writing-an-algorithm.md, knowing nothing of executors: FedAvg stated."""

    name = "my_avg_for_test"
    Config = AlgorithmConfig

    def init(self, x0, rngs):
        return {"w": x0.clone()}, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        return {"w": expand(server["w"], ids)}

    def local_update(self, state, msg, ctx):
        return Descend(start=msg["w"], lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                       then=lambda w, steps: ({}, {"w": w}))

    def aggregate(self, server, ids, uploads, round_):
        return {"w": weighted_mean(uploads["w"], self.client_weights[ids])}

    def eval_model(self, state, msg):
        return msg["w"]


def test_a_fresh_solver_stated_like_fedavg_gets_fedavgs_executor_and_numbers(monkeypatch):
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    from fedsolve.data.federated import FederatedData
    from fedsolve.families import get_algorithm
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    g = torch.Generator().manual_seed(0)
    sizes = [40, 55, 30, 61, 25, 48]
    x = torch.rand(sum(sizes), 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (sum(sizes),), generator=g)
    off = torch.cumsum(torch.tensor([0] + sizes), 0)
    data = FederatedData(x, y, off, x[:60], y[:60], torch.arange(0, 61, 10), num_classes=10, name="mnist-shaped")
    prob = FederatedProblem(data, build_model_fn("mlp", (1, 28, 28), 10, hidden=(200, 200)))   # the MLP workload
    cfg = SimulationConfig(rounds=3, eval_every=3, metrics=[], sampling={"clients_per_round": 4})
    params = {"lr": 0.05, "batch_size": 10, "local_epochs": 1}
    mine = Simulation(prob, _MyAvg(params, prob), cfg, seed=0)
    ref = Simulation(prob, get_algorithm("fedavg")(params, prob), cfg, seed=0)
    assert mine.executor.name == ref.executor.name == "batched"
    a, b = mine.run(), ref.run()
    assert a.history == b.history
    assert torch.equal(a.server["w"], b.server["w"])


def _module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the fedsolve modules it imports (at the top or inside a function, ``TYPE_CHECKING`` included),
    packages' ``__init__`` left out (a package importing its own modules to register them is no circle)."""
    import ast

    files = {_module_name(p, src): p for p in src.rglob("*.py")}
    packages = {_module_name(p, src) for p in src.rglob("__init__.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        if mod in packages:
            continue
        pkg = mod.rsplit(".", 1)[0]
        out = graph.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            out.update(t for t in targets if t in files and t not in packages and t != mod)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    """No two modules of the package import each other, directly or through others (function-level imports
    count: a lazy import hides a circle from Python, not from a reader)."""
    graph = _import_graph()
    assert len(graph) > 100
    assert _circles(graph) == []


def test_the_circle_check_sees_a_circle(tmp_path):
    pkg = tmp_path / "fedsolve"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from fedsolve.b import g\n")
    (pkg / "b.py").write_text("from .a import f\n")
    (pkg / "c.py").write_text("import fedsolve.a\n")
    assert _circles(_import_graph(pkg)) == [["fedsolve.a", "fedsolve.b"]]
