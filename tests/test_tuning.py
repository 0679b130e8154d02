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
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "logreg"},
    "simulation": {"rounds": 4, "eval_every": 2, "sampling": {"fraction": 1.0}},
    "defaults": {"batch_size": 16},
    "algorithms": [{"name": "fedavg", "label": "FedAvg", "params": {"lr": 0.1},
                    "tune": {"param": "lr", "grid": [1.0e-7, 0.5], "rounds": 3}}],
}


def _with(*sets):
    return apply_overrides(BASE, list(sets))


@pytest.mark.parametrize("sets, field, allowed", [
    (["algorithms.0.tune.param=lrr"], "tune.param", "allowed: ["),
    (["algorithms.0.tune.grid=[0.1, -1]"], "tune.grid value -1", "greater than 0"),
    (["algorithms.0.tune.grid=[0.1]"], "algorithms.0.tune.grid", "at least 2"),
    (["algorithms.0.tune.grid=[0.1, 0.1]"], "algorithms.0.tune.grid", "distinct"),
    (["algorithms.0.tune.val_fraction=1.0"], "algorithms.0.tune.val_fraction", "less than 1"),
    (["algorithms.0.tune.bogus=1"], "algorithms.0.tune.bogus", "allowed keys"),
])
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
        assert yaml.safe_load((run / "tune" / f"lr_{g}" / "config.yaml").read_text())[
            "algorithm"]["params"]["lr"] == g
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
    (out / "FedAvg" / "seed0" / "summary.json").unlink()          # the final run is redone, tuning is not
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
