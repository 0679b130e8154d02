"""Hyper-parameter tuning on validation data (``tune:`` of an algorithm in a compare config)."""

import json

import pytest
import torch
import yaml

from fedsolve.cli import main
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.experiments.config import ConfigError, apply_overrides, parse_config

BASE = {
    "name": "tune",
    "seeds": [0],
    "data": {
        "dataset": "digits",
        "num_clients": 4,
        "partition": "dirichlet",
        "partition_params": {"alpha": 0.5, "min_size": 10},
    },
    "model": {"name": "logreg"},
    "simulation": {"rounds": 4, "eval_every": 2, "sampling": {"fraction": 1.0}},
    "defaults": {"batch_size": 16},
    "algorithms": [
        {
            "name": "fedavg",
            "label": "FedAvg",
            "params": {"lr": 0.1},
            "tune": {"param": "lr", "grid": [1.0e-7, 0.5], "rounds": 3},
        }
    ],
}


def _with(*sets):
    return apply_overrides(BASE, list(sets))


@pytest.mark.parametrize(
    "sets, field, allowed",
    [
        (["algorithms.0.tune.param=lrr"], "tune.param", "allowed: ["),
        (["algorithms.0.tune.grid=[0.1, -1]"], "tune.grid value -1", "greater than 0"),
        (["algorithms.0.tune.grid=[0.1]"], "algorithms.0.tune.grid", "at least 2"),
        (["algorithms.0.tune.grid=[0.1, 0.1]"], "algorithms.0.tune.grid", "distinct"),
        (["algorithms.0.tune.val_fraction=1.0"], "algorithms.0.tune.val_fraction", "less than 1"),
        (["algorithms.0.tune.bogus=1"], "algorithms.0.tune.bogus", "allowed keys"),
    ],
)
def test_bad_tune_names_field_and_allowed(sets, field, allowed):
    with pytest.raises(ConfigError) as e:
        parse_config(_with(*sets))
    assert field in str(e.value) and allowed in str(e.value), str(e.value)


def test_split_validation_holds_out_a_share_of_each_client():
    data = fpfc_synthetic("S1", seed=0, features="uniform", size_scale=0.05)
    va = data.split_validation(0.2, seed=3)
    assert va.num_clients == data.num_clients
    assert torch.equal(va.clusters, data.clusters)
    for i in range(data.num_clients):
        x, _ = data.client_train(i)
        xt, _ = va.client_train(i)
        xv, _ = va.client_test(i)
        assert xv.shape[0] == round(0.2 * x.shape[0]) and xt.shape[0] + xv.shape[0] == x.shape[0]
        # the two parts are disjoint and together are the client's training split
        both = torch.cat([xt, xv])
        assert torch.equal(torch.sort(both[:, 0]).values, torch.sort(x[:, 0]).values)
    again = data.split_validation(0.2, seed=3)
    assert torch.equal(again.test_x, va.test_x)
    assert not torch.equal(data.split_validation(0.2, seed=4).test_x, va.test_x)
    with pytest.raises(ValueError, match="fraction"):
        data.split_validation(1.0)


