"""experiments/constrained/collect.py: the Tables 1/2 aggregation over per-seed run folders and the
'finished runs' list that the Tables 1/2 suites adopt by."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def collect():
    spec = importlib.util.spec_from_file_location("constrained_collect", ROOT / "experiments/constrained/collect.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root: Path, folder: str, label: str, seed: int, n: int, objective: float, *, rounds=1500, dataset="monks1",
         algorithm="proxal", converged=1, mtime=None, params=None) -> Path:
    d = root / folder / label.replace(" ", "_") / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"data": {"num_clients": n}, "simulation": {"rounds": rounds},
           "problem": {"kind": "neyman_pearson", "params": {"dataset": dataset, "r": 0.2}},
           "algorithm": {"name": algorithm, "params": params or {"inner_stop": "paper"}}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    cert = {"objective": objective, "kkt_eps1": 1e-3, "kkt_eps2": 1e-4, "c_client_mean[class-1 loss - r]": -0.01,
            "c_client_max[class-1 loss - r]": 0.0, "outer_iterations": 5, "admm_rounds": 450, "converged": converged,
            "inner_cap_hits": 0}
    summ = {"label": label, "seed": seed, "algorithm": algorithm, "wall_time_s": 2.0,
            "extras": {"constrained": cert}}
    (d / "summary.json").write_text(json.dumps(summ))
    if mtime is not None:
        os.utime(d / "summary.json", (mtime, mtime))
    return d


def test_cells_group_seeds_across_folders_and_keep_the_newest_duplicate(collect, tmp_path):
    _run(tmp_path, "a", "Prox-AL FL", 0, 5, 1.0, mtime=1_000)
    _run(tmp_path, "b", "Prox-AL FL", 0, 5, 3.0, mtime=2_000)  # the same seed again, newer: this one counts
    _run(tmp_path, "c", "Prox-AL FL", 1, 5, 2.0)
    _run(tmp_path, "c", "cProx-AL", 0, 5, 2.0, algorithm="cproxal")
    _run(tmp_path, "d", "cProx-AL", 1, 5, 2.0, algorithm="cproxal")
    _run(tmp_path, "e", "Prox-AL FL", 0, 5, 9.0, rounds=8000)  # another budget: another cell
    cells = collect.load([tmp_path])
    key = ("neyman_pearson", "monks1", 5, None, None, 1500)
    assert sorted(cells[key]["Prox-AL FL"]) == [0, 1]
    assert cells[key]["Prox-AL FL"][0][1]["extras"]["constrained"]["objective"] == 3.0
    row = [r for r in collect.rows(cells, 1, {1500}) if "| Prox-AL FL |" in r][0]
    # mean (population std) of 3.0 and 2.0, relative differences 0.5 and 0 against cProx-AL's 2.0
    assert "| 0-1 | Prox-AL FL | 2.5000 (5.0e-01) | 2.5e-01 (2.5e-01) |" in row
    assert "2/2 Eq. 11 passed" in row
    assert not any("9.0000" in r for r in collect.rows(cells, 1, {1500}))


def test_list_done_lines_are_what_tables_sh_greps_for(collect, tmp_path, capsys, monkeypatch):
    _run(tmp_path, "a", "FedAvg (no constraints)", 3, 20, 0.1, algorithm="fedavg_uncons")
    _run(tmp_path, "b", "Prox-AL FL", 0, 5, 1.0, params={"inner_stop": "code", "eps_tilde": "code"})
    monkeypatch.setattr("sys.argv", ["collect.py", str(tmp_path), "--list-done"])
    collect.main()
    lines = set(capsys.readouterr().out.splitlines())
    assert "monks1 20 None None 1500 3 FedAvg (no constraints)" in lines
    # the authors'-code stopping variant is a different method: it must not count as the paper's Prox-AL FL
    assert "monks1 5 None None 1500 0 Prox-AL FL" not in lines
    assert "monks1 5 None None 1500 0 Prox-AL FL [eps_tilde: code, inner_stop: code]" in lines


def test_a_diverged_seed_is_named_in_the_status_and_left_out_of_the_means(collect, tmp_path):
    _run(tmp_path, "a", "Prox-AL FL", 0, 20, 1.0)
    d = _run(tmp_path, "b", "Prox-AL FL", 1, 20, 5.0)
    summ = json.loads((d / "summary.json").read_text())
    summ.update(status="diverged", message="diverged: |w| grew past 1e6", extras={})   # what run_one writes
    (d / "summary.json").write_text(json.dumps(summ))
    _run(tmp_path, "c", "cProx-AL", 0, 20, 2.0, algorithm="cproxal")
    _run(tmp_path, "d", "cProx-AL", 1, 20, 2.0, algorithm="cproxal")
    row = [r for r in collect.rows(collect.load([tmp_path]), 1) if "| Prox-AL FL |" in r][0]
    assert "| 0 | Prox-AL FL | 1.0000 | 5.0e-01 |" in row and "1/1 Eq. 11 passed, diverged: seed 1" in row
