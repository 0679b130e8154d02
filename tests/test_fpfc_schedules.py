"""FPFC's protocols as schedules of the engine's one loop (families/clustered/protocols): the warmup lambda path,
the lambda grid, asyncFPFC's event loop, synchronous FPFC on its virtual clock and a budget of local steps. Interrupted (Ctrl-C) and resumed,
each gives the uninterrupted run's records and states; a config selects one and a bad one is one line, exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedsolve.cli import main
from fedsolve.data.synthetic import clustered_regression
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.loop import RunInterrupted
from fedsolve.engine.schedules import make_schedule
from fedsolve.families import get_algorithm
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem


def regression():
    data = clustered_regression(seed=0, cluster_sizes=(3, 3), dim=3, samples_per_client=40, noise_std=0.1,
                                center_scale=3.0)
    return FederatedProblem(data, build_model_fn("logreg", (3,), 1), loss="squared_error")


#: kind -> (algorithm, its params, the schedule's params, simulation settings, rounds after which Ctrl-C comes)
SPECS = {
    "warmup_path": ("fpfc", dict(lam=0.0, lr=0.1),
                    dict(grid=[0.0, 0.5, 1.0, 50.0], check_every=2, min_rounds=4, max_rounds_per_lambda=8, tol=1e-3),
                    dict(rounds=40, eval_every=3, sampling={"fraction": 0.5}), (5, 19, 29)),   # switches: 8, 16, 24
    "lambda_grid": ("fpfc", dict(lam=0.0, lr=0.1), dict(grid=[0.0, 0.5, 1.0], rounds=6),
                    dict(rounds=18, eval_every=4, sampling={"fraction": 0.5}), (7, 14)),
    "async_fpfc": ("async_fpfc", dict(lam=0.5, lr=0.1),
                   dict(delay_high=20.0, horizon=150.0, eval_every=20.0, delay_mode="redraw"),
                   dict(rounds=100000), (23, 61)),
    "virtual_clock": ("fpfc", dict(lam=0.5, lr=0.1), dict(delay_high=20.0, horizon=200.0, delay_mode="redraw"),
                      dict(rounds=100, eval_every=3, sampling={"clients_per_round": 2}), (8,)),
    "local_budget": ("fpfc", dict(lam=0.5, lr=0.1, local_schedule="growing", growth_rounds=2.0, growth_offset=1),
                     dict(total_steps=40), dict(rounds=100, eval_every=2, sampling={"fraction": 0.5}), (3, 9)),
}


class CtrlC:
    """Callback: Ctrl-C right after round ``k``."""

    def __init__(self, k: int):
        self.k = k

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        if round_ + 1 == self.k:
            raise KeyboardInterrupt

    def on_eval(self, sim, record):
        pass

    def on_end(self, sim):
        pass


def _sim(prob, kind, out, callbacks=()):
    name, params, sched, sim_cfg, _ = SPECS[kind]
    algo = get_algorithm(name)(params, prob)
    cfg = SimulationConfig(metrics=[], executor="sequential", **sim_cfg)
    return Simulation(prob, algo, cfg, seed=2, out_dir=out, callbacks=list(callbacks),
                      schedule=make_schedule({"kind": kind, **sched}, algo, cfg))


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_interrupted_schedule_resumes_to_the_uninterrupted_run(kind, tmp_path):
    prob = regression()
    full_sim = _sim(prob, kind, tmp_path / "full")
    full = full_sim.run()
    assert len(full.history) >= 4
    for k in SPECS[kind][-1]:
        out = tmp_path / f"ctrl_c_{k}"
        with pytest.raises(RunInterrupted):
            _sim(prob, kind, out, [CtrlC(k)]).run()
        sim = _sim(prob, kind, out)
        res = sim.run(resume=True)
        assert 0 < sim.start_round <= k
        assert json.dumps(res.history) == json.dumps(full.history), (kind, k)
        assert json.dumps(res.extras) == json.dumps(full.extras), (kind, k)
        for key, v in full.server.items():
            assert torch.equal(res.server[key], v), (kind, k, key)
        assert sim.algo.cfg == full_sim.algo.cfg


def test_warmup_path_switches_logs_and_goes_back_to_the_best_lambdas_state():
    """The path of test_fpfc's regression: each lambda's score at its switch, the rounds of the switches, lam and the
    validation score in the records; after the drop the run continues from the best lambda's saved state."""
    prob = regression()
    sim = _sim(prob, "warmup_path", None)
    res = sim.run()
    path = sim.schedule
    lams = [lam for _, lam in path.switches]
    assert lams[:2] == [0.0, 0.5] and path.stopped and path.lam in (0.0, 0.5, 1.0)
    assert lams[-1] == path.lam and res.extras["best_lambda"] == path.lam and res.extras["lambda_chosen"]
    assert [s for _, s in path.scores][-1] < max(s for _, s in path.scores[:-1])   # the drop that chose lambda
    assert {"lam", "val_accuracy"} <= set(res.history[-1]) and sim.algo.cfg.lam == path.lam
    # the state the run continued from is the one saved when the best lambda finished
    back = path.switches[-1][0]
    again = _sim(prob, "warmup_path", None)
    again.cfg = again.cfg.model_copy(update={"rounds": back})
    again.run()
    assert torch.equal(again.schedule.best[2]["W"], path.best[2]["W"])


