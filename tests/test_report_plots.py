"""The compare report's plots against communicated bytes, wall time and a schedule's virtual clock (besides those
against rounds)."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import fedsolve.experiments.report as report
from fedsolve.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _cfg(seeds):
    return SimpleNamespace(name="t", description="", seeds=seeds, paper={}, problem=None,
                           data=SimpleNamespace(num_clients=4, dataset="digits", partition="iid", partition_params={},
                                                label="digits"),
                           model=SimpleNamespace(name="logreg", label="logreg"), simulation=SimpleNamespace(rounds=2))


def _entry(acc):
    st = {"mean": acc, "std": 0.0, "n": 2}
    return {"final": {"test_accuracy": st}, "best": {"test_accuracy": st}, "runs": 2, "diverged": 0,
            "uplink_bytes": 0.0, "downlink_bytes": 0.0, "wall_time_s": 1.0}


def test_the_main_metric_is_drawn_against_mean_bytes_and_mean_wall_time(tmp_path, monkeypatch):
    """Two seeds: x is each round's uplink + downlink in MB (and time_s), averaged over the seeds; y the seeds'
    accuracies at those rounds (mean and band drawn from them)."""
    def rec(r, acc, up, down, t=None):
        out = {"round": r, "test_accuracy": acc, "uplink_bytes": up, "downlink_bytes": down}
        return out if t is None else {**out, "time_s": t}

    seed0 = [rec(0, 0.1, 0, 0, 0.5), rec(2, 0.5, 1_000_000, 2_000_000, 1.5), rec(4, 0.7, 2_000_000, 4_000_000, 2.5)]
    seed1 = [rec(0, 0.2, 0, 0, 0.7), rec(2, 0.6, 1_000_000, 2_000_000, 2.1), rec(4, 0.8, 3_000_000, 4_000_000, 3.5)]
    drawn = []
    real = report._draw
    monkeypatch.setattr(report, "_draw", lambda ax, k, n, label, x, mat: (drawn.append((ax.get_xlabel(), label,
                                                                                        list(x), mat.tolist())),
                                                                          real(ax, k, n, label, x, mat)))
    report.write_compare_report(tmp_path, _cfg([0, 1]), {"algorithms": {"A": _entry(0.75)}}, {"A": [seed0, seed1]})
    by_bytes = [d for d in drawn if d[2] == [0.0, 3.0, 6.5]]
    by_time = [d for d in drawn if d[2] == [0.6, 1.8, 3.0]]
    assert len(by_bytes) == 1 and len(by_time) == 1
    assert by_bytes[0][3] == [[0.1, 0.5, 0.7], [0.2, 0.6, 0.8]] == by_time[0][3]
    for name in ("test_accuracy_vs_bytes", "test_accuracy_vs_time", "test_accuracy"):
        assert (tmp_path / "plots" / f"{name}.png").exists()
        assert f"(plots/{name}.png)" in (tmp_path / "report.md").read_text()
    # no wall time in the histories (as report_dir gives for folders without timings.jsonl): no time plot
    (tmp_path / "plots" / "test_accuracy_vs_time.png").unlink()
    strip = lambda h: [{k: v for k, v in r.items() if k != "time_s"} for r in h]   # noqa: E731
    report.write_compare_report(tmp_path, _cfg([0, 1]), {"algorithms": {"A": _entry(0.75)}},
                                {"A": [strip(seed0), strip(seed1)]})
    assert not (tmp_path / "plots" / "test_accuracy_vs_time.png").exists()
    assert "vs_time" not in (tmp_path / "report.md").read_text()


def test_run_history_joins_the_timings_by_round(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                    [{"round": 0, "a": 1.0}, {"round": 3, "a": 2.0}]))
    (tmp_path / "timings.jsonl").write_text(json.dumps({"round": 3, "time_s": 4.5}) + "\n")
    assert report.run_history(tmp_path) == [{"round": 0, "a": 1.0}, {"round": 3, "a": 2.0, "time_s": 4.5}]


def test_demo_compare_report_has_plots_against_bytes_and_wall_time(tmp_path):
    """The demo config, shortened: the report shows accuracy against bytes and wall time, from the run folders'
    files; `fedsolve report` draws them again from those files."""
    out = tmp_path / "demo"
    assert main(["compare", str(ROOT / "experiments" / "demo.yaml"), "--out", str(out), "--quiet",
                 "--only", "FedAvg", "--only", "Local", "--set", "simulation.rounds=4", "--set", "seeds=[0,1]",
                 "--set", "simulation.eval_every=2"]) == 0
    rep = (out / "report.md").read_text()
    for name in ("test_accuracy_vs_bytes", "test_accuracy_vs_time"):
        assert f"(plots/{name}.png)" in rep and (out / "plots" / f"{name}.png").exists()
        (out / "plots" / f"{name}.png").unlink()
    h = report.run_history(out / "FedAvg" / "seed0")
    assert [r["round"] for r in h] == [0, 2, 4] and all(r["time_s"] > 0 for r in h)
    assert h[-1]["uplink_bytes"] > 0 and np.diff([r["time_s"] for r in h]).min() > 0
    assert main(["report", str(out)]) == 0
    assert all((out / "plots" / f"{n}.png").exists() for n in ("test_accuracy_vs_bytes", "test_accuracy_vs_time"))


def test_a_schedules_virtual_clock_aligns_seeds_that_evaluate_at_different_rounds(tmp_path, monkeypatch):
    """asyncFPFC's seeds evaluate after different event counts: the curve against the virtual clock holds each
    seed's value from one evaluation to its next, on the union of their times up to the earliest last one (the
    record before the first round counts as time 0); the clusters are drawn against the clock too."""
    seed0 = [{"round": 0, "test_accuracy": 0.1, "num_clusters": 1.0},
             {"round": 7, "test_accuracy": 0.5, "num_clusters": 6.0, "virtual_time": 10.0},
             {"round": 15, "test_accuracy": 0.7, "num_clusters": 4.0, "virtual_time": 20.0}]
    seed1 = [{"round": 0, "test_accuracy": 0.2, "num_clusters": 1.0},
             {"round": 9, "test_accuracy": 0.6, "num_clusters": 5.0, "virtual_time": 12.0},
             {"round": 20, "test_accuracy": 0.8, "num_clusters": 4.0, "virtual_time": 25.0}]
    x, mat = report._clock_curve([seed0, seed1], "test_accuracy", "virtual_time")
    assert x.tolist() == [0.0, 10.0, 12.0, 20.0]
    assert mat.tolist() == [[0.1, 0.5, 0.5, 0.7], [0.2, 0.2, 0.6, 0.6]]
    assert report._clock_curve([[{"round": 0, "test_accuracy": 0.1}]], "test_accuracy", "virtual_time") is None
    report.write_compare_report(tmp_path, _cfg([0, 1]), {"algorithms": {"A": _entry(0.75)}}, {"A": [seed0, seed1]})
    text = (tmp_path / "report.md").read_text()
    for name in ("test_accuracy_vs_virtual_time", "num_clusters_vs_virtual_time"):
        assert (tmp_path / "plots" / f"{name}.png").exists() and f"(plots/{name}.png)" in text
    assert "against the virtual clock" in text
    # histories without a clock (every plain run): no such plot
    plain = tmp_path / "plain"
    report.write_compare_report(plain, _cfg([0, 1]), {"algorithms": {"A": _entry(0.75)}},
                                {"A": [[{k: v for k, v in r.items() if k != "virtual_time"} for r in s]
                                       for s in (seed0, seed1)]})
    assert not list((plain / "plots").glob("*virtual_time*"))


def test_per_round_logs_are_read_back_from_their_gzipped_copy(tmp_path):
    """results/ keeps large per-round logs as metrics.jsonl.gz: the report (and verify) read them as the plain file."""
    import gzip

    recs = [{"round": 0, "a": 1.0}, {"round": 3, "a": 2.0}]
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode()))
    assert report.run_history(tmp_path) == recs
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 0, "a": 5.0}) + "\n")   # the plain file wins
    assert report.run_history(tmp_path) == [{"round": 0, "a": 5.0}]
