"""Never lose a result (issue 30): safe re-runs, checked resumes, errors instead of tracebacks, exact numerics,
readable results; and no side effects on import (issue 29)."""

from __future__ import annotations

import filecmp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedsolve.cli import build_parser, main
from fedsolve.experiments.config import apply_overrides

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "experiments" / "demo.yaml")

BASE = {
    "name": "tiny",
    "seeds": [0],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "logreg"},
    "simulation": {"rounds": 3, "eval_every": 2, "sampling": {"fraction": 0.5}},
    "defaults": {"lr": 0.1, "batch_size": 16},
    "algorithms": [{"name": "fedavg", "label": "FedAvg"}, {"name": "fedprox", "label": "FedProx",
                                                          "params": {"mu": 0.01}}],
}


def _cfg(tmp_path, *overrides, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(apply_overrides(BASE, list(overrides))))
    return str(p)


# ------------------------------------------------------------------ results are never lost or mislabeled
def test_compare_into_an_existing_folder_refuses_without_overwrite(tmp_path, capsys):
    p, out = _cfg(tmp_path), str(tmp_path / "cmp")
    assert main(["compare", p, "--out", out, "--quiet"]) == 0
    before = (tmp_path / "cmp" / "FedAvg" / "seed0" / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["compare", p, "--out", out, "--quiet"]) == 2          # the same runs again
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert main(["compare", p, "--out", out, "--quiet", "--set", "defaults.lr=0.05"]) == 2   # another config
    err = capsys.readouterr().err
    assert "defaults.lr (0.1 -> 0.05)" in err and "--overwrite" in err and "Traceback" not in err, err
    assert (tmp_path / "cmp" / "FedAvg" / "seed0" / "metrics.jsonl").read_bytes() == before
    assert main(["compare", p, "--out", out, "--quiet", "--resume", "--overwrite"]) == 2
    assert "contradict" in capsys.readouterr().err
    assert main(["run", p, "--algorithm", "FedAvg", "--out", str(tmp_path / "r"), "--resume", "--overwrite"]) == 2
    assert main(["compare", p, "--out", out, "--quiet", "--overwrite", "--set", "defaults.lr=0.05"]) == 0
    assert (tmp_path / "cmp" / "FedAvg" / "seed0" / "metrics.jsonl").read_bytes() != before