def test_warmup_path_that_runs_out_of_rounds_chooses_a_lambda_it_scored():
    """The cap of 8 rounds per lambda ends lambda 0.5 exactly at the last round (16): the path scores it there and
    chooses the better of 0.5 and 0.0 with that lambda's state, never switching to 1.0, which it would not train."""
    prob = regression()
    name, params, sched, sim_cfg, _ = SPECS["warmup_path"]
    algo = get_algorithm(name)(params, prob)
    cfg = SimulationConfig(metrics=[], executor="sequential", **dict(sim_cfg, rounds=16))
    sim = Simulation(prob, algo, cfg, seed=2, schedule=make_schedule({"kind": "warmup_path", **sched}, algo, cfg))
    res = sim.run()
    path = sim.schedule
    assert [lam for lam, _ in path.scores] == [0.0, 0.5] and path.stopped
    best_lam = max(path.scores, key=lambda p: p[1])[0]
    assert path.lam == best_lam == sim.algo.cfg.lam == res.extras["best_lambda"]
    assert 1.0 not in [lam for _, lam in path.switches]
    assert torch.equal(sim.state()[0]["W"], path.best[2]["W"])   # the run ends in the chosen lambda's state


def test_async_events_one_device_per_round_on_the_virtual_clock():
    prob = regression()
    sim = _sim(prob, "async_fpfc", None)
    seen = []
    sim.callbacks.append(type("Ids", (CtrlC,), {"on_round": lambda self, s, r, info: seen.append(info["ids"])})(0))
    res = sim.run()
    assert all(ids.numel() == 1 for ids in seen) and len(seen) == sim.round
    times = [r["virtual_time"] for r in res.history[1:]]      # the first record is before any event
    assert times[:3] == [20.0, 40.0, 60.0] and times[-1] == 150.0
    assert [r["round"] for r in res.history] == sorted({r["round"] for r in res.history})
    assert sim.schedule.now <= 150.0 < sim.schedule.heap[0][0]   # the next upload would arrive after the horizon
    assert res.history[-1]["test_rmse"] < res.history[0]["test_rmse"]


