"""Tables 1 and 2 of paper 002 as suites (experiments/constrained/table{1,2}_suite.yaml, protocol
``constrained_runs``): the suites load with the paper's grid and our budgets, a finished `fedsolve compare` run
serves its cell (the collect.py --list-done rule) with the numbers a run here gives, and the general table
features they use (relative_to, only, stat: count, notation: sci)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from fedsolve.cli import main as cli
from fedsolve.experiments.config import ConfigError
from fedsolve.experiments.suite import Context, TableSpec, cells, load_suite, main, run_cell, table_lines

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "experiments" / "constrained"
T1, T2 = DIR / "table1_suite.yaml", DIR / "table2_suite.yaml"


# ------------------------------------------------------------------ the suites
def test_suites_sweep_the_tables_sh_grid_with_its_budgets():
    s1, base1 = load_suite(T1)
    s2, base2 = load_suite(T2)
    g1, g2 = cells(s1, base1), cells(s2, base2)
    # Table 1: 4 datasets x n in {1, 5, 10, 20} x 4 methods x 10 seeds; Table 2: 4 n x 5 methods x 10 seeds
    assert len(g1) == 4 * 4 * 4 * 10 and len(g2) == 4 * 5 * 10
    assert {c["problem.params.dataset"] for c in g1} == {"breast_cancer", "breast_cancer_wisc", "monks1", "adult"}
    assert {c["data.num_clients"] for c in g1 + g2} == {1, 5, 10, 20} and s1.seeds == s2.seeds == list(range(10))
    assert {c["algorithm"] for c in g2} == {"Prox-AL FL (paper params)", "Prox-AL FL (code params)", "cProx-AL",
                                            "FedAvg (no constraints)", "FedProx (no constraints)"}
    e1 = Context(s1, base1).experiment({"problem.params.dataset": "adult"})
    e2 = Context(s2, base2).experiment({})
    assert e1.simulation.rounds == 1500 and e2.simulation.rounds == 600          # ROUNDS1, ROUNDS2
    assert s1.args["set_when"][0]["set"] == {"problem.params.limit": 5000}     # ADULT_LIMIT
    assert s1.args["set_when"][1] == {"when": {"problem.params.dataset": "breast_cancer_wisc"},   # features on [0, 1]
                                      "set": {"problem.params.scale": "unit"}}
    assert (e2.problem.params["limit"], e2.problem.params["server_limit"]) == (3000, 1000)
    assert s1.args["adopt"] == s2.args["adopt"] == ["runs/constrained"]


def test_long_suites_raise_the_inner_cap_of_the_prox_al_rows_only():
    """The larger-inner-cap rebuilds (table{1,2}_long_suite.yaml): the paper's grid at n >= 5 (Table 1) and every n
    (Table 2), Prox-AL's max_inner raised (8,000 / 2,000), the round budget with it, the vectorized executor,
    cProx-AL untouched, and their own adoption folder (their round budgets are other cells than Table 1's)."""
    s1, b1 = load_suite(DIR / "table1_long_suite.yaml")
    s2, b2 = load_suite(DIR / "table2_long_suite.yaml")
    assert len(cells(s1, b1)) == 4 * 3 * 2 * 10 and len(cells(s2, b2)) == 4 * 4 * 10
    e1 = Context(s1, b1).experiment({"problem.params.dataset": "monks1"})
    e2 = Context(s2, b2).experiment({})
    by1 = {a.label: a.params for a in e1.algorithms}
    by2 = {a.label: a.params for a in e2.algorithms}
    assert by1["Prox-AL FL"]["max_inner"] == 8000 and "max_inner" not in by1["cProx-AL"]
    assert by1["Prox-AL FL"]["rho"] == 0.01 and by1["Prox-AL FL"]["beta"] == 300.0   # the paper's otherwise
    assert by2["Prox-AL FL (paper params)"]["max_inner"] == by2["Prox-AL FL (code params)"]["max_inner"] == 2000
    assert (e1.simulation.rounds, e2.simulation.rounds) == (40000, 8000)
    assert e1.simulation.executor == e2.simulation.executor == "vectorized"
    assert s1.args["adopt"] == s2.args["adopt"] == ["runs/constrained_long"]


def test_bad_protocol_args_are_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="args.set_when.0.set: .*not experiment fields"):
        load_suite(T1, ["args.set_when=[{when: {data.num_clients: 5}, set: {limit: 5}}]"])
    with pytest.raises(ConfigError, match="args.adopt_onli: Extra inputs"):
        load_suite(T1, ["args.adopt_onli=true"])
    suite, base = load_suite(T1, ["args.set_when=[{when: {problem.params.datset: adult}, set: {data.num_clients: 2}}]",
                                  "args.adopt_only=true"])
    with pytest.raises(ValueError, match=r"args.set_when.0.when: \['problem.params.datset'\] are not axes .*"
                                         r"allowed: \['algorithm', 'data.num_clients', 'problem.params.dataset'"):
        run_cell(Context(suite, base).for_cell(cells(suite, base)[0]))
    with pytest.raises(ValueError, match="relative_to: .*stat: mean only"):
        TableSpec(metric="objective", relative_to="cProx-AL", stat="count")


