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


def _tiny(path: Path) -> list[str]:
    ds = suite_dataset(path)
    sets = ["seeds=[0]", "simulation.rounds=2", "simulation.eval_every=1", "defaults.local_epochs=1",
            "defaults.log_stationarity=false"]
    if ds in ("mnist", "fmnist"):
        sets += ["data.params.limit=400", "data.params.test_limit=100"]
    if ds == "hapt":
        sets += ["data.params.window=32", "data.params.step=256"]
    return sets


def test_table3_learning_rates_are_the_tuning_picks():
    """Each image Table-3 suite trains every method with the lr its tuning suite picked: inside the paper's grid
    {0.05, 0.1, 0.5, 1} on the 1/m-scaled loss, i.e. FedAPM's lr in the grid and a baseline's lr = grid/m."""
    tune = load_config(SUITES[0].parent / "tune_image.yaml")
    m = tune.data.num_clients
    grid = {0.05, 0.1, 0.5, 1.0}
    assert tune.simulation.rounds == 150
    for spec in tune.all_algorithms():
        lr = spec.params["lr"]
        assert (lr in grid) if spec.name == "fedapm" else any(abs(lr - g / m) < 1e-12 for g in grid), spec.display
    for name in ("table3_mnist", "table3_fmnist"):
        cfg = load_config(SUITES[0].parent / f"{name}.yaml")
        assert cfg.simulation.rounds == tune.simulation.rounds   # tuned on the reported horizon
        tuned = {s.name: s.params["lr"] for s in tune.all_algorithms()}
        for spec in cfg.all_algorithms():
            grid_of = {s.params["lr"] for s in tune.all_algorithms() if s.name == spec.name}
            assert spec.params["lr"] in grid_of, f"{name}: {spec.display} lr {spec.params['lr']} not tuned"
        assert tuned


@pytest.mark.parametrize("path", [suite_param(p, REAL) for p in SUITES])
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
