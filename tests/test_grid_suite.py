"""The grid suite, the one experiment front end (fedsolve.experiments.grid, compare, runs): cells with zipped axes,
references, folders; compare as a grid of one cell; runs that differ in seed and step size trained as one batch
with their separate runs' numbers; tuning grids and picks in the report; the minimax suites that replaced
grid.sh and p_sweep.sh give the numbers committed under results/minimax."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import yaml

from fedsolve.cli import main as cli
from fedsolve.experiments.config import ConfigError
from fedsolve.experiments.grid import cell_folder, grid_cells
from fedsolve.experiments.tuning import grid_edge
from fedsolve.experiments.suite import load_suite, main

ROOT = Path(__file__).resolve().parents[1]
MINIMAX = ROOT / "experiments" / "minimax"
EXPERIMENT = {
    "name": "tiny",
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "mlp", "params": {"hidden": [8]}},
    "simulation": {"rounds": 3, "eval_every": 1, "sampling": {"fraction": 0.5}, "executor": "batched",
                   "metrics": []},
    "defaults": {"lr": 0.1, "batch_size": 16, "local_epochs": 1},
    "algorithms": [{"name": "fedavg", "label": "FedAvg"}, {"name": "fedprox", "label": "FedProx",
                                                          "params": {"mu": 0.1}}],
}


def _write(tmp_path: Path, suite: dict, experiment: dict | None = None) -> Path:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment or EXPERIMENT))
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({"name": "grid", "description": "a tiny grid", "experiment": "exp.yaml", **suite}))
    return p


def _history(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ the grid
def test_zipped_axes_vary_together_and_the_product_covers_the_rest():
    cells = grid_cells({"seedless": [1, 2]}, [{"a": ["x", "y", "z"], "params.b": [10, 20, 30]}])
    assert cells == [{"seedless": s, "a": a, "params.b": b} for s in (1, 2) for a, b in
                     (("x", 10), ("y", 20), ("z", 30))]
    assert grid_cells({}, []) == [{}]
    assert cell_folder({"problem.params.loss": "dann", "data.params.source": "mnist"}) == "loss=dann_source=mnist"
    assert cell_folder({"data.params.p": 0.5, "loss": "cdan"}, "p_sweep_{loss}/p{data.params.p}") == \
        "p_sweep_cdan/p0.5"
    assert cell_folder({"data.params.x": 1, "model.params.x": 2}) == "data.params.x=1_model.params.x=2"


@pytest.mark.parametrize("change, match", [
    ({"zip": [{"params.lr": [0.1, 0.2], "data.num_clients": [4]}]}, "zip.0: .*one length; got"),
    ({"sweep": {"params.lr": [0.1]}, "zip": [{"params.lr": [0.2]}]}, "zip.0.params.lr: the axis is given twice"),
    ({"zip": [{"seed": [0, 1]}]}, "zip.0.seed: use the suite's `seeds` field"),
    ({"sweep": {"params.lr": []}}, "sweep.params.lr: give a list of at least one value"),
    ({"sweep": {"params.lr": [0.1, 0.2]}, "folders": "lr{params.lrr}"}, "folders: \\['params.lrr'\\] are not axes"),
    ({"sweep": {"params.lr": [0.1, 0.2]}, "folders": "same"}, "folders: the cells .* share the folder 'same'"),
    ({"sweep": {"params.etaa": [0.1]}}, "params.etaa: no algorithm of the experiment has the hyper-parameter"),
    ({"algorithms": ["FedAvg", "Fedprox"]}, "algorithms: \\['Fedprox'\\] not in the experiment"),
    ({"references": [{"experiment": "exp.yaml", "folder": "ref", "algorithms": ["SCAFFOLD"]}]},
     "references.0.algorithms: \\['SCAFFOLD'\\] not in the experiment"),
    ({"protocol": "tuning", "references": [{"experiment": "exp.yaml", "folder": "ref"}]},
     "references, folders and metric: for protocol runs only"),
    ({"experiment": None}, "experiment: give the experiment YAML"),
])
def test_bad_grid_suites_are_refused_naming_the_field(tmp_path, change, match):
    path = _write(tmp_path, change)
    with pytest.raises(ConfigError, match=match):
        load_suite(path)


def test_a_bad_grid_suite_is_one_line_and_exit_2(tmp_path, capsys):
    path = _write(tmp_path, {"zip": [{"params.lr": [0.1, 0.2], "params.mu": [0.1]}]})
    assert cli(["suite", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "zip.0" in err and "Traceback" not in err, err


# ------------------------------------------------------------------ compare is a grid of one cell
def test_fedsolve_suite_of_an_experiment_is_fedsolve_compare(tmp_path, capsys):
    """The same files and numbers: an experiment config given to `fedsolve suite` is the compare folder that
    `fedsolve compare` writes (both through the one grid path)."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**EXPERIMENT, "seeds": [0, 1]}))
    common = ["--quiet"]
    assert cli(["compare", str(exp), "--out", str(tmp_path / "c")] + common) == 0
    assert cli(["suite", str(exp), "--out", str(tmp_path / "s")] + common) == 0
    for label in ("FedAvg", "FedProx"):
        for seed in (0, 1):
            a, b = (tmp_path / w / label / f"seed{seed}" for w in "cs")
            assert filecmp.cmp(a / "metrics.jsonl", b / "metrics.jsonl", shallow=False)
    sa, sb = (json.loads((tmp_path / w / "summary.json").read_text()) for w in "cs")
    assert sa["algorithms"]["FedAvg"]["final"] == sb["algorithms"]["FedAvg"]["final"]
    assert json.loads((tmp_path / "s" / "run.json").read_text())["kind"] == "compare"
    # --only and the compare's refusal of a folder that holds its runs work the same way
    assert cli(["suite", str(exp), "--out", str(tmp_path / "s")] + common) == 2
    assert "pass --resume" in capsys.readouterr().err


