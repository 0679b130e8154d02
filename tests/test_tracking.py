"""Tracking writers (engine/tracking.py): metrics.csv and TensorBoard event files from the CLI's --track and from
fedsolve.run(callbacks=...); the W&B and MLflow writers against fake modules; a missing package is one line."""

import csv
import json
import sys
import types

import pytest
import yaml

import fedsolve
from fedsolve.cli import main
from fedsolve.engine.tracking import MissingPackage, flat_params, mlflow_key, parse_track
from fedsolve.experiments.config import apply_overrides

BASE = {
    "name": "tiny",
    "seeds": [0],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "logreg"},
    "simulation": {"rounds": 3, "eval_every": 1, "sampling": {"fraction": 0.5}},
    "defaults": {"lr": 0.1, "batch_size": 16},
    "algorithm": {"name": "fedavg", "label": "FedAvg"},
}


def _config(tmp_path, *overrides):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(apply_overrides(BASE, list(overrides))))
    return p


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _csv(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def _same_as_jsonl(csv_path, jsonl_path):
    """metrics.csv holds metrics.jsonl's records, one row each, every float to the last digit."""
    head, rows = _csv(csv_path)
    recs = _jsonl(jsonl_path)
    assert head[0] == "round" and len(rows) == len(recs)
    for row, rec in zip(rows, recs):
        assert {k: v for k, v in row.items() if v != ""}.keys() == rec.keys()
        for k, v in rec.items():
            assert type(v)(row[k]) == v, (k, row[k], v)
    return head, rows


def _tb_scalars(log_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_cli_track_csv_and_tensorboard_write_every_evaluation_and_resume_writes_no_round_twice(tmp_path):
    p = _config(tmp_path, "simulation.checkpoint_every=2")   # the last checkpoint is round 2's
    out = tmp_path / "run"
    assert main(["run", str(p), "--out", str(out), "--quiet", "--track", "csv,tensorboard"]) == 0
    head, rows = _same_as_jsonl(out / "metrics.csv", out / "metrics.jsonl")
    assert [r["round"] for r in rows] == ["0", "1", "2", "3"]
    # round 0 has no train loss: an empty cell, the column stays where it is
    assert rows[0]["train_loss"] == "" and "train_loss" in head and "uplink_bytes" in head
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    recs = _jsonl(out / "metrics.jsonl")
    tb = _tb_scalars(out / "tensorboard", "test_accuracy")
    assert [s for s, _ in tb] == [0, 1, 2, 3]
    assert [v for _, v in tb] == pytest.approx([r["test_accuracy"] for r in recs], rel=1e-6)   # float32 there
    assert [v for _, v in _tb_scalars(out / "tensorboard", "uplink_bytes")] == [r["uplink_bytes"] for r in recs]

    # resume to 5 rounds from round 2's checkpoint, which evaluates round 3 again: the CSV is the history's rows
    # once each, and TensorBoard drops the first run's events after round 2, so it shows every round once
    assert main(["run", str(p), "--out", str(out), "--quiet", "--resume", "--set", "simulation.rounds=5",
                 "--track", "csv,tensorboard"]) == 0
    _, rows = _same_as_jsonl(out / "metrics.csv", out / "metrics.jsonl")
    assert [r["round"] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    tb = _tb_scalars(out / "tensorboard", "test_accuracy")
    assert [s for s, _ in tb] == [0, 1, 2, 3, 4, 5]
    assert [v for _, v in tb] == pytest.approx([r["test_accuracy"] for r in _jsonl(out / "metrics.jsonl")],
                                               rel=1e-6)


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_compare_track_csv_writes_one_file_per_run(tmp_path, jobs):
    """In one process and in --jobs worker processes."""
    p = _config(tmp_path, "seeds=[0,1]")
    out = tmp_path / "cmp"
    assert main(["compare", str(p), "--out", str(out), "--quiet", "--track", "csv", "--jobs", str(jobs)]) == 0
    for seed in (0, 1):
        run = out / "FedAvg" / f"seed{seed}"
        _same_as_jsonl(run / "metrics.csv", run / "metrics.jsonl")


def test_python_api_callbacks_see_the_run(tmp_path):
    """fedsolve.run(callbacks=...): a CsvWriter and a callback of one's own (the Callback protocol)."""
    seen = []

    class Rounds:
        def on_start(self, sim):
            seen.append("start")

        def on_round(self, sim, round_, info):
            seen.append(("round", round_))

        def on_eval(self, sim, record):
            seen.append(("eval", record["round"]))

        def on_end(self, sim):
            seen.append("end")

    res = fedsolve.run(apply_overrides(BASE, ["simulation.eval_every=2"]),
                       callbacks=[fedsolve.CsvWriter(tmp_path / "m.csv"), Rounds()])
    assert seen == ["start", ("eval", 0), ("round", 0), ("round", 1), ("eval", 2), ("round", 2), ("eval", 3), "end"]
    _, rows = _csv(tmp_path / "m.csv")
    assert [float(r["test_accuracy"]) for r in rows] == [r["test_accuracy"] for r in res.history]
    from fedsolve.engine import Callback
    assert fedsolve.Callback is Callback


def test_unknown_tracker_and_missing_package_are_one_line_errors(tmp_path, capsys, monkeypatch):
    p = _config(tmp_path)
    assert main(["run", str(p), "--out", str(tmp_path / "a"), "--quiet", "--track", "csv,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("config error: --track: 'nope' is not a tracker; allowed: a comma-separated list of csv, "
                   "tensorboard, wandb, mlflow")
    monkeypatch.setitem(sys.modules, "wandb", None)    # what an environment without wandb gives: ImportError
    with pytest.raises(MissingPackage) as e:
        parse_track("csv,wandb")
    assert str(e.value) == ("--track wandb: the 'wandb' package is not installed; install it with `pip install "
                            "wandb` (or fedsolve's extra: `pip install '.[wandb]'` in the checkout)")
    assert main(["run", str(p), "--out", str(tmp_path / "b"), "--quiet", "--track", "wandb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'wandb' package is not installed" in err and not (tmp_path / "b").exists()


def _fake_wandb(calls):
    mod = types.ModuleType("wandb")

    class Run:
        def log(self, data, step):
            calls.append(("log", step, data))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    mod.init = init
    return mod


def test_wandb_writer_logs_each_record_at_its_round(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    out = tmp_path / "run"
    assert main(["run", str(_config(tmp_path)), "--out", str(out), "--quiet", "--track", "wandb"]) == 0
    init = calls[0][1]
    assert init["project"] == "tiny" and init["name"] == "tiny/FedAvg/seed0" and init["dir"] == str(out / "wandb")
    assert init["config"] == yaml.safe_load((out / "config.yaml").read_text())   # the resolved config
    recs = _jsonl(out / "metrics.jsonl")
    logs = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logs] == [r["round"] for r in recs]
    assert all(c[2] == {k: float(v) for k, v in r.items() if k != "round"} for c, r in zip(logs, recs))
    assert calls[-1] == ("finish",) and calls.count(("finish",)) == 1
    monkeypatch.setenv("WANDB_PROJECT", "mine")   # W&B's own variable wins over the experiment's name
    calls.clear()
    assert main(["run", str(_config(tmp_path)), "--out", str(tmp_path / "r2"), "--quiet", "--track", "wandb"]) == 0
    assert calls[0][1]["project"] == "mine"


def _fake_mlflow(calls):
    mod = types.ModuleType("mlflow")
    active = []
    mod.set_experiment = lambda name: calls.append(("experiment", name))
    mod.active_run = lambda: active[-1] if active else None

    def start_run(run_name=None, nested=False):
        calls.append(("start", run_name, nested))
        active.append(object())
        return active[-1]

    def end_run():
        calls.append(("end",))
        active.pop()

    mod.start_run, mod.end_run = start_run, end_run
    mod.log_params = lambda params: calls.append(("params", params))
    mod.log_metrics = lambda metrics, step: calls.append(("metrics", step, metrics))
    return mod, active


def test_mlflow_writer_logs_params_and_metrics_and_ends_a_diverged_run(tmp_path, monkeypatch):
    calls = []
    mod, active = _fake_mlflow(calls)
    monkeypatch.setitem(sys.modules, "mlflow", mod)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "run"
    assert main(["run", str(_config(tmp_path)), "--out", str(out), "--quiet", "--track", "mlflow"]) == 0
    assert calls[:2] == [("experiment", "tiny"), ("start", "tiny/FedAvg/seed0", False)]
    params = calls[2][1]
    assert params["algorithm.params.lr"] == "0.1" and params["data.num_clients"] == "4"
    metrics = [c for c in calls if c[0] == "metrics"]
    recs = _jsonl(out / "metrics.jsonl")
    assert [c[1] for c in metrics] == [r["round"] for r in recs]
    assert metrics[-1][2]["test_accuracy"] == recs[-1]["test_accuracy"]
    assert calls[-1] == ("end",) and not active
    # a run that diverges ends without on_end: its MLflow run is ended all the same, so the next one can start
    calls.clear()
    p = _config(tmp_path, "defaults.lr=1e7", "simulation.rounds=20", "model.name=mlp")
    assert main(["run", str(p), "--out", str(tmp_path / "div"), "--quiet", "--track", "mlflow"]) == 3
    assert calls[-1] == ("end",) and not active


def test_mlflow_names_and_params():
    assert mlflow_key("c_client_mean[L_female - L_male - r]") == "c_client_mean_L_female - L_male - r_"
    assert flat_params({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == \
        {"a.b": "1", "a.c.d": "[1, 2]", "e": "{}", "f": "None"}