def test_resume_refuses_a_config_that_changes_the_numbers(tmp_path, capsys):
    p, out = _cfg(tmp_path), tmp_path / "run"
    run = ["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet"]
    assert main(run) == 0
    files = {f: (out / f).read_bytes() for f in ("config.yaml", "metrics.jsonl", "per_client.json", "summary.json")}
    assert json.loads(files["per_client.json"])           # one record per client
    capsys.readouterr()
    # a changed learning rate, seed, client count or model: refused, naming the fields; nothing is rewritten
    for sets, field in ((["defaults.lr=0.2"], "algorithm.params.lr"), (["data.num_clients=5"], "data.num_clients"),
                        (["model.name=mlp"], "model.name"), (["simulation.executor=sequential"],
                                                             "simulation.executor")):
        assert main(run + ["--resume"] + [x for s in sets for x in ("--set", s)]) == 2, sets
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err, err
    assert main(run + ["--resume", "--seed", "1"]) == 2
    assert "seeds" in capsys.readouterr().err
    assert {f: (out / f).read_bytes() for f in files} == files
    # resuming a finished run with the same config: nothing re-runs, per_client.json is kept
    assert main(run + ["--resume"]) == 0
    assert (out / "per_client.json").read_bytes() == files["per_client.json"]
    assert (out / "metrics.jsonl").read_bytes() == files["metrics.jsonl"]
    # fewer rounds than done: refused; more rounds and a cosmetic change: allowed
    assert main(run + ["--resume", "--set", "simulation.rounds=2"]) == 2
    assert "simulation.rounds" in capsys.readouterr().err
    assert main(run + ["--resume", "--set", "simulation.rounds=5", "--set", "description=longer"]) == 0
    assert json.loads((out / "summary.json").read_text())["rounds"] == 5
    # compare --resume likewise: a finished compare with a changed lr is refused, naming the field
    cmp_dir = str(tmp_path / "cmp")
    assert main(["compare", p, "--out", cmp_dir, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", p, "--out", cmp_dir, "--quiet", "--resume", "--set", "algorithms.1.params.mu=0.5"]) == 2
    assert "algorithms[FedProx].params.mu (0.01 -> 0.5)" in capsys.readouterr().err
    assert main(["compare", p, "--out", cmp_dir, "--quiet", "--resume", "--set", "simulation.rounds=4"]) == 0
    agg = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert agg["algorithms"]["FedProx"]["final"]["test_accuracy"]["n"] == 1
    assert json.loads((tmp_path / "cmp" / "FedProx" / "seed0" / "summary.json").read_text())["rounds"] == 4


def test_resume_rejects_a_checkpoint_of_another_run_or_a_broken_one(tmp_path, capsys):
    p = _cfg(tmp_path)
    out = tmp_path / "run"
    assert main(["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet"]) == 0
    good = (out / "checkpoint.pt").read_bytes()
    # without config.yaml only the checkpoint itself can tell: another algorithm, client count, model
    (out / "config.yaml").unlink()
    for args, words in ((["--algorithm", "FedProx"], "algorithm"), (["--set", "data.num_clients=5"], "num_clients"),
                        (["--set", "model.name=mlp"], "dim")):
        args = args if args[0] == "--algorithm" else args + ["--algorithm", "FedAvg"]
        assert main(["run", p, "--out", str(out), "--quiet", "--resume"] + args) == 2, args
        err = capsys.readouterr().err
        assert words in err and "another run" in err and "Traceback" not in err, err
    for broken in (good[: len(good) // 2], b"garbage", b""):
        (out / "checkpoint.pt").write_bytes(broken)
        assert main(["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet", "--resume"]) == 2
        err = capsys.readouterr().err
        assert "unreadable" in err and "--overwrite" in err and "Traceback" not in err, err


def test_resume_from_a_checkpoint_whose_state_has_other_names_is_refused(tmp_path, capsys):
    """A checkpoint written by another version of the algorithm (its server state under other names) is refused
    with the names, not run into a KeyError at the first round."""
    p = _cfg(tmp_path, "simulation.rounds=2")
    out = tmp_path / "run"
    assert main(["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet"]) == 0
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    ck["server"] = {f"{k}_old": v for k, v in ck["server"].items()}
    torch.save(ck, out / "checkpoint.pt")
    (out / "summary.json").unlink()
    capsys.readouterr()
    assert main(["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet", "--resume",
                 "--set", "simulation.rounds=3"]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "another version" in err and "_old" in err and "Traceback" not in err, err


def _sigint_after(cmd: list[str], ready, tmp_path, sig=signal.SIGINT) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # a user's Ctrl-C reaches a foreground process whose SIGINT is not ignored; code that ran earlier in this
    # pytest process (in-process Flower apps set SIG_IGN) may leave SIGINT ignored, and children inherit that
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t_end = time.time() + 120
    while not ready() and time.time() < t_end and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)
    t0 = time.perf_counter()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.isolated
def test_ctrl_c_stops_at_once_keeps_the_checkpoint_and_says_how_to_continue(tmp_path):
    p = _cfg(tmp_path, "simulation.rounds=100000", "simulation.eval_every=50", "model.name=mlp")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedsolve.cli", "run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet"]
    rc, err, dt = _sigint_after(cmd, lambda: len((out / "metrics.jsonl").read_text().splitlines()) >= 2
                                if (out / "metrics.jsonl").exists() else False, tmp_path)
    assert rc == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted at round" in err and "continue with --resume" in err, err
    assert dt < 2.5, dt
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["round"] >= 50 and ck["round"] % 50 == 0
    assert f"last checkpoint: round {ck['round']}" in err


def _endless_compare(tmp_path):
    """A two-worker compare that would run for hours, and a function listing its runs' metrics files."""
    p = _cfg(tmp_path, "simulation.rounds=100000", "simulation.eval_every=50", "seeds=[0,1]", "model.name=mlp")
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "fedsolve.cli", "compare", p, "--jobs", "2", "--out", str(out), "--quiet"]
    return cmd, lambda: list(out.glob("*/seed*/metrics.jsonl"))


def _nothing_written_any_more(metrics, wait: float = 1.5) -> bool:
    stamps = {f: f.stat().st_mtime_ns for f in metrics()}
    time.sleep(wait)
    return {f: f.stat().st_mtime_ns for f in metrics()} == stamps


@pytest.mark.slow
@pytest.mark.isolated
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_compare_jobs_2_at_once(tmp_path, sig):
    cmd, metrics = _endless_compare(tmp_path)
    rc, err, dt = _sigint_after(cmd, lambda: len(metrics()) >= 2, tmp_path, sig=sig)
    assert rc == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "continue with --resume" in err and dt < 2.5, (dt, err)
    assert _nothing_written_any_more(metrics)           # the workers are gone


@pytest.mark.slow
@pytest.mark.isolated
def test_workers_of_a_killed_compare_stop_by_themselves(tmp_path):
    """SIGKILL leaves the parent no chance to stop its workers: they notice the parent is gone and end."""
    cmd, metrics = _endless_compare(tmp_path)
    rc, _, _ = _sigint_after(cmd, lambda: len(metrics()) >= 2, tmp_path, sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL
    time.sleep(2.0)                                      # the watch polls every 0.5 s
    assert _nothing_written_any_more(metrics, wait=2.0)


# ------------------------------------------------------------------ errors, not tracebacks
DEMO_ONE = ["--algorithm", "FedProx", "--quiet", "--set", "simulation.rounds=1"]
BAD_INPUTS = [
    (["--set", "data.num_clients=900", "--set", "data.partition=iid", "--set", "data.partition_params={}"],
     "data.num_clients"),
    (["--set", "model.params.hidden=[10]"], "model.params"),
    (["--set", "simulation.sampling.fraction=null", "--set", "simulation.sampling.clients_per_round=50"],
     "simulation.sampling.clients_per_round"),
    (["--set", "algorithms.9.params.mu=1"], "algorithms.9"),
    (["--set", "seeds=[0,1"], "seeds"),
    (["--set", "simulation.executor=linear"], "simulation.executor"),
    (["--set", "algorithms.1.params.muu=1"], "params.muu"),
    (["--set", "defaults.lrr=1"], "defaults.lrr"),
    (["--set", "simulation.rounds=true"], "simulation.rounds"),
    (["--set", "algorithms.1.params.mu=true"], "params.mu"),
    (["--set", "simulation.sampling.dropout=0.999999"], "simulation.sampling.dropout"),
    (["--set", "data.dtype=float16"], "data.dtype"),
    (["--set", "model.personalization=foo"], "model.personalization"),
    (["--set", "model.blocks={personal: [nomatch]}"], "model.blocks"),
    (["--set", "model.params={fc_hidden: -3}"], "model.params"),
    (["--set", "data.transform_params.x=1"], "transform_params"),
    (["--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize("args, field", BAD_INPUTS, ids=[b[1] + str(i) for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_naming_the_field(args, field, tmp_path, capsys):
    assert main(["run", DEMO, "--out", str(tmp_path / "o")] + DEMO_ONE + args) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and "Traceback" not in err and "config: config" not in err, err
    assert "allowed" in err or "expected" in err or "should be" in err, err
    assert len(err.splitlines()) == 1, err


def test_typo_in_a_parameter_lists_that_algorithms_parameters(capsys, tmp_path):
    assert main(["run", DEMO, "--out", str(tmp_path / "o")] + DEMO_ONE + ["--set", "algorithms.1.params.muu=1"]) == 2
    err = capsys.readouterr().err
    assert "'mu'" in err and "'seeds'" not in err and not err.startswith("config error: config:"), err


def test_bad_paths_and_imports_are_errors(tmp_path, capsys):
    p = _cfg(tmp_path)
    (tmp_path / "afile").write_text("x")
    cases = [
        (["run", str(tmp_path), "--quiet"], "is a folder"),
        (["run", p, "--algorithm", "FedAvg", "--quiet", "--out", str(tmp_path / "afile" / "run")], "--out"),
        (["compare", p, "--quiet", "--out", str(tmp_path / "afile" / "cmp")], "--out"),
        (["--import", "no_such_module_xyz", "list"], "no_such_module_xyz"),
        (["--import", str(tmp_path / "missing.py"), "list"], "missing.py"),
        (["run", p, "--algorithm", "FedAvg", "--quiet", "--out", str(tmp_path / "afile")], "it is a file"),
        (["run", p, "--algorithm", "FedAvg", "--quiet", "--set", "simulation..rounds=2"], "empty part"),
        (["report", str(tmp_path / "broken")], "fedsolve report"),
        (["report", str(tmp_path / "nothing-here")], "no summary.json"),
    ]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    if os.geteuid() != 0:                                # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((["run", p, "--algorithm", "FedAvg", "--quiet", "--out", str(ro / "run")], "--out"))
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, (argv, err)


def test_import_of_a_file_path_registers_its_algorithms(tmp_path):
    plugin = ROOT / "examples" / "my_fedavgm.py"
    assert main(["--import", str(plugin), "run", str(ROOT / "examples" / "my_fedavgm.yaml"), "--quiet",
                 "--out", str(tmp_path / "o"), "--set", "simulation.rounds=1"]) == 0


def test_dropout_that_empties_some_rounds_warns(tmp_path, capsys):
    p = _cfg(tmp_path, "simulation.sampling.dropout=0.9", "simulation.rounds=6", "seeds=[3]")
    assert main(["run", p, "--algorithm", "FedAvg", "--quiet", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "no participant" in err, err


# ------------------------------------------------------------------ reading results
def test_metrics_are_byte_identical_across_identical_runs(tmp_path):
    p = _cfg(tmp_path)
    for d in ("a", "b"):
        assert main(["run", p, "--algorithm", "FedProx", "--quiet", "--out", str(tmp_path / d)]) == 0
    assert filecmp.cmp(tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl", shallow=False)
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    timings = [json.loads(x) for x in (tmp_path / "a" / "timings.jsonl").read_text().splitlines()]
    assert all("time_s" not in r for r in lines)
    assert [t["round"] for t in timings] == [r["round"] for r in lines] and all(t["time_s"] >= 0 for t in timings)
    assert main(["report", str(tmp_path / "a")]) == 0


def test_version_and_help_for_every_argument(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    from fedsolve import __version__

    assert capsys.readouterr().out.strip() == f"fedsolve {__version__}"
    parser = build_parser()
    subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"][0]
    for name, sp in [("fedsolve", parser)] + list(subs.choices.items()):
        for a in sp._actions:
            if a.__class__.__name__ in ("_HelpAction", "_SubParsersAction"):
                continue
            assert a.help, (name, a.dest)


def test_python_api_runs_and_returns_the_trajectory(tmp_path):
    import fedsolve

    res = fedsolve.run(apply_overrides(BASE, []), algorithm="FedProx", seed=0, overrides=["simulation.rounds=2"])
    assert [r["round"] for r in res.history] == [0, 2] and "test_accuracy" in res.history[-1]
    params = res.eval_params()
    assert params.shape == (4, res.simulation.problem.layout.dim)
    assert torch.equal(params[0], res.server["w"])       # FedProx scores every client with the global model
    res2 = fedsolve.run(_cfg(tmp_path), algorithm="FedProx", overrides=["simulation.rounds=2"], out=tmp_path / "o")
    assert res2.history == res.history and (tmp_path / "o" / "metrics.jsonl").exists()


def test_compare_shows_run_k_of_n_and_wall_time(tmp_path, capsys):
    p = _cfg(tmp_path)
    assert main(["compare", p, "--out", str(tmp_path / "c")]) == 0
    cap = capsys.readouterr()
    assert "run 1 of 2" in cap.err and "run 2 of 2" in cap.err and "elapsed" in cap.err
    assert "wall time" in cap.out
    agg = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert agg["wall_time_s"] > 0 and agg["run_time_s"] > 0


def test_progress_bar_last_line_shows_the_final_metrics(tmp_path, capsys):
    p = _cfg(tmp_path, "simulation.rounds=5", "simulation.eval_every=2")
    assert main(["run", p, "--algorithm", "FedAvg", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    final = [json.loads(x) for x in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()][-1]
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "5/5" in last and f"test_accuracy={final['test_accuracy']:.4f}" in last, last


def test_compare_plot_gives_each_method_its_own_line_style_and_marker(tmp_path, monkeypatch):
    from fedsolve.experiments import report

    figs = []
    real = report.new_figure

    def keep(*a, **k):
        fig, ax = real(*a, **k)
        figs.append(ax)
        return fig, ax

    monkeypatch.setattr(report, "new_figure", keep)
    cfg = BASE | {"algorithms": [{"name": "fedavg", "label": f"A{i}"} for i in range(5)]}
    from fedsolve.experiments.config import parse_config

    hist = {f"A{i}": [[{"round": r, "test_accuracy": 0.5} for r in (0, 1, 2)]] for i in range(5)}
    agg = {"algorithms": {f"A{i}": {"final": {}, "best": {}, "uplink_bytes": 0.0} for i in range(5)}}
    report.write_compare_report(tmp_path, parse_config(cfg), agg, hist)
    lines = figs[0].get_lines()
    assert len(lines) == 5
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in lines}
    assert len(styles) == 5 and len({ln.get_marker() for ln in lines}) == 5


# ------------------------------------------------------------------ no side effects on import, no cycles
def test_import_has_no_side_effects_and_report_does_not_import_the_runner():
    code = ("import os, sys, matplotlib; be = lambda: dict.__getitem__(matplotlib.rcParams, 'backend'); b = be(); "
            "import fedsolve, fedsolve.cli, "
            "fedsolve.experiments.report as r, fedsolve.core.linear, fedsolve.core.allocator as lin; "
            "assert 'OMP_WAIT_POLICY' not in os.environ, 'OMP'; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot'; "
            "assert be() == b, 'backend'; "
            "assert not lin._MALLOC_TUNED, 'mallopt'; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "ok", out.stderr


def _imports(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_import_circle_between_report_and_runner():
    exp = ROOT / "src" / "fedsolve" / "experiments"
    assert "fedsolve.experiments.report" in _imports(exp / "runner.py")
    for mod in ("report.py", "folders.py"):
        assert not any(m.startswith("fedsolve.experiments.runner") for m in _imports(exp / mod)), mod


def test_atomic_io_lives_in_one_module():
    import fedsolve.engine.io as fio
    from fedsolve.engine import loop

    assert loop.atomic_write_text is fio.atomic_write_text and loop.atomic_torch_save is fio.atomic_torch_save


def test_linear_executor_tunes_malloc_only_when_a_round_runs(monkeypatch):
    from fedsolve.core import linear
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.runner import build_algorithm, build_problem
    from fedsolve.engine.loop import Simulation

    calls = []
    monkeypatch.setattr(linear, "keep_freed_memory", lambda *a: calls.append(1) or True)
    cfg = parse_config(apply_overrides(BASE, ["defaults.batch_size=null", "simulation.executor=linear"]))
    prob = build_problem(cfg, 0)
    sim = Simulation(prob, build_algorithm(cfg, cfg.algorithms[0], prob), cfg.simulation, 0)
    assert sim.executor.name == "linear" and calls == []      # building the run changes no process setting
    sim.run_round(0)
    assert calls                                             # the first round does


# ------------------------------------------------------------------ exact numerics: federated ridge regression

def test_vectorized_executor_tunes_malloc_only_when_a_round_runs(monkeypatch):
    """The vmap executor makes the same process-wide allocator setting as the linear one, at its first round."""
    from fedsolve.core import executor
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.runner import build_algorithm, build_problem
    from fedsolve.engine.loop import Simulation

    calls = []
    monkeypatch.setattr(executor, "keep_freed_memory", lambda *a: calls.append(1) or True)
    cfg = parse_config(apply_overrides(BASE, ["simulation.executor=vectorized"]))
    prob = build_problem(cfg, 0)
    sim = Simulation(prob, build_algorithm(cfg, cfg.algorithms[0], prob), cfg.simulation, 0)
    assert sim.executor.name == "vectorized" and calls == []  # building the run changes no process setting
    sim.run_round(0)
    assert calls  # the first round does
    sim.executor.tune_malloc, calls[:] = False, []
    sim.run_round(1)
    assert calls == []  # tune_malloc=False leaves the process as it is

def _ridge_problem(m=4, d=3, seed=0):
    from fedsolve.data.federated import FederatedData
    from fedsolve.problems import FederatedProblem

    g = torch.Generator().manual_seed(seed)
    sizes = [12, 25, 40, 17][:m]
    train, test = [], []
    for i, n in enumerate(sizes):          # heterogeneous clients: shifted features, different true models
        x = torch.randn(n, d, generator=g, dtype=torch.float64) + 0.2 * i
        w = torch.randn(d, generator=g, dtype=torch.float64) + i
        y = x @ w + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
        train.append((x, y))
        test.append((x[:3], y[:3]))
    data = FederatedData.from_client_arrays(train, test, task="regression", dtype=torch.float64)
    torch.manual_seed(0)
    prob = FederatedProblem(data=data, model_fn=lambda: torch.nn.Linear(d, 1).double(), loss="squared_error")
    return prob, train


def _quadratics(prob, train, wd):
    """Client i's loss (1/2n_i)||X~ theta - y||^2 + (wd/2)||theta||^2 as (H_i, g_i) in the flat layout."""
    w_first = prob.layout.names[0].endswith("weight")
    Hs, gs = [], []
    for x, y in train:
        one = torch.ones(x.shape[0], 1, dtype=torch.float64)
        X = torch.cat([x, one], 1) if w_first else torch.cat([one, x], 1)
        n = x.shape[0]
        Hs.append(X.T @ X / n + wd * torch.eye(X.shape[1], dtype=torch.float64))
        gs.append(X.T @ y / n)
    return Hs, gs


def _run(prob, name, params, rounds, executor="auto"):
    from fedsolve.families import get_algorithm
    from fedsolve.engine.loop import Simulation, SimulationConfig

    cls = get_algorithm(name)
    algo = cls(cls.Config(**params), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor,
                                                  metrics=[]), seed=0)
    sim.run()
    return sim.eval_params()[0]


@pytest.mark.parametrize("name, params, weighting, executor", [
    ("fedavg", {"local_steps": 1}, "samples", "auto"),
    ("fedavg", {"local_steps": 1}, "samples", "vectorized"),
    ("fedprox", {"local_steps": 1, "mu": 0.1}, "samples", "auto"),
    ("scaffold", {"local_steps": 5}, "uniform", "auto"),
    ("fedadmm", {"local_steps": 5, "rho": 1.0}, "uniform", "auto"),
    ("fedadmm", {"local_steps": 5, "rho": 1.0, "weighting": "samples"}, "samples", "auto"),
])
def test_federated_ridge_reaches_the_exact_optimum_in_float64(name, params, weighting, executor):
    wd = 0.1
    prob, train = _ridge_problem()
    assert prob.data.train_x.dtype == torch.float64 and prob.data.weights.dtype == torch.float64
    Hs, gs = _quadratics(prob, train, wd)
    n = torch.tensor([x.shape[0] for x, _ in train], dtype=torch.float64)
    p = n / n.sum() if weighting == "samples" else torch.full_like(n, 1 / len(n))
    opt = torch.linalg.solve(sum(pi * H for pi, H in zip(p, Hs)), sum(pi * g for pi, g in zip(p, gs)))
    other = torch.linalg.solve(sum(Hs), sum(gs)) if weighting == "samples" else \
        torch.linalg.solve(sum(ni * H for ni, H in zip(n, Hs)), sum(ni * g for ni, g in zip(n, gs)))
    assert (opt - other).abs().max() > 1e-2                  # the two optima are far apart: the test can tell
    got = _run(prob, name, {"lr": 0.4, "batch_size": None, "weight_decay": wd, **params}, rounds=200,
               executor=executor)
    assert got.dtype == torch.float64
    assert (got - opt).abs().max() < 1e-7, (got - opt).abs().max()


def test_fedavg_with_many_local_steps_stops_at_its_predicted_biased_fixed_point():
    """K local GD steps map theta to M_i theta + c_i with M_i = (I - lr H_i)^K, c_i = (I - M_i) H_i^{-1} g_i; the
    server's weighted mean has the fixed point (I - sum p_i M_i)^{-1} sum p_i c_i, not the optimum."""
    wd, lr, K = 0.1, 0.2, 10
    prob, train = _ridge_problem()
    Hs, gs = _quadratics(prob, train, wd)
    n = torch.tensor([x.shape[0] for x, _ in train], dtype=torch.float64)
    p = n / n.sum()
    eye = torch.eye(Hs[0].shape[0], dtype=torch.float64)
    Ms = [torch.linalg.matrix_power(eye - lr * H, K) for H in Hs]
    cs = [(eye - M) @ torch.linalg.solve(H, g) for M, H, g in zip(Ms, Hs, gs)]
    fixed = torch.linalg.solve(eye - sum(pi * M for pi, M in zip(p, Ms)), sum(pi * c for pi, c in zip(p, cs)))
    opt = torch.linalg.solve(sum(pi * H for pi, H in zip(p, Hs)), sum(pi * g for pi, g in zip(p, gs)))
    assert (fixed - opt).abs().max() > 1e-3                  # client drift: a visible bias
    got = _run(prob, "fedavg", {"lr": lr, "batch_size": None, "weight_decay": wd, "local_steps": K}, rounds=300)
    assert (got - fixed).abs().max() < 1e-7, (got - fixed).abs().max()


def test_dtype_float64_flows_from_the_config_to_data_model_and_linear_executor():
    from fedsolve.families import get_algorithm
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.runner import build_algorithm, build_problem
    from fedsolve.engine.loop import Simulation

    cfg = parse_config(apply_overrides(BASE, ["data.dtype=float64", "defaults.batch_size=null",
                                              "simulation.executor=linear", "simulation.rounds=2"]))
    prob = build_problem(cfg, 0)
    assert prob.data.train_x.dtype == torch.float64 and prob.data.weights.dtype == torch.float64
    assert all(q.dtype == torch.float64 for q in prob.model.parameters())
    algo = build_algorithm(cfg, cfg.algorithms[0], prob)
    sim = Simulation(prob, algo, cfg.simulation, 0)
    assert sim.executor.name == "linear" and sim.executor.dtype == torch.float64
    res = sim.run()
    assert res.server["w"].dtype == torch.float64 and get_algorithm("fedavg")
    w = algo.client_weights
    assert w.dtype == torch.float64 and abs(float(w.sum()) - 1.0) < 1e-15


def test_an_interrupted_run_resumes_to_byte_identical_metrics(tmp_path, monkeypatch, capsys):
    """Ctrl-C after round 5 (in-process: a callback raises KeyboardInterrupt): exit 130, the checkpoint of round 4
    is kept, and --resume ends with the same metrics.jsonl, byte for byte, as an uninterrupted run."""
    from fedsolve.experiments import runner

    p = _cfg(tmp_path, "simulation.rounds=6")
    run = ["run", p, "--algorithm", "FedProx", "--quiet"]
    assert main(run + ["--out", str(tmp_path / "whole")]) == 0

    class CtrlC(runner.ProgressBar):
        def on_round(self, sim, round_, info):
            if round_ == 4:
                raise KeyboardInterrupt

    monkeypatch.setattr(runner, "ProgressBar", CtrlC)
    assert main(run + ["--out", str(tmp_path / "cut")]) == 130
    err = capsys.readouterr().err
    assert "interrupted at round 5 (last checkpoint: round 4)" in err and "--resume" in err, err
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["round"] == 4
    monkeypatch.undo()
    assert main(run + ["--out", str(tmp_path / "cut"), "--resume"]) == 0
    assert filecmp.cmp(tmp_path / "whole" / "metrics.jsonl", tmp_path / "cut" / "metrics.jsonl", shallow=False)


def test_resume_accepts_a_folder_written_before_newer_config_fields(tmp_path):
    """A config.yaml written by an older fedsolve lacks fields added since (read with their defaults); it
    resumes, while a real difference in such a field is still refused."""
    p, out = _cfg(tmp_path, "simulation.rounds=2"), tmp_path / "run"
    run = ["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet"]
    assert main(run) == 0
    old = yaml.safe_load((out / "config.yaml").read_text())
    old["data"].pop("dtype")
    old.pop("problem", None)
    old["simulation"].pop("linear_kernel")
    (out / "config.yaml").write_text(yaml.safe_dump(old))
    assert main(run + ["--resume", "--set", "simulation.rounds=3"]) == 0
    (out / "config.yaml").write_text(yaml.safe_dump(old))
    assert main(run + ["--resume", "--set", "simulation.rounds=4", "--set", "simulation.linear_kernel=torch"]) == 2
