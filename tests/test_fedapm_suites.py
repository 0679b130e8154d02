"""Every FedAPM suite in experiments/fedapm/ loads and runs (tiny version: 1 seed, 2 rounds, small data).

The suites themselves are reduced CPU versions of the paper's Table 3 / Fig. 6 / Fig. 7 settings;
this only checks that each YAML is valid, builds its problem and runs every algorithm it lists to a
report with the paper block. Suites on fetched data (mnist, fmnist, hapt) are marked ``realdata``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import suite_dataset, suite_param
from fedsolve.experiments.config import load_config
from fedsolve.experiments.compare import compare
from fedsolve.experiments.suite import is_suite

# the experiment configs (the grid suites over them, table3_suite.yaml and participation_suite.yaml, are
# tests/test_grid_suite.py's)
SUITES = sorted(p for p in (Path(__file__).resolve().parents[1] / "experiments" / "fedapm").glob("*.yaml")
                if not is_suite(yaml.safe_load(p.read_text())))
REAL = {"mnist", "fmnist", "hapt"}
ON_DISK = {"cifar10"}   # a torchvision folder the user brings: tested on a fixture folder below
TABLE3 = ["table3_mnist", "table3_fmnist", "table3_hapt", "table3_hapt_input", "table3_cifar10"]


def _tiny(path: Path) -> list[str]:
    ds = suite_dataset(path)
    sets = ["seeds=[0]", "simulation.rounds=2", "simulation.eval_every=1", "defaults.local_epochs=1",
            "defaults.log_stationarity=false"]
    if ds in ("mnist", "fmnist"):
        sets += ["data.params.limit=400", "data.params.test_limit=100"]
    if ds == "hapt":
        sets += ["data.params.window=32", "data.params.step=256"]
    return sets


def test_table3_methods_are_tuned_on_validation_with_one_budget():
    """Every method of each Table-3 suite chooses its learning rate per seed on a validation split (``tune:``) over
    the reported horizon, with the same budget: the same number of grid values (at least four, so a pick can sit
    inside), and grids of cross-entropy steps (FedAPM's lr is m x the step: its loss is scaled by alpha_i = 1/m)
    that overlap (a method is not given only larger or only smaller steps than another)."""
    for name in TABLE3:
        cfg = load_config(SUITES[0].parent / f"{name}.yaml")
        m = cfg.data.num_clients or 30   # HAPT: the 30 users are the clients
        grids = {}
        for spec in cfg.all_algorithms():
            t = spec.tune
            assert t is not None and t.param == "lr" and t.rounds is None and t.val_fraction == 0.2, \
                f"{name}: {spec.display} is not tuned on validation over the reported horizon"
            ce = [v / m for v in t.grid] if spec.name == "fedapm" else list(t.grid)
            assert len(ce) >= 4, f"{name}: {spec.display} grid {t.grid}"
            assert all(a < b for a, b in zip(ce, ce[1:])), f"{name}: {t.grid}"
            grids[spec.display] = ce
        assert len({len(g) for g in grids.values()}) == 1, f"{name}: unequal budgets {grids}"
        assert max(g[0] for g in grids.values()) < min(g[-1] for g in grids.values()), f"{name}: disjoint {grids}"
        assert {s.name for s in cfg.all_algorithms()} == {"fedapm", "fedavg", "fedprox", "fedalt", "fedsim"}


def test_table3_cifar10_runs_on_a_torchvision_folder(tmp_path):
    """The CIFAR10 row's suite (the paper's size; CIFAR-10 on the user's disk) is valid: on a folder in
    torchvision's CIFAR-10 format it builds the paper's CNN (5,088 shared and 263,562 personal parameters), tunes
    each method's lr on validation and trains the pick (reduced here to 2 clients, 2 rounds, a 2-value grid)."""
    from front_door_fixtures import write_cifar10

    from fedsolve.experiments.runner import build_problem

    write_cifar10(tmp_path / "tv", per_batch=20, n_test=10)
    cfg = load_config(SUITES[0].parent / "table3_cifar10.yaml", [
        f"data.params.root={tmp_path / 'tv'}", "seeds=[0]", "simulation.rounds=2", "simulation.eval_every=1",
        "data.num_clients=2", "data.partition_params.min_size=5", "defaults.local_epochs=1"])
    prob = build_problem(cfg, 0)
    assert prob.data.input_shape == (3, 32, 32) and prob.num_clients == 2
    personal = prob.layout.mask("personal")
    assert (int((~personal).sum()), int(personal.sum())) == (5088, 263562)
    algos = [a.model_copy(update={"tune": a.tune.model_copy(update={"grid": a.tune.grid[1:3]})})
             for a in cfg.all_algorithms() if a.name in ("fedapm", "fedavg")]
    agg = compare(cfg.model_copy(update={"algorithms": algos}), out=tmp_path / "run", progress=False)
    for spec in algos:
        entry = agg["algorithms"][spec.display]
        assert entry["diverged"] == 0 and entry["tuned"][0]["grid"] == spec.tune.grid
    fedavg = json.loads((tmp_path / "run" / "FedAvg" / "seed0" / "summary.json").read_text())
    assert "local_drift" in fedavg["metrics"]["final"]   # wrap: drift (Fig. 5)


@pytest.mark.parametrize("path", [suite_param(p, REAL) for p in SUITES if suite_dataset(p) not in ON_DISK])
def test_suite_runs_tiny(path, tmp_path):
    cfg = load_config(path, _tiny(path))
    assert cfg.description.strip(), f"{path.name}: the description must say how the suite is reduced"
    agg = compare(cfg, out=tmp_path / "run", progress=False)
    labels = [s.display for s in cfg.all_algorithms()]
    assert set(agg["algorithms"]) == set(labels)
    for label, entry in agg["algorithms"].items():
        assert entry["runs"] == 1
        assert entry["diverged"] == 0, f"{label} diverged in the tiny run"
        acc = entry["final"]["test_accuracy"]["mean"]
        assert 0.0 <= acc <= 1.0
    report = (tmp_path / "run" / "report.md").read_text()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["seeds"] == [0]
    if cfg.paper.get("values"):
        # the paper's numbers sit next to ours, one row per method in the paper block
        assert "Paper's numbers" in report
        for label in cfg.paper["values"]:
            assert label in labels, f"{path.name}: paper.values label {label!r} is not an algorithm label"
