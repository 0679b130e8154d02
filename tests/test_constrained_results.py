"""What the former scripts under experiments/constrained computed, now in the family and reached by one command:
the grouping of finished runs into table cells (``runs.recorded_runs``) and the copy of their small files
(``args.copy_to`` of the ``constrained_runs`` protocol), Figures 1/2 of one run folder (``fedsolve report``), and
the exact optimum of Eq. 30 at n = 1 (``np_optimum``, the suite experiments/constrained/np_optimum.yaml)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsolve.families.constrained.runs import recorded_runs

ROOT = Path(__file__).resolve().parents[1]
T1 = ROOT / "experiments" / "constrained" / "table1_suite.yaml"


def _run(root: Path, folder: str, label: str, seed: int, n: int, objective: float, *, rounds=1500, dataset="monks1",
         algorithm="proxal", mtime=None, params=None) -> Path:
    d = root / folder / label.replace(" ", "_") / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"data": {"num_clients": n}, "simulation": {"rounds": rounds},
           "problem": {"kind": "neyman_pearson", "params": {"dataset": dataset, "r": 0.2}},
           "algorithm": {"name": algorithm, "params": params or {"inner_stop": "paper"}}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    cert = {"objective": objective, "kkt_eps1": 1e-3, "kkt_eps2": 1e-4, "c_client_mean[class-1 loss - r]": -0.01,
            "c_client_max[class-1 loss - r]": 0.0, "outer_iterations": 5, "admm_rounds": 450, "converged": 1,
            "inner_cap_hits": 0, "objective_clients": [objective / n] * n}
    (d / "summary.json").write_text(json.dumps({"label": label, "seed": seed, "algorithm": algorithm,
                                                "wall_time_s": 2.0, "extras": {"constrained": cert}}))
    (d / "metrics.jsonl").write_text(json.dumps({"round": 0, "objective": objective}) + "\n")
    if mtime is not None:
        os.utime(d / "summary.json", (mtime, mtime))
    return d


def test_recorded_runs_group_seeds_across_folders_keep_the_newest_and_split_variants(tmp_path):
    _run(tmp_path, "a", "Prox-AL FL", 0, 5, 1.0, mtime=1_000)
    _run(tmp_path, "b", "Prox-AL FL", 0, 5, 3.0, mtime=2_000)   # the same seed again, newer: this one counts
    _run(tmp_path, "c", "Prox-AL FL", 1, 5, 2.0)
    _run(tmp_path, "e", "Prox-AL FL", 0, 5, 9.0, rounds=8000)   # another budget: another cell
    _run(tmp_path, "f", "Prox-AL FL", 2, 5, 4.0, params={"inner_stop": "code", "eps_tilde": "code"})
    cells = recorded_runs([tmp_path])
    key = ("neyman_pearson", "monks1", 5, None, None, 1500)
    assert sorted(cells[key]["Prox-AL FL"]) == [0, 1]
    assert cells[key]["Prox-AL FL"][0][1]["extras"]["constrained"]["objective"] == 3.0
    assert cells[("neyman_pearson", "monks1", 5, None, None, 8000)]["Prox-AL FL"][0][1]["extras"]["constrained"][
        "objective"] == 9.0
    # the authors'-code stopping variant is another method, never the paper's Prox-AL FL
    assert sorted(cells[key]["Prox-AL FL [eps_tilde: code, inner_stop: code]"]) == [2]


def test_copy_to_copies_the_adopted_runs_small_files(tmp_path):
    from fedsolve.experiments.suite import main

    runs, raw = tmp_path / "runs", tmp_path / "raw"
    _run(runs, "t1_monks1_n5_s0", "Prox-AL FL", 0, 5, 1.0)
    _run(runs, "t1_monks1_n5_s0c", "cProx-AL", 0, 5, 1.0, algorithm="cproxal")
    rows = main(str(T1), out=str(tmp_path / "suite"), progress=False, sets=[
        "seeds=[0]", "sweep={problem.params.dataset: [monks1], data.num_clients: [5]}", f"args.adopt=[{runs}]",
        "args.adopt_only=true", '''algorithms=["Prox-AL FL", "cProx-AL"]''', f"args.copy_to={raw}"])
    assert {r["algorithm"]: r["adopted"] for r in rows} == {"Prox-AL FL": 1, "cProx-AL": 1}
    copied = raw / "t1_monks1_n5_s0" / "Prox-AL_FL" / "seed0"
    assert sorted(p.name for p in copied.iterdir()) == ["metrics.jsonl", "summary.json"]
    assert (copied / "summary.json").read_text() == (runs / "t1_monks1_n5_s0" / "Prox-AL_FL" / "seed0" /
                                                     "summary.json").read_text()


def test_fedsolve_report_draws_figure_1_of_one_run_folder(tmp_path):
    """A Neyman-Pearson run's own report carries the paper's Figure 1 (plots/outer.png), and `fedsolve report` on the
    run folder draws it again (what experiments/constrained/plot_fig12.py did)."""
    from fedsolve.cli import main as cli

    cfg = ROOT / "experiments" / "constrained" / "table1_np_monks1.yaml"
    out = tmp_path / "np"
    assert cli(["run", str(cfg), "--algorithm", "Prox-AL FL", "--set", "data.num_clients=2", "--set",
                "simulation.rounds=30", "--set", "simulation.eval_every=3", "--out", str(out), "--quiet"]) == 0
    (out / "plots" / "outer.png").unlink()
    assert cli(["report", str(out)]) == 0
    assert (out / "plots" / "outer.png").stat().st_size > 10_000
    assert "![outer](plots/outer.png)" in (out / "report.md").read_text()


def test_np_optimum_meets_its_kkt_conditions():
    """Eq. 30's optimum at n = 1: the class-1 loss sits at r, the Lagrangian's gradient vanishes at mu*, and the
    objective is below that of any feasible point found another way (here: a feasible scaling of it)."""
    from scipy.special import expit

    from fedsolve.families.constrained.optimum import np_optimum

    rng = np.random.default_rng(0)
    y = (rng.random(120) < 0.4).astype(np.int64)
    x = rng.normal(size=(120, 3)) + 0.9 * y[:, None] * np.linspace(1, 0.3, 3)
    opt = np_optimum(x, y, 0.5)
    assert opt["active"] == 1 and opt["class1_loss"] == pytest.approx(0.5, abs=1e-6)
    assert len(opt["path"]) >= 2 and opt["path"][-1][2] > 0.5
    with pytest.raises(ValueError, match="np_optimum: the class-1 loss exceeds r"):
        np_optimum(x, y, 0.01)


def test_the_np_optimum_suite_reports_wdbc_far_below_an_eps_kkt_point(tmp_path):
    """experiments/constrained/np_optimum.yaml on WDBC: objective ~1.6e-6 at ||w*||_inf ~ 940 (the README's finding,
    formerly np_penalty_path.py)."""
    from fedsolve.experiments.suite import main

    rows = main(str(ROOT / "experiments" / "constrained" / "np_optimum.yaml"), out=str(tmp_path / "o"), progress=False,
                sets=["sweep={problem.params.dataset: [breast_cancer]}"])
    head = next(r for r in rows if "objective" in r)
    assert head["dataset"] == "breast_cancer" and head["class1_loss"] == pytest.approx(0.2, abs=1e-6)
    assert 1e-6 < head["objective"] < 3e-6 and 900 < head["w_inf"] < 1000
    assert "| breast_cancer | 1.6" in (tmp_path / "o" / "report.md").read_text()
