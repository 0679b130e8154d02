"""Configs: each class of bad input gets an error naming the field; CLI run/compare/report/list end to end."""

import json

import pytest
import yaml

from fedsolve.cli import main
from fedsolve.experiments.config import ConfigError, apply_overrides, load_config, parse_config

BASE = {
    "name": "tiny",
    "seeds": [0, 1],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "logreg"},
    "simulation": {"rounds": 3, "eval_every": 2, "sampling": {"fraction": 0.5}},
    "defaults": {"lr": 0.1, "batch_size": 16},
    "algorithms": [{"name": "fedavg", "label": "FedAvg"}, {"name": "fedadmm", "label": "FedADMM",
                                                          "params": {"rho": 0.5}}],
}


def _with(path, value):
    return apply_overrides(BASE, [f"{path}={json.dumps(value)}"])


@pytest.mark.parametrize("raw, field, allowed", [
    (_with("bogus", 1), "bogus", "allowed keys"),
    (_with("data.bogus", 1), "data.bogus", "allowed keys"),
    (_with("simulation.sampling.bogus", 1), "simulation.sampling.bogus", "allowed keys"),
    (_with("data.dataset", "cifar"), "data.dataset", "allowed: ["),
    (_with("data.partition", "dirichlett"), "data.partition", "allowed: ["),
    (_with("model.name", "resnet"), "model.name", "allowed: ["),
    (_with("simulation.executor", "gpu"), "simulation.executor", "'auto'"),
    (_with("simulation.rounds", 0), "simulation.rounds", "greater than or equal to 1"),
    (_with("simulation.sampling.fraction", 1.5), "simulation.sampling.fraction", "less than or equal to 1"),
    (_with("algorithms.0.name", "fedsgd"), "algorithm", "allowed: ["),
    (_with("algorithms.1.params.rho", -1), "algorithm 'fedadmm' params.rho", "greater than 0"),
    (_with("algorithms.1.params.aggregate_over", "some"), "aggregate_over", "'all' or 'selected'"),
    (_with("algorithms.1.params.bogus", 1), "bogus", "unknown key"),
    (_with("seeds", [1, 1]), "seeds", "distinct"),
])
def test_bad_config_names_field_and_allowed_values(raw, field, allowed):
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert field in str(e.value) and allowed in str(e.value), str(e.value)