@pytest.mark.parametrize("params,budget,rounds", [
    (dict(local_steps=5), 1000, 200), (dict(local_steps=10), 1000, 100),          # Sec. 6.4.4, MNIST: 200, 100, 63
    (dict(local_schedule="growing", growth_rounds=2.0, growth_offset=1), 1000, 63),
    (dict(local_schedule="growing", growth_rounds=20.0, growth_offset=1), 10_000, 623),   # sum ceil(k/20) >= 1e4
    (dict(local_schedule="growing", growth_rounds=1.0, growth_offset=1), 800, 40),        # H&BF: T_k = k + 1
])
def test_local_budget_ends_the_run_when_its_local_steps_are_spent(params, budget, rounds):
    """The paper's round counts for K x T fixed, the running total in the records, the last round evaluated."""
    from fedsolve.families.clustered.protocols.budget import rounds_for, steps_at

    prob = regression()
    algo = get_algorithm("fpfc")(dict(lam=0.5, lr=0.1, **params), prob)
    assert rounds_for(algo, budget, 10_000) == rounds
    assert sum(steps_at(algo, k) for k in range(rounds - 1)) < budget <= sum(steps_at(algo, k) for k in range(rounds))
    if rounds > 100:
        return
    cfg = SimulationConfig(metrics=[], executor="sequential", rounds=500, eval_every=7, sampling={"fraction": 0.5})
    sim = Simulation(prob, algo, cfg, seed=0, schedule=make_schedule({"kind": "local_budget", "total_steps": budget},
                                                                      algo, cfg))
    res = sim.run()
    assert sim.round == rounds and res.history[-1]["round"] == rounds
    assert res.history[-1]["local_steps"] == sum(steps_at(algo, k) for k in range(rounds)) >= budget
    assert res.extras["local_budget"] == budget


def _config(tmp_path, algorithm: dict, rounds: int = 12, name: str = "fpfc.yaml") -> str:
    cfg = {"name": "schedules", "threads": 1,
           "data": {"dataset": "clustered_regression", "num_clients": None,
                    "params": {"cluster_sizes": [3, 3], "dim": 3, "samples_per_client": 40, "center_scale": 3.0}},
           "model": {"name": "logreg"}, "problem": None,
           "simulation": {"rounds": rounds, "eval_every": 3, "metrics": [], "sampling": {"fraction": 0.5}},
           "algorithm": algorithm}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


PATH = {"name": "fpfc", "params": {"lam": 0.0, "lr": 0.1},
        "schedule": {"kind": "warmup_path", "grid": [0.0, 0.5, 1.0], "check_every": 2, "max_rounds_per_lambda": 4}}