def test_a_grid_suites_threads_are_each_runs_threads(tmp_path):
    """`fedsolve suite ... --set threads=N` on a grid of plain runs sets every run's torch threads (it used to set only
    the suite's own field, which a grid never read: the runs kept the experiment's default, the machine's cores)."""
    path = _write(tmp_path, {"seeds": [0]})
    main(str(path), out=str(tmp_path / "t"), sets=["threads=3"], progress=False)
    main(str(path), out=str(tmp_path / "d"), progress=False)
    for label in ("FedAvg", "FedProx"):
        run = tmp_path / "t" / "all" / label / "seed0"
        assert json.loads((run / "run.json").read_text())["provenance"]["torch_threads"] == 3
        assert yaml.safe_load((run / "config.yaml").read_text())["threads"] == 3
        assert yaml.safe_load((tmp_path / "d" / "all" / label / "seed0" / "config.yaml").read_text())["threads"] is None


# ------------------------------------------------------------------ sweeps as one batch
def test_runs_differing_in_seed_and_step_size_train_as_one_batch_with_their_separate_numbers(tmp_path,
                                                                                                monkeypatch):
    """A grid over the step size x 2 seeds x FedAvg/FedProx on an MLP under the batched executor: the 4 runs of each
    algorithm train as one batch (every round one kernel call), each run folder complete, every number its separate
    run's to float round-off; --resume reruns only a removed run, and gives its separate run's numbers."""
    from fedsolve.engine import sweep

    batched_rounds = []
    real = sweep.run_sweep

    def counting(sims, resume=False):
        out = real(sims, resume)
        batched_rounds.append((len(sims), sims[0].transport.batched_rounds))
        return out

    monkeypatch.setattr(sweep, "run_sweep", counting)
    path = _write(tmp_path, {"sweep": {"params.lr": [0.05, 0.2]}, "seeds": [0, 1],
                             "tables": [{"metric": "test_accuracy", "columns": "params.lr"}]})
    rows = main(str(path), out=str(tmp_path / "b"), progress=False)
    assert batched_rounds == [(4, 3), (4, 3)]          # FedAvg's 4 runs, then FedProx's, 3 rounds each in one call
    monkeypatch.setattr(sweep, "run_sweep", real)
    alone = main(str(path), out=str(tmp_path / "n"), progress=False, batch=False)
    assert len(rows) == len(alone) == 8
    for folder in sorted((tmp_path / "n").glob("lr=*/*/seed*")):
        twin = tmp_path / "b" / folder.relative_to(tmp_path / "n")
        assert json.loads((twin / "run.json").read_text())["status"] == "completed"
        assert {f.name for f in twin.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt"}
        assert (twin / "config.yaml").read_text() == (folder / "config.yaml").read_text()
        for a, b in zip(_history(twin), _history(folder), strict=True):
            assert a.keys() == b.keys()
            assert a == {k: pytest.approx(v, rel=1e-5, abs=1e-7) for k, v in b.items()}
    h0, h1 = (_history(tmp_path / "b" / f"lr={lr}" / "FedAvg" / "seed0") for lr in (0.05, 0.2))
    assert h0[-1]["train_loss"] != h1[-1]["train_loss"]          # the step sizes made different runs
    # resume per run folder: a removed run runs again (alone: its separate run's numbers), the others are kept
    import shutil

    gone = tmp_path / "b" / "lr=0.2" / "FedProx" / "seed1"
    kept = (tmp_path / "b" / "lr=0.05" / "FedAvg" / "seed0" / "metrics.jsonl").stat().st_mtime_ns
    shutil.rmtree(gone)
    main(str(path), out=str(tmp_path / "b"), progress=False, resume=True)
    assert (tmp_path / "b" / "lr=0.05" / "FedAvg" / "seed0" / "metrics.jsonl").stat().st_mtime_ns == kept
    assert filecmp.cmp(gone / "metrics.jsonl", tmp_path / "n" / gone.relative_to(tmp_path / "b") / "metrics.jsonl",
                       shallow=False)
    report = (tmp_path / "b" / "report.md").read_text()
    assert "| algorithm | params.lr 0.05 | params.lr 0.2 |" in report
    # fedsolve verify re-runs one run of a cell (alone) and finds the recorded numbers
    from fedsolve.experiments.verify import verify

    found = verify(tmp_path / "b", cell="lr=0.05:FedProx", rounds=2)
    assert found.agrees and found.compared > 10, found.lines
    with pytest.raises(ConfigError, match="verify --cell: 'lr=9' is not a cell of .*'lr=0.05', 'lr=0.2'"):
        verify(tmp_path / "b", cell="lr=9")


def test_a_tuning_grid_trains_as_one_batch_and_picks_what_its_separate_runs_pick(tmp_path, monkeypatch):
    from fedsolve.engine import sweep

    sizes = []
    real = sweep.run_sweep
    monkeypatch.setattr(sweep, "run_sweep", lambda sims, resume=False: sizes.append(len(sims)) or real(sims, resume))
    exp = {**EXPERIMENT, "algorithms": [{"name": "fedavg", "label": "FedAvg",
                                         "tune": {"param": "lr", "grid": [0.01, 0.1, 0.5], "rounds": 2}}]}
    (together,) = main(str(_write(tmp_path, {}, exp)), out=str(tmp_path / "b"), progress=False)
    assert sizes == [3]                               # the grid's three runs, one batch
    (alone,) = main(str(_write(tmp_path, {}, exp)), out=str(tmp_path / "n"), progress=False, batch=False)
    assert sizes == [3]
    a, b = together["tuned"], alone["tuned"]
    assert a["value"] == b["value"] and a["scores"] == pytest.approx(b["scores"], rel=1e-5, abs=1e-7)
    assert together["test_accuracy"] == pytest.approx(alone["test_accuracy"], rel=1e-5, abs=1e-7)


# ------------------------------------------------------------------ tuning in the report
def test_grid_edge_says_when_the_pick_is_not_bracketed():
    assert grid_edge([0.1, 1.0, 0.01], 1) == "highest" and grid_edge([0.1, 1.0, 0.01], 2) == "lowest"
    assert grid_edge([0.1, 1.0, 0.01], 0) is None
    assert grid_edge(["a", "b", "c"], 0) == "first" and grid_edge(["a", "b", "c"], 1) is None


@pytest.mark.parametrize("grid, pick, edge", [([1.0e-7, 0.5], 0.5, "highest"), ([1.0e-7, 0.5, 1.0e9], 0.5, None)])
def test_the_report_shows_the_tuning_grid_the_pick_and_the_edge(tmp_path, grid, pick, edge):
    """Known answers: lr 1e-7 learns nothing and lr 1e9 diverges on the logistic model, so 0.5 is the pick: at the
    grid's top when it is the largest value, inside when the grid goes beyond it."""
    exp = {**EXPERIMENT, "model": {"name": "logreg"}, "simulation": {"rounds": 4, "eval_every": 2},
           "algorithms": [{"name": "fedavg", "label": "FedAvg", "tune": {"param": "lr", "grid": grid, "rounds": 3}}]}
    rows = main(str(_write(tmp_path, {}, exp)), out=str(tmp_path / "out"), progress=False)
    (row,) = rows
    assert row["tuned"]["value"] == pick and row["tuned"]["edge"] == edge and row["tuned"]["grid"] == grid
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Tuned on validation" in report and f"| {grid} |" in report
    assert ("1 of 1 picks are at the grid's edge" in report) == (edge is not None)
    assert ("Every pick (1) is inside its grid" in report) == (edge is None)
    compare_report = (tmp_path / "out" / "all" / "report.md").read_text()
    assert ("the grid's highest value: not bracketed" in compare_report) == (edge is not None)


# ------------------------------------------------------------------ the minimax suites (formerly grid.sh, p_sweep.sh)
def _reduced(tmp_path: Path, name: str, changes: dict) -> Path:
    raw = yaml.safe_load((MINIMAX / name).read_text())
    raw.update(changes)
    for key in ("experiment",):
        if isinstance(raw.get(key), str):
            raw[key] = str(MINIMAX / raw[key])
    for ref in raw.get("references", []):
        ref["experiment"] = str(MINIMAX / ref["experiment"])
    for group in raw.get("zip", []):
        if "experiment" in group:
            group["experiment"] = [str(MINIMAX / e) for e in group["experiment"]]
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def _agrees_at_round(new: Path, old: Path, round_: int, rel: float = 1e-5, abs_: float = 1e-7) -> None:
    a = next(r for r in _history(new) if r["round"] == round_)
    b = next(r for r in _history(old) if r["round"] == round_)
    assert a.keys() == b.keys(), (new, sorted(a), sorted(b))
    assert a == {k: pytest.approx(v, rel=rel, abs=abs_) for k, v in b.items()}, new


@pytest.mark.slow
def test_minimax_grid_suite_gives_the_committed_grid_numbers(tmp_path):
    """grid_suite.yaml (formerly grid.sh) at 10 rounds, one pair, DANN from scratch and MDD pretrained, FedMM and the
    centralized reference: round 10 of each run is round 10 of the run grid.sh made in results/minimax/raw/grid
    (the zipped eta3 and lr_psi, the regime and the centralized run in central/ as grid.sh set them)."""
    raw = yaml.safe_load((MINIMAX / "grid_suite.yaml").read_text())
    pair, setting = raw["zip"]
    one = {"zip": [{k: v[:1] for k, v in pair.items()},
                   {k: [v[0], v[5]] for k, v in setting.items()}],      # DANN scratch, MDD pretrained
           "set": ["simulation.rounds=10"], "algorithms": ["FedMM"]}
    main(str(_reduced(tmp_path, "grid_suite.yaml", one)), out=str(tmp_path / "out"), progress=False)
    committed = ROOT / "results" / "minimax" / "raw" / "grid"
    # The committed runs were made on another CPU. The DANN runs from scratch agree to 1e-5 here; MDD's saddle on the
    # pretrained network amplifies the last-bit rounding of another CPU's float32 kernels (an AVX-512 machine, round
    # 10: FedMM's test loss 7.739 against the committed 7.761, the centralized run's 7.836 against 8.081, accuracies
    # one to three test images apart), so those two runs are held to 5e-2 relative and 1e-2 absolute: a check that
    # the suite ran the grid's setting, not of the last bits.
    mdd = {"rel": 5e-2, "abs_": 1e-2}
    for run, tol in (("scratch/dann/mnist_mnistm/FedMM", {}), ("scratch/dann/mnist_mnistm/central/Centralized", {}),
                     ("pretrained/mdd/mnist_mnistm/FedMM", mdd),
                     ("pretrained/mdd/mnist_mnistm/central/Centralized", mdd)):
        _agrees_at_round(tmp_path / "out" / run / "seed0", committed / run / "seed0", 10, **tol)


@pytest.mark.slow
def test_minimax_p_sweep_suite_gives_the_committed_p_sweep_numbers(tmp_path):
    """p_sweep_suite.yaml (formerly p_sweep.sh) at 10 rounds, DANN at p = 0.8, seed 1: round 10 of FedAvgGDA and
    FedMM is round 10 of results/minimax/raw/p_sweep_dann/p0.8."""
    one = {"sweep": {"data.params.p": [0.8]}, "zip": [{"loss": ["dann"], "experiment": ["p_sweep_dann.yaml"]}],
           "seeds": [1], "set": ["simulation.rounds=10"]}
    main(str(_reduced(tmp_path, "p_sweep_suite.yaml", one)), out=str(tmp_path / "out"), progress=False)
    for label in ("FedAvgGDA", "FedMM"):
        _agrees_at_round(tmp_path / "out" / "p_sweep_dann" / "p0.8" / label / "seed1",
                         ROOT / "results" / "minimax" / "raw" / "p_sweep_dann" / "p0.8" / label / "seed1", 10)