@pytest.mark.parametrize("metric", ["test_accuracy", "test_loss"])
def test_compare_tunes_on_validation_then_trains_the_choice(tmp_path, metric):
    """lr 1e-7 cannot learn in 3 rounds, lr 0.5 can: the choice is 0.5 whether the validation metric is
    higher-is-better (accuracy) or lower-is-better (loss); the final run trains with it."""
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_with(f"algorithms.0.tune.metric={metric}")))
    out = tmp_path / "cmp"
    assert main(["compare", str(p), "--out", str(out), "--quiet"]) == 0
    run = out / "FedAvg" / "seed0"
    s = json.loads((run / "summary.json").read_text())
    t = s["extras"]["tuned"]
    assert t["param"] == "lr" and t["value"] == 0.5 and t["metric"] == metric and t["rounds"] == 3
    # the recorded scores are the tuning runs' final validation metrics
    for g, sc in zip(t["grid"], t["scores"]):
        ts = json.loads((run / "tune" / f"lr_{g}" / "summary.json").read_text())
        assert ts["rounds"] == 3 and ts["metrics"]["final"][metric] == sc
        assert yaml.safe_load((run / "tune" / f"lr_{g}" / "config.yaml").read_text())["algorithm"]["params"]["lr"] == g
    assert yaml.safe_load((run / "config.yaml").read_text())["algorithm"]["params"]["lr"] == 0.5
    assert s["rounds"] == 4 and s["metrics"]["final"]["test_accuracy"] > 0.3
    agg = json.loads((out / "summary.json").read_text())
    assert agg["algorithms"]["FedAvg"]["tuned"][0]["value"] == 0.5
    rep = (out / "report.md").read_text()
    assert "## Tuned on validation" in rep and "lr = 0.5" in rep


def test_tuning_runs_are_reused_on_resume(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "cmp"
    assert main(["compare", str(p), "--out", str(out), "--quiet"]) == 0
    tune_sum = out / "FedAvg" / "seed0" / "tune" / "lr_0.5" / "summary.json"
    before = tune_sum.stat().st_mtime_ns
    (out / "FedAvg" / "seed0" / "summary.json").unlink()  # the final run is redone, tuning is not
    assert main(["compare", str(p), "--out", str(out), "--quiet", "--resume"]) == 0
    assert tune_sum.stat().st_mtime_ns == before
    assert json.loads((out / "FedAvg" / "seed0" / "summary.json").read_text())["extras"]["tuned"]["value"] == 0.5


def test_every_tuning_run_diverging_is_a_divergence(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_with("algorithms.0.tune.grid=[1.0e+6, 1.0e+7]")))
    out = tmp_path / "run"
    assert main(["run", str(p), "--out", str(out), "--quiet"]) == 3
    assert "no tuning run of lr" in capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "diverged" and "every run diverged" in s["message"]