# ------------------------------------------------------------------ finished runs serve their cells
def _fixture_run(root: Path, folder: str, label: str, seed: int, n: int, objective: float, *, rounds: int = 1500,
                 dataset: str = "monks1", algorithm: str = "proxal", params: dict | None = None,
                 status: str = "completed", mtime: float | None = None, worst: float = 0.0,
                 clients: list[float] | None = None, w: list[float] | None = None, scale: str | None = None) -> Path:
    """A `fedsolve compare` seed folder as `fedsolve compare` leaves it: config.yaml (resolved) and summary.json."""
    d = root / folder / label.replace(" ", "_") / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"data": {"num_clients": n}, "simulation": {"rounds": rounds, "eval_every": 250},
           "problem": {"kind": "neyman_pearson", "params": {"dataset": dataset, "r": 0.2, "split_seed": 10,
                                                            **({"scale": scale} if scale else {})}},
           "algorithm": {"name": algorithm, "label": label, "params": params or {"inner_stop": "paper"}}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    cert = {"objective": objective, "kkt_eps1": 8e-4, "kkt_eps2": 1e-5, "violation_max": max(worst, 0.0),
            "c_client_mean[class-1 loss - r]": -0.02, "c_client_max[class-1 loss - r]": worst,
            "outer_iterations": 5, "admm_rounds": 450, "converged": int(worst <= 1e-3), "status": "x"}
    cert.update({k: v for k, v in (("objective_clients", clients), ("w", w)) if v is not None})
    summ = {"label": label, "seed": seed, "algorithm": algorithm, "wall_time_s": 7.0, "status": status,
            "message": "diverged: |w| grew past 1e6" if status == "diverged" else "",
            "extras": {} if status == "diverged" else {"constrained": cert}}
    (d / "summary.json").write_text(json.dumps(summ))
    if mtime is not None:
        os.utime(d / "summary.json", (mtime, mtime))
    return d


THREE = '["Prox-AL FL", "cProx-AL", "FedAvg (no constraints)"]'