def test_a_config_selects_a_schedule_and_its_saved_config_reruns_it(tmp_path):
    out = tmp_path / "run"
    assert main(["run", _config(tmp_path, PATH), "--out", str(out), "--quiet"]) == 0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["lam"] for r in recs[1:3]] == [0.0, 0.5] and "val_accuracy" in recs[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["extras"]["switches"][:2] == [[0, 0.0], [4, 0.5]]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["algorithm"]["schedule"] == PATH["schedule"]
    again = tmp_path / "again"
    assert main(["run", str(out / "config.yaml"), "--out", str(again), "--quiet"]) == 0
    assert (again / "metrics.jsonl").read_bytes() == (out / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("algorithm,rounds,words", [
    (dict(PATH, schedule={"kind": "nope"}), 12, "algorithm.schedule.kind: unknown 'nope'; allowed: ["),
    (dict(PATH, schedule={"kind": "warmup_path", "grid": []}), 12, "algorithm.schedule.grid"),
    (dict(PATH, schedule={"kind": "warmup_path", "grid": [0.5], "every": 2}), 12, "algorithm.schedule.every"),
    (dict(PATH, schedule={"kind": "warmup_path", "grid": [0.5], "val_problem": "x"}), 12,
     "algorithm.schedule.val_problem: Extra inputs are not permitted"),
    ({"name": "fedavg", "schedule": {"kind": "warmup_path", "grid": [0.5]}}, 12,
     "algorithm.schedule.kind: warmup_path moves FPFC's fusion penalty lam, which fedavg does not have"),
    (dict(PATH, schedule={"kind": "lambda_grid", "grid": [0.0, 0.5], "rounds": 5}), 12,
     "simulation.rounds: the lambda grid takes 10 rounds (2 lambdas x 5); got 12"),
    (dict(PATH, schedule={"kind": "async_fpfc"}), 12, "algorithm.schedule.kind: async_fpfc needs asyncFPFC's server"),
    ({"name": "async_fpfc", "schedule": {"kind": "async_fpfc", "delay_low": 5.0, "delay_high": 1.0}}, 12,
     "algorithm.schedule.delay_high: Value error, below delay_low 5.0"),
    ({"name": "fpfc", "schedule": {"kind": "local_budget", "total_steps": 100}}, 12,
     "algorithm.schedule.kind: local_budget counts local steps, but fpfc's phase 'train' runs epochs"),
    ({"name": "fpfc", "params": {"local_steps": 5}, "schedule": {"kind": "local_budget", "total_steps": 100}}, 12,
     "simulation.rounds: 12 rounds spend 60 local steps, below the budget schedule.total_steps = 100"),
    ({"name": "fpfc", "params": {"local_steps": 5}, "schedule": {"kind": "local_budget", "total_steps": 0}}, 12,
     "algorithm.schedule.total_steps"),
])
def test_bad_schedules_are_one_line_exit_2(tmp_path, capsys, algorithm, rounds, words):
    assert main(["run", _config(tmp_path, algorithm, rounds), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


BUDGET_TUNED = {"name": "fpfc", "params": {"lam": 0.5, "lr": 0.1, "local_steps": 5},
                "schedule": {"kind": "local_budget", "total_steps": 30},
                "tune": {"param": "lam", "grid": [0.25, 0.5, 1.0]}}


def test_a_budget_run_tunes_on_validation_runs_of_the_same_budget(tmp_path):
    """Tuning runs under a local budget spend the same budget (6 rounds of 5 steps) as the run at the pick."""
    out = tmp_path / "cmp"
    assert main(["compare", _config(tmp_path, BUDGET_TUNED), "--out", str(out), "--quiet"]) == 0
    summary = json.loads(next(out.rglob("seed0/summary.json")).read_text())
    tuned = summary["extras"]["tuned"]
    assert tuned["grid"] == [0.25, 0.5, 1.0] and tuned["value"] in tuned["grid"] and None not in tuned["scores"]
    for d in (out.rglob("tune/lam_*")):
        last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["round"] == 6 and last["local_steps"] == 30.0


def test_tuning_rounds_that_do_not_fit_a_budget_name_tune_rounds(tmp_path, capsys):
    algorithm = dict(BUDGET_TUNED, tune=dict(BUDGET_TUNED["tune"], rounds=3))
    assert main(["compare", _config(tmp_path, algorithm), "--out", str(tmp_path / "cmp"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert ("algorithm.tune.rounds: 3 tuning rounds do not fit algorithm.schedule (3 rounds spend 15 local steps, "
            "below the budget schedule.total_steps = 30); allowed: null") in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_fedsolve_list_shows_the_schedules_and_the_wrappers(capsys):
    assert main(["list", "schedules"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in ("warmup_path", "lambda_grid", "async_fpfc", "virtual_clock", "local_budget"))
    assert main(["list", "wrappers"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in ("attack", "dp", "server_opt"))


# ------------------------------------------------------------------ Ctrl-C through the CLI (a child process)
CLI = {
    "warmup_path": ({"name": "fpfc", "params": {"lam": 0.0, "lr": 0.1, "local_epochs": 2},
                     "schedule": {"kind": "warmup_path", "grid": [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
                                  "check_every": 2, "max_rounds_per_lambda": 10}}, 200),
    "async_fpfc": ({"name": "async_fpfc", "params": {"lam": 0.5, "lr": 0.1, "local_epochs": 2},
                    "schedule": {"kind": "async_fpfc", "delay_high": 20.0, "horizon": 150.0, "eval_every": 10.0,
                                 "delay_mode": "redraw"}}, 1000000),
}


def _cli_config(tmp_path, kind: str) -> str:
    algorithm, rounds = CLI[kind]
    cfg = {"name": kind, "threads": 1,
           "data": {"dataset": "synthetic_fpfc", "num_clients": None,
                    "params": {"scenario": "S1", "size_scale": 0.05, "max_size": 60}},
           "model": {"name": "logreg"},
           "simulation": {"rounds": rounds, "eval_every": 5, "metrics": [], "sampling": {"fraction": 0.3}},
           "algorithm": algorithm}
    p = tmp_path / f"{kind}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def _ctrl_c_once(cmd: list[str], out: Path, tmp_path) -> tuple[int, str]:
    """Start ``cmd`` in a child process and send it SIGINT once ``out`` holds three evaluation records."""
    # a user's Ctrl-C reaches a foreground process whose SIGINT is not ignored; code that ran earlier in this
    # pytest process may leave SIGINT ignored, and children inherit that
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics, t_end = out / "metrics.jsonl", time.time() + 180
    while time.time() < t_end and proc.poll() is None and not (
            metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.isolated
@pytest.mark.parametrize("kind", sorted(CLI))
def test_ctrl_c_and_resume_through_the_cli_give_the_uninterrupted_metrics(kind, tmp_path):
    """``fedsolve run`` of a lambda path and of an asyncFPFC run, interrupted with Ctrl-C (SIGINT to the child) and
    continued with ``--resume``: metrics.jsonl byte for byte the uninterrupted run's."""
    cfg = _cli_config(tmp_path, kind)
    cut = tmp_path / "cut"
    rc, err = _ctrl_c_once([sys.executable, "-m", "fedsolve.cli", "run", cfg, "--out", str(cut), "--quiet"], cut,
                           tmp_path)
    assert rc == 130 and "continue with --resume" in err and "Traceback" not in err, err
    ck = torch.load(cut / "checkpoint.pt", weights_only=False)
    assert ck["round"] > 0 and ck["schedule"], ck["round"]
    assert main(["run", cfg, "--out", str(cut), "--quiet", "--resume"]) == 0
    whole = tmp_path / "whole"
    assert main(["run", cfg, "--out", str(whole), "--quiet"]) == 0
    assert (cut / "metrics.jsonl").read_bytes() == (whole / "metrics.jsonl").read_bytes()
    done = json.loads((whole / "summary.json").read_text())
    assert json.loads((cut / "summary.json").read_text())["extras"] == done["extras"]
    if kind == "warmup_path":
        assert done["extras"]["lambda_chosen"] and len(done["extras"]["switches"]) > 2


@pytest.mark.parametrize("algorithm", [
    {"name": "fpfc", "label": "budget", "params": {"lam": 0.5, "lr": 0.1, "local_steps": 3},
     "schedule": {"kind": "local_budget", "total_steps": 15}},
    {"name": "async_fpfc", "label": "async", "params": {"lam": 0.5, "lr": 0.1},
     "schedule": {"kind": "async_fpfc", "delay_high": 20.0, "horizon": 60.0, "eval_every": 20.0}},
])
def test_a_run_its_schedule_ended_is_finished_and_resume_keeps_it(tmp_path, algorithm):
    """A run that its schedule ended before simulation.rounds (a spent budget, the virtual horizon) is finished:
    a suite or compare resumed over it keeps it as it is (no extra round, the same files)."""
    cfg = yaml.safe_load(Path(_config(tmp_path, algorithm, rounds=1000)).read_text())
    cfg["algorithms"] = [cfg.pop("algorithm")]
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    run = out / algorithm["label"] / "seed0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["rounds"] < 1000
    before = (run / "metrics.jsonl").read_bytes()
    assert main(["compare", str(path), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (run / "metrics.jsonl").read_bytes() == before
    assert json.loads((run / "summary.json").read_text())["rounds"] == summary["rounds"]
