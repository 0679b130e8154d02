"""The compare report's table: which cells are bold."""
from types import SimpleNamespace

from fedsolve.experiments.report import write_compare_report


def _stat(v):
    return {"mean": v, "std": 0.0, "n": 1}


def test_bold_marks_the_best_accuracy_and_loss_but_never_a_cluster_count(tmp_path):
    cfg = SimpleNamespace(name="t", description="", seeds=[0], paper={},
                          data=SimpleNamespace(num_clients=4, dataset="synthetic", label="synthetic", partition="iid",
                                               partition_params={}),
                          model=SimpleNamespace(name="logreg", label="logreg"), simulation=SimpleNamespace(rounds=2))

    def entry(acc, loss, k):
        fin = {"test_accuracy": _stat(acc), "test_loss": _stat(loss), "num_clusters": _stat(k)}
        return {"final": fin, "best": {"test_accuracy": _stat(acc)}, "runs": 1, "diverged": 0,
                "uplink_bytes": 0.0, "wall_time_s": 1.0}

    agg = {"algorithms": {"A": entry(0.9, 0.5, 4.0), "B": entry(0.7, 0.3, 20.0)}}
    write_compare_report(tmp_path, cfg, agg, {})
    lines = (tmp_path / "report.md").read_text().splitlines()
    a = next(ln for ln in lines if ln.startswith("| A |"))     # the first table: final-round metrics
    b = next(ln for ln in lines if ln.startswith("| B |"))
    assert "**0.9000 ± 0.0000**" in a and "**0.3000 ± 0.0000**" in b     # higher accuracy, lower loss
    assert "**4.0000" not in a and "**20.0000" not in b                   # 4 is not "worse" than 20
    assert "| 20.0000 ± 0.0000 |" in b