def test_recorded_runs_serve_their_cells_and_the_tables_compare_seed_by_seed(tmp_path, monkeypatch):
    from fedsolve.families.constrained import runs as constrained_runs

    monkeypatch.setattr(constrained_runs, "LISTING_TTL_S", 0.0)   # list the runs again for every cell
    runs = tmp_path / "runs"
    _fixture_run(runs, "a", "Prox-AL FL", 0, 5, 1.0, mtime=1_000)
    _fixture_run(runs, "b", "Prox-AL FL", 0, 5, 1.2, mtime=2_000,        # seed 0 again, newer: this one counts
                 clients=[1.1, 1.3])
    _fixture_run(runs, "c", "Prox-AL FL", 1, 5, 3.3, worst=0.02, clients=[3.3, 3.3])
    _fixture_run(runs, "d", "cProx-AL", 0, 5, 1.0, algorithm="cproxal", clients=[1.0, 1.0])
    _fixture_run(runs, "e", "cProx-AL", 1, 5, 3.0, algorithm="cproxal", clients=[3.0, 3.0])
    _fixture_run(runs, "f", "FedAvg (no constraints)", 0, 5, 0.1, algorithm="fedavg_uncons", status="diverged")
    # not this suite's cells: another round budget, another n, the authors'-code stopping variant
    _fixture_run(runs, "g", "FedAvg (no constraints)", 1, 5, 9.0, algorithm="fedavg_uncons", rounds=8000)
    _fixture_run(runs, "h", "FedAvg (no constraints)", 1, 10, 9.0, algorithm="fedavg_uncons")
    _fixture_run(runs, "i", "Prox-AL FL", 2, 5, 9.0, params={"inner_stop": "code"})
    out = tmp_path / "suite"
    rows = main(str(T1), out=str(out), progress=False, sets=[
        "seeds=[0, 1, 2]", "sweep={problem.params.dataset: [monks1], data.num_clients: [5]}",
        f"args.adopt=[{runs}]", "args.adopt_only=true", f"algorithms={THREE}"])
    by = {(r["algorithm"], r["seed"]): r for r in rows}
    assert len(rows) == 9
    assert by[("Prox-AL FL", 0)]["objective"] == 1.2 and by[("Prox-AL FL", 0)]["source"].endswith("b/Prox-AL_FL/seed0")
    assert by[("Prox-AL FL", 1)]["class1_loss_max"] == pytest.approx(0.22)
    assert by[("FedAvg (no constraints)", 0)]["diverged"] == "diverged" and by[("FedAvg (no constraints)", 0)]["n"] == 5
    for missing in [("Prox-AL FL", 2), ("cProx-AL", 2), ("FedAvg (no constraints)", 1), ("FedAvg (no constraints)", 2)]:
        assert by[missing]["adopted"] == 0 and "missing" in by[missing] and "objective" not in by[missing]
    report = (out / "report.md").read_text()
    # the paper's metric, per client pooled over clients x seeds: 0.1, 0.3 (seed 0) and 0.1, 0.1 (seed 1)
    assert "## relative difference to cProx-AL per client, the paper's metric" in report
    assert "| Prox-AL FL | 1.5e-01 +- 1.0e-01 | 2.08e-04 (1.84e-04) |" in report   # sample SD
    # of the total objective per seed, then mean: seed 0 |1.2 - 1.0| / 1.0 = 0.2, seed 1 |3.3 - 3.0| / 3.0 = 0.1
    assert "## relative difference of the total objective to cProx-AL, per seed: monks1" in report
    assert "| Prox-AL FL | 1.5e-01 +- 7.1e-02 (n = 2) |" in report   # two of the three seeds
    assert "| Prox-AL FL | 1/2 |" in report                     # Eq. 11 passed on seed 0, not on seed 1
    # adopted of N (the diverged run counts as adopted: its cell is served, as a divergence)
    assert "| Prox-AL FL | 2/3 |" in report and "| FedAvg (no constraints) | 1/3; diverged 1/3 (diverged) |" in report
    # a run that finishes later is found by --resume; the cells already read are kept as they were
    _fixture_run(runs, "j", "Prox-AL FL", 2, 5, 4.0)
    _fixture_run(runs, "k", "Prox-AL FL", 0, 5, 7.0)   # seed 0 again, newest, but its cell is done
    rows = main(str(T1), out=str(out), progress=False, resume=True, sets=[
        "seeds=[0, 1, 2]", "sweep={problem.params.dataset: [monks1], data.num_clients: [5]}",
        f"args.adopt=[{runs}]", "args.adopt_only=true", f"algorithms={THREE}"])
    by = {(r["algorithm"], r["seed"]): r for r in rows}
    assert by[("Prox-AL FL", 2)]["objective"] == 4.0 and by[("Prox-AL FL", 0)]["objective"] == 1.2
    assert "| Prox-AL FL | 3/3 |" in (out / "report.md").read_text()


def test_a_run_on_rescaled_features_serves_only_the_rescaled_cell(tmp_path):
    """Table 1's original Wisconsin row runs on features scaled to [0, 1] (set_when): a run on the z-scored
    features is another problem and must not serve it, nor the other way round."""
    runs = tmp_path / "runs"
    _fixture_run(runs, "z", "Prox-AL FL", 0, 5, 0.09, dataset="breast_cancer_wisc")
    _fixture_run(runs, "u", "Prox-AL FL", 1, 5, 0.40, dataset="breast_cancer_wisc", scale="unit")
    _fixture_run(runs, "m", "Prox-AL FL", 0, 5, 1.11, dataset="monks1", scale="unit")
    rows = main(str(T1), out=str(tmp_path / "suite"), progress=False, sets=[
        "seeds=[0, 1]", "sweep={problem.params.dataset: [breast_cancer_wisc, monks1], data.num_clients: [5]}",
        f"args.adopt=[{runs}]", "args.adopt_only=true", 'algorithms=["Prox-AL FL"]'])
    got = {(r["problem.params.dataset"], r["seed"]): r.get("objective") for r in rows}
    assert got == {("breast_cancer_wisc", 0): None, ("breast_cancer_wisc", 1): 0.40,
                   ("monks1", 0): None, ("monks1", 1): None}