def test_unknown_tune_metric_is_a_config_error_naming_the_reported_ones(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_with("algorithms.0.tune.metric=test_acc")))
    assert main(["compare", str(p), "--out", str(tmp_path / "cmp"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "tune.metric" in err and "'test_acc'" in err and "test_accuracy" in err


# ------------------------------------------------------------------ widening a grid beyond a pick at its edge
@pytest.mark.parametrize(
    "grid, side, expected",
    [
        ([0.2, 0.4, 0.8, 1.6, 3.2], "highest", [6.4, 12.8, 25.6, 51.2, 102.4]),  # geometric: the ratio continues
        ([0.2, 0.4, 0.8, 1.6, 3.2], "lowest", [0.1, 0.05, 0.025, 0.0125, 0.00625]),
        ([0.2, 0.4, 0.6, 0.8, 1.0], "highest", [1.2, 1.4, 1.6, 1.8, 2.0]),  # arithmetic: the step continues
        ([0.2, 0.4, 0.6, 0.8, 1.0], "lowest", []),  # 0.0 would be the next: stop
        ([0.0, 0.0125, 0.025, 0.05, 0.1], "highest", [0.2, 0.4, 0.8, 1.6, 3.2]),  # spaced by the positive values
        ([0.0, 0.0125, 0.025, 0.05, 0.1], "lowest", []),  # lambda = 0: the domain's edge
        ([2, 3, 4, 5, 6], "lowest", [1]),  # integers stay integers
        ([2, 3, 4, 5, 6], "highest", [7, 8, 9, 10, 11]),
        ([6, 8, 12, 16, 24], "lowest", [4, 3, 2, 1]),  # rounded, repeats dropped
        ([6, 8, 12, 16, 24], "highest", [36, 54, 81, 122, 182]),
        ([0.1, 1.0, 0.01], "highest", [10.0, 100.0, 1000.0]),  # the order given does not matter
        ([-3, -2, -1], "lowest", [-4, -5, -6]),
        ([-3, -2, -1], "highest", []),
    ],
)
def test_widen_grid_continues_the_spacing_and_never_crosses_zero(grid, side, expected):
    from fedsolve.experiments.tuning import widen_grid

    assert widen_grid(grid, side) == pytest.approx(expected)
    new = widen_grid(grid, side)
    assert not new or all(type(v) is int for v in new) == all(type(v) is int for v in grid)


def _tuned(tmp_path, *sets):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_with(*sets)))
    out = tmp_path / "cmp"
    assert main(["compare", str(p), "--out", str(out), "--quiet"]) == 0
    run = out / "FedAvg" / "seed0"
    return run, json.loads((run / "summary.json").read_text())["extras"]["tuned"]


def test_widen_tunes_again_beyond_a_pick_at_the_edge_and_picks_the_best_of_all(tmp_path):
    """lr 0.01 beats 0.001 after 3 rounds (the grid's top): one widening pass tries 0.1 and 1.0, the same number
    of values again with the grid's ratio, and the pick is the best validation score over all four runs."""
    from fedsolve.experiments.tuning import grid_edge

    run, t = _tuned(tmp_path, "algorithms.0.tune.grid=[0.01, 0.001]", "algorithms.0.tune.widen=1")
    assert t["widened"] == 1 and t["grid"] == [0.001, 0.01, 0.1, 1.0]
    assert sorted(p.name for p in (run / "tune").iterdir()) == ["lr_0.001", "lr_0.01", "lr_0.1", "lr_1.0"]
    for g, sc in zip(t["grid"], t["scores"]):  # every score is its own tuning run's validation accuracy
        assert (
            json.loads((run / "tune" / f"lr_{g}" / "summary.json").read_text())["metrics"]["final"]["test_accuracy"]
            == sc
        )
    best = max(range(4), key=lambda i: t["scores"][i])
    assert t["value"] == t["grid"][best] and t["scores"][1] > t["scores"][0]
    assert t["edge"] == grid_edge(t["grid"], best)
    assert yaml.safe_load((run / "config.yaml").read_text())["algorithm"]["params"]["lr"] == t["value"]


def test_widen_leaves_a_bracketed_pick_alone(tmp_path):
    """lr 0.5 learns, 1e-7 does not, 1e7 diverges: the pick lies inside the grid, no widening pass runs."""
    run, t = _tuned(tmp_path, "algorithms.0.tune.grid=[1.0e-7, 0.5, 1.0e+7]", "algorithms.0.tune.widen=2")
    assert t["value"] == 0.5 and t["edge"] is None and t["widened"] == 0
    assert t["grid"] == [1.0e-7, 0.5, 1.0e7] and t["scores"][2] is None
    assert len(list((run / "tune").iterdir())) == 3


def test_widened_values_the_algorithm_refuses_are_left_out():
    from fedsolve.experiments.runner import _allowed

    cfg = parse_config(BASE)
    spec = cfg.algorithms[0]
    assert _allowed(spec, cfg, "local_steps", 2) and not _allowed(spec, cfg, "local_steps", 0)
    assert not _allowed(spec, cfg, "lr", -0.1)


@pytest.mark.parametrize(
    "sets, allowed",
    [
        (["algorithms.0.tune={param: shared_only, grid: [true, false], widen: 1}"], "needs a grid of numbers"),
        (["algorithms.0.tune.widen=6"], "less than or equal to 5"),
        (["algorithms.0.tune.widen=-1"], "greater than or equal to 0"),
    ],
)
def test_bad_widen_names_the_field(sets, allowed):
    with pytest.raises(ConfigError) as e:
        parse_config(_with(*sets))
    assert "widen" in str(e.value) and allowed in str(e.value), str(e.value)