def test_set_overrides_and_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(BASE))
    cfg = load_config(p, ["simulation.rounds=7", "algorithms.1.params.rho=0.25", "seeds=[3]"])
    assert cfg.simulation.rounds == 7 and cfg.algorithms[1].params["rho"] == 0.25 and cfg.seeds == [3]
    with pytest.raises(ConfigError, match="key=value"):
        load_config(p, ["simulation.rounds"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("data: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    # a repeated key would silently replace the first block: refused, naming the key
    (tmp_path / "dup.yaml").write_text(yaml.safe_dump(BASE) + "seeds: [3]\n")
    with pytest.raises(ConfigError, match="'seeds' appears twice"):
        load_config(tmp_path / "dup.yaml")


def test_cli_run_resume_compare_report(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "run"
    assert main(["run", str(p), "--algorithm", "FedADMM", "--out", str(out), "--quiet"]) == 0
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", "report.md"):
        assert (out / f).exists(), f
    assert list((out / "plots").glob("*.png"))
    s = json.loads((out / "summary.json").read_text())
    for k in ("algorithm", "dataset", "seed", "rounds", "wall_time_s", "round_time_s_median"):
        assert k in s
    assert s["executor"] == "batched"   # what "auto" chose: FedADMM states plain SGD with a dual and a pull
    assert {"final", "best"} <= set(s["metrics"]) and "test_accuracy" in s["metrics"]["final"]
    assert s["communication"]["uplink_bytes"] > 0 and s["communication"]["downlink_bytes"] > 0
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["algorithm"]["params"]["rho"] == 0.5 and "warm_start" in resolved["algorithm"]["params"]
    # a second run into the same folder refuses without --resume / --overwrite
    assert main(["run", str(p), "--algorithm", "FedADMM", "--out", str(out), "--quiet"]) == 2
    lines_before = (out / "metrics.jsonl").read_text().splitlines()
    assert main(["run", str(p), "--algorithm", "FedADMM", "--out", str(out), "--quiet", "--resume",
                 "--set", "simulation.rounds=5"]) == 0
    lines_after = (out / "metrics.jsonl").read_text().splitlines()
    assert lines_after[:len(lines_before) - 1] == lines_before[:-1] and len(lines_after) > len(lines_before)

    cmp_dir = tmp_path / "cmp"
    assert main(["compare", str(p), "--out", str(cmp_dir), "--quiet"]) == 0
    agg = json.loads((cmp_dir / "summary.json").read_text())
    assert set(agg["algorithms"]) == {"FedAvg", "FedADMM"}
    st = agg["algorithms"]["FedAvg"]["final"]["test_accuracy"]
    assert {"mean", "std", "n"} <= set(st) and st["n"] == 2
    rep = (cmp_dir / "report.md").read_text()
    assert "±" in rep and "**" in rep and "plots/test_accuracy.png" in rep
    assert (cmp_dir / "plots" / "test_accuracy.png").exists()
    (cmp_dir / "report.md").unlink()
    assert main(["report", str(cmp_dir)]) == 0 and (cmp_dir / "report.md").exists()
    # --only runs a subset of the config's algorithms; an unknown label is a config error naming the allowed
    only_dir = tmp_path / "only"
    assert main(["compare", str(p), "--only", "FedADMM", "--out", str(only_dir), "--quiet"]) == 0
    assert set(json.loads((only_dir / "summary.json").read_text())["algorithms"]) == {"FedADMM"}
    assert main(["compare", str(p), "--only", "Nope", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "--only 'Nope'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "fedadmm" in listed and "dirichlet" in listed and "digits" in listed and "lenet" in listed


def test_cli_config_error_exit_code(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_with("data.partition", "nope")))
    assert main(["run", str(p), "--quiet"]) == 2
    assert "data.partition" in capsys.readouterr().err


def test_cli_divergence_exit_code(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(apply_overrides(BASE, ["defaults.lr=1e7", "simulation.rounds=20",
                                                       "model.name=mlp"])))
    out = tmp_path / "div"
    assert main(["run", str(p), "--out", str(out), "--quiet", "--algorithm", "FedAvg"]) == 3
    assert "diverged" in capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "diverged" and "learning rate" in s["message"]


def test_bad_data_params_are_config_errors(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    raw = apply_overrides(BASE, ['data.dataset=synthetic_fpfc', 'data.num_clients=20'])
    p.write_text(yaml.safe_dump(raw))   # BASE's dirichlet partition: refused first (the dataset comes split)
    assert main(["run", str(p), "--quiet", "--out", str(tmp_path / "o"), "--algorithm", "FedAvg"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.partition:" in err and "'dirichlet'" in err and "allowed:" in err, err
    raw["data"] = {k: v for k, v in raw["data"].items() if not k.startswith("partition")}
    p.write_text(yaml.safe_dump(raw))
    assert main(["run", str(p), "--quiet", "--out", str(tmp_path / "o2"), "--algorithm", "FedAvg"]) == 2
    err = capsys.readouterr().err
    assert "data:" in err and "num_clients" in err


def test_blowup_in_first_round_is_divergence(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(apply_overrides(BASE, ["defaults.lr=1e6", "simulation.rounds=3"])))
    assert main(["run", str(p), "--out", str(tmp_path / "d"), "--quiet", "--algorithm", "FedAvg"]) == 3


@pytest.mark.slow
def test_cli_import_plugin_algorithm(tmp_path, monkeypatch):
    """`fedsolve --import MODULE` registers a user's algorithm (docs/writing-an-algorithm.md)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "examples"))
    assert main(["--import", "my_fedavgm", "run", str(root / "examples" / "my_fedavgm.yaml"), "--quiet",
                 "--out", str(tmp_path / "o"), "--set", "simulation.rounds=2"]) == 0
    assert (tmp_path / "o" / "summary.json").exists()
    # the worker processes of `compare --jobs` import the user's module too
    assert main(["--import", "my_fedavgm", "compare", str(root / "examples" / "my_fedavgm.yaml"), "--jobs", "2",
                 "--out", str(tmp_path / "c"), "--set", "simulation.rounds=2", "--set", "seeds=[0,1]"]) == 0
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["algorithms"]["my_fedavgm"]["runs"] == 2


@pytest.mark.slow
def test_compare_jobs_runs_in_worker_processes_with_the_same_numbers(tmp_path, capsys):
    """--jobs 2: the algorithm x seed runs in two worker processes; the numbers are those of one process with the
    same thread count; --resume keeps finished runs; a bad --jobs names the flag."""
    cfg = _with("threads", 1)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    assert main(["compare", str(p), "--out", str(tmp_path / "one"), "--quiet"]) == 0
    assert main(["compare", str(p), "--out", str(tmp_path / "two"), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "FedADMM seed 1 done" in out
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    for label in ("FedAvg", "FedADMM"):
        assert one["algorithms"][label]["final"] == two["algorithms"][label]["final"]
    for seed in (0, 1):
        a = (tmp_path / "one" / "FedAvg" / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
        b = (tmp_path / "two" / "FedAvg" / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["test_accuracy"] for x in a] == [json.loads(x)["test_accuracy"] for x in b]
    assert (tmp_path / "two" / "report.md").exists()
    assert main(["compare", str(p), "--out", str(tmp_path / "two"), "--jobs", "2", "--resume"]) == 0
    assert "done" not in capsys.readouterr().out          # everything kept, nothing run again
    assert main(["compare", str(p), "--out", str(tmp_path / "x"), "--jobs", "0"]) == 2
    assert "--jobs: expected a whole number >= 1" in capsys.readouterr().err