def test_an_adopted_run_without_per_client_objectives_gets_them_from_its_w(tmp_path):
    """A run recorded before ``objective_clients`` existed: the cell computes f_i(w) from the summary's w on the
    cell's own parties (monks-1, n = 5; at w = 0 every client's class-0 loss is log 2, so f_i = log(2) / 5)."""
    runs = tmp_path / "runs"
    _fixture_run(runs, "a", "Prox-AL FL", 0, 5, 0.69, w=[0.0] * 17)
    rows = main(str(T1), out=str(tmp_path / "suite"), progress=False, sets=[
        "seeds=[0]", "algorithms=[Prox-AL FL]", "sweep={problem.params.dataset: [monks1], data.num_clients: [5]}",
        f"args.adopt=[{runs}]", "args.adopt_only=true"])
    assert rows[0]["adopted"] == 1
    assert rows[0]["objective_clients"] == pytest.approx([math.log(2) / 5] * 5, rel=1e-12)


@pytest.mark.slow
def test_a_cell_run_here_gives_the_numbers_of_fedsolve_compare_and_is_then_adopted(tmp_path):
    """One tiny cell (breast cancer, n = 2, 40 rounds, seed 1): run by the suite, and by `fedsolve compare` as
    one runs it; the same certificate; then the suite adopts the compare run instead of running."""
    tiny = ["seeds=[1]", "sweep={problem.params.dataset: [breast_cancer], data.num_clients: [2]}",
            "algorithms=[Prox-AL FL]", "experiment.simulation.rounds=40", "args.adopt=[]"]
    here = main(str(T1), out=str(tmp_path / "here"), progress=False, sets=tiny)[0]
    assert here["adopted"] == 0 and here["source"] == "run" and here["n"] == 2
    runs = tmp_path / "runs"
    assert cli(["compare", str(DIR / "table1_np_breast_cancer.yaml"), "--set", "data.num_clients=2",
                "--set", "seeds=[1]", "--set", "simulation.rounds=40", "--only", "Prox-AL FL",
                "--out", str(runs / "t1_breast_cancer_n2_s1_Prox_AL_FL"), "--quiet"]) == 0
    summ = json.loads(next(runs.glob("**/seed1/summary.json")).read_text())
    cert = summ["extras"]["constrained"]
    for k in ("objective", "kkt_eps1", "kkt_eps2", "outer_iterations", "admm_rounds", "converged"):
        assert here[k] == pytest.approx(cert[k], rel=1e-9, abs=1e-12), k
    adopted = main(str(T1), out=str(tmp_path / "adopted"), progress=False,
                   sets=tiny[:-1] + [f"args.adopt=[{runs}]"])[0]
    assert adopted["adopted"] == 1 and adopted["source"].endswith("seed1")
    assert adopted["objective"] == cert["objective"] and adopted["wall_time_s"] == summ["wall_time_s"]


# ------------------------------------------------------------------ the general table features
def _rows():
    out = []
    for seed, (a, b, c) in enumerate([(1.1, 1.0, 0.5), (2.4, 2.0, 0.5), (9.0, None, 0.5)]):
        out += [{"algorithm": "A", "seed": seed, "n": 5, "obj": a, "ok": int(seed != 1)},
                {"algorithm": "C", "seed": seed, "n": 5, "obj": b, "ok": 1},
                {"algorithm": "F", "seed": seed, "n": 5, "obj": c}]
    return out


def test_relative_to_compares_each_seed_with_the_reference_row_of_that_seed():
    t = TableSpec(metric="obj", columns="n", relative_to="C", only=["A"], notation="sci", digits=2,
                  paper={"A": {5: "1e-3"}})
    lines = table_lines(t, _rows())
    # seed 0: 0.1 / 1.0 = 0.1; seed 1: 0.4 / 2.0 = 0.2; seed 2 has no reference value: left out
    assert "| A | 1.50e-01 +- 7.07e-02 (n = 2) | 1e-3 |" in lines   # sample SD of two seeds
    assert not any(line.startswith(("| C ", "| F ")) for line in lines)


def test_count_only_and_blank_paper_cells_for_rows_the_paper_lacks():
    lines = table_lines(TableSpec(metric="ok", columns="n", stat="count", only=["C", "A"]), _rows())
    assert lines[4:6] == ["| C | 3/3 |", "| A | 2/3 |"]        # in the order of `only`
    lines = table_lines(TableSpec(metric="obj", columns="n", digits=1, paper={"A": {5: 0.3}}), _rows())
    assert "| F | 0.5 +- 0.0 |  |" in lines and "| A | 4.2 +- 4.2 | 0.3 |" in lines   # sample SD
