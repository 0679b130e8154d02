"""A compare report opens with one sentence: the best method on the main metric's final value (mean over seeds, with
the sample SD and n), its margin over the runner-up, and whether that margin exceeds the seeds' spread."""

from __future__ import annotations

import json
import statistics

from fedsolve.experiments.report import _fmt
from fedsolve.experiments.tables import lead_sentence

TINY = """\
name: lead
seeds: [0, 1]
data: {dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {alpha: 0.5, min_size: 20}}
model: {name: mlp, params: {hidden: [8]}}
simulation: {rounds: 4, eval_every: 2}
defaults: {lr: 0.05, local_epochs: 1, batch_size: 32}
algorithms:
  - {name: fedavg, label: FedAvg}
  - {name: local, label: Local}
  - {name: fedprox, label: FedProx, params: {mu: 0.01}}
"""


def test_margin_beyond_the_spread():
    stats = {"A": {"mean": 0.80, "std": 0.01, "n": 3}, "B": {"mean": 0.90, "std": 0.02, "n": 3},
             "C": {"mean": 0.85, "std": 0.03, "n": 3}}
    assert lead_sentence(stats, "final accuracy", lower=False) == (
        "**B** has the best final accuracy, 0.9000 ± 0.0200 (mean ± sample SD over n = 3 seeds), 0.0500 above the "
        "runner-up C at 0.8500 ± 0.0300 (n = 3 seeds): the margin exceeds the seeds' spread (the larger sample SD, "
        "0.0300).")


def test_margin_within_the_spread_and_lower_is_better():
    stats = {"A": {"mean": 1.20, "std": 0.30, "n": 3}, "B": {"mean": 1.00, "std": 0.05, "n": 2}}
    assert lead_sentence(stats, "final test loss", lower=True) == (
        "**B** has the best final test loss, 1.0000 ± 0.0500 (mean ± sample SD over n = 2 seeds), 0.2000 below the "
        "runner-up A at 1.2000 ± 0.3000 (n = 3 seeds): the margin is within the seeds' spread (the larger sample SD, "
        "0.3000), so these seeds do not separate the two.")


def test_one_seed_a_tie_a_single_method_and_no_value():
    one = {"A": {"mean": 0.5, "std": 0.0, "n": 1}, "B": {"mean": 0.7, "std": 0.0, "n": 1}}
    assert lead_sentence(one, "final accuracy", lower=False).endswith(
        "0.7000 (n = 1 seed), 0.2000 above the runner-up A at 0.5000 (n = 1 seed): with one seed there is no spread "
        "to compare the margin with.")
    tie = {"A": {"mean": 0.5, "std": 0.1, "n": 2}, "B": {"mean": 0.5, "std": 0.2, "n": 2}}
    assert ", tied with " in lead_sentence(tie, "final accuracy", lower=False)
    assert lead_sentence({"A": {"mean": 0.5, "std": 0.1, "n": 2}, "B": None}, "final accuracy", lower=False) == (
        "**A** has the best final accuracy, 0.5000 ± 0.1000 (mean ± sample SD over n = 2 seeds); it is the only "
        "method with a value.")
    assert lead_sentence({"A": None, "B": {"mean": float("nan"), "std": 0.0, "n": 1}}, "x", lower=False) is None


def test_compare_report_opens_with_the_sentence(tmp_path, monkeypatch):
    from fedsolve.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lead.yaml").write_text(TINY)
    assert main(["compare", "lead.yaml", "--out", "cmp", "--quiet"]) == 0
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    finals = {a: e["final"]["test_accuracy"] for a, e in summary["algorithms"].items()}
    best, second = sorted(finals, key=lambda a: finals[a]["mean"], reverse=True)[:2]
    runs = {a: [json.loads((tmp_path / "cmp" / a / f"seed{s}" / "summary.json").read_text())["metrics"]["final"]
                ["test_accuracy"] for s in (0, 1)] for a in finals}
    mean, sd = statistics.fmean(runs[best]), statistics.stdev(runs[best])   # the sentence's numbers, from the runs
    lines = (tmp_path / "cmp" / "report.md").read_text().splitlines()
    assert lines[0] == "# lead" and lines[1] == ""
    assert lines[2].startswith(f"**{best}** has the best final accuracy, {_fmt(mean)} ± {_fmt(sd)} (mean ± sample SD "
                               f"over n = 2 seeds), {_fmt(mean - statistics.fmean(runs[second]))} above the runner-up "
                               f"{second} at "), lines[2]
    spread = max(sd, statistics.stdev(runs[second]))
    verdict = "exceeds" if mean - statistics.fmean(runs[second]) > spread else "is within"
    assert f"the margin {verdict} the seeds' spread (the larger sample SD, {_fmt(spread)})" in lines[2]
