"""The suite layer (fedsolve.experiments.suite): schema errors, cells of a sweep, resume, worker processes,
the report's tables next to the paper's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedsolve.experiments.config import ConfigError
from fedsolve.experiments.suite import TableSpec, cells, load_suite, main, table_lines

DIR = Path(__file__).resolve().parents[1] / "experiments" / "fpfc"
TINY = ["seeds=[0]", "experiment.simulation.rounds=2", "experiment.data.params.size_scale=0.05",
        "experiment.data.params.max_size=60", "algorithms=[FedAvg, LOCAL]", "sweep.fraction=[0.0, 0.4]",
        "sweep.attack=[sign_flip, gaussian]"]


def _write(tmp_path, **changes) -> Path:
    raw = yaml.safe_load((DIR / "robustness_synthetic.yaml").read_text())
    raw.update(changes)
    raw["experiment"] = str(DIR / "synthetic_s1.yaml")
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize("change, match", [
    ({"protocol": "lamda_path"}, "unknown protocol 'lamda_path'; allowed: .*'lambda_path'"),
    ({"args": {"attacker_view": "both"}}, "args.attacker_view: .*allowed: \\['attack_block', 'attacker_view', 'picks'\\]"),
    ({"args": {"attack_blok": "fused"}}, "args.attack_blok: Extra inputs"),
    ({"sweep": {"attack": ["gaussian"]}}, "sweep: protocol 'attack_grid' needs the axes \\['fraction'\\]"),
    ({"plot": "bars"}, "plot: unknown 'bars'"),
    ({"seeds": [0, 0]}, "seeds must be distinct"),
    ({"algorithms": ["FedAvg", "Fedprox"]}, "algorithms: \\['Fedprox'\\] not in the experiment"),
    ({"set": ["simulation.roundz=3"]}, "experiment: .*roundz"),
])
def test_bad_suites_are_refused_naming_the_field(tmp_path, change, match):
    path = _write(tmp_path, **change)
    with pytest.raises(ConfigError, match=match):
        suite, base = load_suite(path)
        cells(suite, base)


def test_set_goes_to_the_suite_or_the_experiment(tmp_path):
    suite, base = load_suite(DIR / "robustness_synthetic.yaml", TINY)
    assert suite.seeds == [0] and suite.set[-1] == "data.params.max_size=60"
    with pytest.raises(ConfigError, match="--set rounds: not a suite field; allowed: .*experiment.<field>"):
        load_suite(DIR / "robustness_synthetic.yaml", ["rounds=3"])
    with pytest.raises(ConfigError, match="not a suite"):
        load_suite(DIR / "synthetic_s1.yaml")
    # the sweep's cells: attacks x fractions x algorithms x seeds, in that order
    grid = cells(suite, base)
    assert len(grid) == 2 * 2 * 2 and grid[0] == {"attack": "sign_flip", "fraction": 0.0, "algorithm": "FedAvg",
                                                  "seed": 0}


def test_resume_runs_only_missing_cells_and_refuses_other_settings(tmp_path):
    out = tmp_path / "run"
    rows = main(str(DIR / "robustness_synthetic.yaml"), out=str(out), sets=TINY, progress=False)
    files = sorted((out / "cells").glob("*.json"))
    assert len(rows) == 8 and len(files) == 5         # fraction 0 and LOCAL: one run serves both attacks
    with pytest.raises(ConfigError, match="already holds a suite run; use --resume"):
        main(str(DIR / "robustness_synthetic.yaml"), out=str(out), sets=TINY, progress=False)
    saved = json.loads(files[0].read_text())
    saved["rows"][0]["benign_accuracy"] = 0.123          # a kept cell is not run again
    files[0].write_text(json.dumps(saved))
    files[1].unlink()                                    # a missing cell is
    again = main(str(DIR / "robustness_synthetic.yaml"), out=str(out), sets=TINY, progress=False, resume=True)
    assert sum(r["benign_accuracy"] == 0.123 for r in again) >= 1
    key = lambda r: (r["attack"], r["fraction"], r["algorithm"])  # noqa: E731
    changed = {key(r) for r in again if r["benign_accuracy"] == 0.123}
    assert {key(r): r["benign_accuracy"] for r in again if key(r) not in changed} == \
        {key(r): r["benign_accuracy"] for r in rows if key(r) not in changed}
    assert "(4 runs kept by --resume)" in (out / "report.md").read_text()
    with pytest.raises(ConfigError, match="--resume: .* other settings \\(resolved_experiment, set differ\\)"):
        main(str(DIR / "robustness_synthetic.yaml"), out=str(out), sets=TINY + ["experiment.simulation.rounds=3"],
             progress=False, resume=True)
    # report-only fields may change on --resume (nothing runs again)
    main(str(DIR / "robustness_synthetic.yaml"), out=str(out), sets=TINY + ["description=other words"],
         progress=False, resume=True)
    assert "other words" in (out / "report.md").read_text()


@pytest.mark.slow
def test_jobs_give_the_rows_of_one_process(tmp_path):
    """--jobs 2: the cells run in two spawned worker processes (slow: each worker imports torch) with the rows
    of one process."""
    one = main(str(DIR / "robustness_synthetic.yaml"), out=str(tmp_path / "one"), sets=TINY, progress=False)
    two = main(str(DIR / "robustness_synthetic.yaml"), out=str(tmp_path / "two"), sets=TINY, progress=False, jobs=2)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(one) == strip(two)
    with pytest.raises(ConfigError, match="--jobs: expected a whole number >= 1"):
        main(str(DIR / "robustness_synthetic.yaml"), out=str(tmp_path / "x"), jobs=0)


def test_table_lines_pivot_with_the_papers_numbers_and_diverged_runs():
    rows = [{"algorithm": "A", "f": 0.0, "seed": 0, "acc": 0.5}, {"algorithm": "A", "f": 0.0, "seed": 1, "acc": 0.7},
            {"algorithm": "A", "f": 0.4, "seed": 0, "diverged": "round 3"},
            {"algorithm": "B", "f": 0.0, "seed": 0, "acc": 0.9}]
    lines = table_lines(TableSpec(metric="acc", columns="f", percent=True, paper={"A": 0.61}), rows)
    assert "| algorithm | paper | f 0.0 | f 0.4 |" in lines
    # the sample SD (n - 1): 0.5 and 0.7 give 0.1414, not the population SD 0.1; a cell with fewer values says so
    assert "| A | 61.00% | 60.00% +- 14.14 | -; diverged 1/1 (round 3) |" in lines
    assert "| B |  | 90.00% (n = 1) |  |" in lines
    plain = table_lines(TableSpec(metric="acc", rows="algorithm", digits=3), rows)
    assert "| A | 0.600 +- 0.141; diverged 1/3 (round 3) |" in plain


def test_tables_reduce_over_rounds_per_seed_before_the_mean():
    """``over: round``: one value per seed (best: max accuracy, min loss; last: at the largest round)."""
    rows = [{"algorithm": "A", "seed": s, "round": t, "acc": a, "test_loss": a}
            for s, trace in ((0, [0.2, 0.6, 0.5]), (1, [0.1, 0.3, 0.4])) for t, a in zip((0, 10, 20), trace)]
    best = table_lines(TableSpec(metric="acc", over="round"), rows)
    assert "| A | 0.50 +- 0.14 |" in best                       # max per seed: 0.6, 0.4 (sample SD 0.141)
    last = table_lines(TableSpec(metric="acc", over="round", pick="last"), rows)
    assert "| A | 0.45 +- 0.07 |" in last                       # round 20: 0.5, 0.4
    loss = table_lines(TableSpec(metric="test_loss", over="round"), rows)
    assert "| A | 0.15 +- 0.07 |" in loss                       # a loss: min per seed, 0.2 and 0.1
