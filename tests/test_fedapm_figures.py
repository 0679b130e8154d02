"""FedAPM's Figs. 4, 5 and 7 as numbers from compare folders' per-round logs (families/personalized/figures.py),
on folders written here with known curves."""

from __future__ import annotations

import gzip
import json

import pytest

from fedsolve.families.personalized.figures import folder_report, main, merged_runs, seed_mean, sweep_report


def _compare(root, curves, packed=False, first_seed=0):
    """A compare folder whose method ``label`` has, per seed (from ``first_seed`` on), the records
    ``[(round, train_loss, drift), ...]``."""
    root.mkdir(parents=True)
    (root / "summary.json").write_text(json.dumps({"algorithms": {k: {} for k in curves}}))
    for label, seeds in curves.items():
        for k, recs in enumerate(seeds, start=first_seed):
            d = root / label / f"seed{k}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"label": label, "seed": k}))
            text = "".join(json.dumps({"round": t, "train_loss": f, "local_drift": g}) + "\n" for t, f, g in recs)
            if packed:
                (d / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))
            else:
                (d / "metrics.jsonl").write_text(text)
    return root


def test_loss_and_drift_tables_from_known_curves(tmp_path):
    # A: loss 2, 1, 0.5 at rounds 10, 20, 40 in both seeds; B: 2, 1.5, 1.0 (seed means). L* = 1.0 (B's last):
    # A reaches it at round 20, B at 40. Drift: A 0.2 at 10 and 20 (mean of rounds 1-30: 0.2), B 0.4 then 0.6.
    f = _compare(tmp_path / "cmp", {
        "A": [[(10, 2.0, 0.2), (20, 1.0, 0.2), (40, 0.5, 0.3)]] * 2,
        "B": [[(10, 2.0, 0.4), (20, 1.4, 0.6), (40, 0.8, 0.9)], [(10, 2.0, 0.4), (20, 1.6, 0.6), (40, 1.2, 0.9)]]},
        packed=True)
    out = folder_report(f)
    assert "| A | 2.000 | 1.000 | 0.500 | 1.167 | 20 |" in out
    assert "| B | 2.000 | 1.500 | 1.000 | 1.500 | 40 |" in out
    assert "first round <= 1.000 (L*)" in out
    assert "| A | 0.200 | 0.300 | 0.200, 0.200 |" in out and "| B | 0.500 | 0.900 | 0.500, 0.500 |" in out


def test_merge_pools_the_seeds_of_folders_that_split_one_comparison(tmp_path, capsys):
    # seed 0 in one folder, seeds 1 and 2 in another: A's drift 0.1, 0.4, 0.7 in rounds 1-30 -> mean 0.4, each seed
    # listed; loss 3, 1, 2 at round 10 -> 2.0. B has no drift (a solver that does not report it): dashes.
    a = _compare(tmp_path / "seed0", {"A": [[(10, 3.0, 0.1)]], "B": [[(10, 1.0, None)]]})
    b = _compare(tmp_path / "seeds12", {"A": [[(10, 1.0, 0.4)], [(10, 2.0, 0.7)]],
                                        "B": [[(10, 1.0, None)], [(10, 1.0, None)]]}, first_seed=1)
    runs = merged_runs([a, b])
    assert list(runs) == ["A", "B"] and [len(v) for v in runs.values()] == [3, 3]
    assert main(["--merge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "### seed0 + seeds12 (seeds per method: 3)" in out
    assert "| A | 2.000 |" in out and "| A | 0.400 | 0.400 | 0.100, 0.400, 0.700 |" in out
    assert "| B | - | - | -, -, - |" in out


def test_merge_replaces_a_run_redone_in_a_later_folder(tmp_path):
    # the comparison's seeds 1 and 2 of A were re-run (a re-tuned pick) into a folder of their own: they replace
    a = _compare(tmp_path / "table", {"A": [[(10, 1.0, 0.1)], [(10, 9.0, 0.9)]], "B": [[(10, 1.0, 0.1)]] * 2})
    edge = _compare(tmp_path / "edge", {"A": [[(10, 3.0, 0.3)], [(10, 3.0, 0.3)]]}, first_seed=1)
    runs = merged_runs([a, edge])
    assert [r[0]["train_loss"] for r in runs["A"]] == [1.0, 3.0, 3.0] and len(runs["B"]) == 2
    out = folder_report(tmp_path / "table", runs)
    assert "| A | 0.233 | 0.233 | 0.100, 0.300, 0.300 |" in out


def test_merge_refuses_folders_with_other_methods(tmp_path, capsys):
    a = _compare(tmp_path / "one", {"A": [[(10, 1.0, 0.1)]]})
    b = _compare(tmp_path / "two", {"C": [[(10, 1.0, 0.1)]]})
    assert main(["--merge", str(a), str(b)]) == 2
    assert "method 'C'; allowed with --merge: the methods of" in capsys.readouterr().err


def test_seed_mean_keeps_the_rounds_every_seed_evaluated():
    runs = [[{"round": 0}, {"round": 5, "train_loss": 1.0}, {"round": 10, "train_loss": 0.5}],
            [{"round": 5, "train_loss": 3.0}, {"round": 10, "train_loss": float("nan")}]]
    assert seed_mean(runs, "train_loss") == {5: 2.0}


def test_sweep_rows_are_folders(tmp_path):
    a = _compare(tmp_path / "frac_0.1", {"FedAPM": [[(10, 2.0, 0.1), (20, 1.5, 0.1)]]})
    b = _compare(tmp_path / "frac_0.5", {"FedAPM": [[(10, 1.5, 0.1), (20, 0.5, 0.1)]]})
    out = sweep_report([a, b])
    assert "| frac_0.1 | 2.000 | 1.500 | 1.750 | 20 |" in out and "| frac_0.5 | 1.500 | 0.500 | 1.000 | 10 |" in out


def test_cli_names_a_folder_without_logs(tmp_path, capsys):
    f = tmp_path / "cmp"
    f.mkdir()
    (f / "summary.json").write_text(json.dumps({"algorithms": {"A": {}}}))
    assert main([str(f)]) == 2
    assert "no run folder of 'A'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
