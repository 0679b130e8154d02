"""A run folder is a unit (issue 45): one live writer (a lock naming its pid), a marker that says whether the
run finished (kill -9 and a full disk leave it incomplete, never finished-looking), no leftover temporary files,
nothing overwritten or mixed without --overwrite (judged by the folder's own record), labels that never share
a folder or leave --out; provenance in every run folder; one-line errors for bad arguments of the Python API and
of --import."""

from __future__ import annotations

import errno
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedsolve.cli import main
from fedsolve.engine import io as fio
from fedsolve.engine.run_folder import LOCK, clean_temps, folder_status, holder
from fedsolve.experiments.config import ConfigError, apply_overrides
from fedsolve.experiments.folders import slug

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "name": "tiny", "seeds": [0],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "logreg"},
    "simulation": {"rounds": 3, "eval_every": 1, "sampling": {"fraction": 0.5}},
    "defaults": {"lr": 0.1, "batch_size": 16},
    "algorithms": [{"name": "fedavg", "label": "FedAvg"}, {"name": "fedprox", "label": "FedProx",
                                                          "params": {"mu": 0.01}}],
}


def _cfg(tmp_path, *overrides, name="c.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(apply_overrides(BASE, list(overrides))))
    return str(p)


def _run(p, out, *more) -> list[str]:
    return ["run", p, "--algorithm", "FedAvg", "--out", str(out), "--quiet", *more]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _files(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file() and f.name != LOCK}


# ------------------------------------------------------------------ one live writer
def _hold_lock(folder: Path) -> subprocess.Popen:
    """Another process that holds ``folder``'s lock until it is killed."""
    code = ("import sys, time; from fedsolve.engine.run_folder import FolderLock; "
            "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_folder_refuses_a_second_run_resume_overwrite_and_compare_inside(tmp_path, capsys):
    p, out = _cfg(tmp_path), tmp_path / "live"
    assert main(_run(p, out)) == 0
    before = _files(out)
    proc = _hold_lock(out)
    try:
        capsys.readouterr()
        for extra in ([], ["--resume"], ["--overwrite"]):
            assert main(_run(p, out, *extra)) == 2, extra
            err = _one_line(capsys)
            assert str(out / LOCK) in err and f"pid {proc.pid}" in err, err
        assert main(["compare", p, "--out", str(out / "inside"), "--quiet"]) == 2     # inside a live folder
        assert f"pid {proc.pid}" in _one_line(capsys)
        assert holder(out) == str(proc.pid) and folder_status(out) == "completed"
    finally:
        proc.kill()
        proc.wait()
    assert _files(out) == before                          # nothing was written while it was live
    # the dead holder's lock file stays behind; the next run takes it over
    assert (out / LOCK).exists() and holder(out) is None
    assert main(_run(p, out, "--resume", "--set", "simulation.rounds=4")) == 0
    assert not (out / LOCK).exists() and json.loads((out / "summary.json").read_text())["rounds"] == 4


@pytest.mark.slow
def test_kill_9_leaves_an_incomplete_folder_that_resumes_to_the_same_metrics(tmp_path):
    p = _cfg(tmp_path, "simulation.rounds=400", "simulation.eval_every=20", "model.name=mlp")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(_run(p, whole)) == 0
    proc = subprocess.Popen([sys.executable, "-m", "fedsolve.cli", *_run(p, cut)], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    t_end = time.time() + 120
    while time.time() < t_end and proc.poll() is None:
        done = (cut / "metrics.jsonl").read_text().splitlines() if (cut / "metrics.jsonl").exists() else []
        if len(done) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert folder_status(cut) == "incomplete" and not (cut / "summary.json").exists()
    (cut / ".checkpoint.pt.k9k9k9k9.tmp").write_bytes(b"half a checkpoint")   # as a kill mid-write leaves it
    assert main(_run(p, cut, "--resume")) == 0
    assert filecmp.cmp(whole / "metrics.jsonl", cut / "metrics.jsonl", shallow=False)
    assert folder_status(cut) == "completed" and not list(cut.glob(".*"))


def test_stray_temporary_files_are_removed_when_the_folder_is_opened(tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "cells").mkdir()
    stray = [".checkpoint.pt.a1b2c3d4", ".metrics.jsonl.zzzzzzzz.tmp", "plots/.test_loss.png.abcdefgh.tmp",
             "cells/.attack_0.4_5e3f.json.k2j4h6g8.tmp"]
    kept = [".hidden_note", "notes.txt", ".checkpoint.pt"]
    for f in stray + kept:
        (tmp_path / f).write_text("x")
    assert sorted(str(f.relative_to(tmp_path)) for f in clean_temps(tmp_path)) == sorted(stray)
    assert all((tmp_path / f).exists() for f in kept)


# ------------------------------------------------------------------ a full disk
def _disk_fills_after(monkeypatch, n_ok: int, spare_marker: bool):
    """Every file write fails with ENOSPC (where the kernel reports it: at the flush to disk) once ``n_ok``
    checkpoints are written (``spare_marker``: run.json still writes)."""
    real, count = os.fsync, {"ck": 0}

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        count["ck"] += ".checkpoint.pt." in name
        if count["ck"] > n_ok and not (spare_marker and ".run.json." in name):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fio.os, "fsync", fsync)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
@pytest.mark.parametrize("spare_marker", [True, False], ids=["marker-written", "marker-not-written"])
def test_a_full_disk_is_one_line_and_leaves_the_folder_incomplete(tmp_path, monkeypatch, capsys, spare_marker):
    p = _cfg(tmp_path, "simulation.rounds=6")
    assert main(_run(p, tmp_path / "whole")) == 0
    out = tmp_path / "full"
    _disk_fills_after(monkeypatch, 3, spare_marker)
    capsys.readouterr()
    assert main(_run(p, out)) == 2
    err = _one_line(capsys)
    assert "No space left on device" in err and "checkpoint.pt" in err and "--resume" in err, err
    marker = json.loads((out / "run.json").read_text())
    assert marker["status"] == ("failed" if spare_marker else "running")
    assert folder_status(out) == "incomplete" and not (out / "summary.json").exists()
    assert not [f for f in out.iterdir() if f.name.startswith(".")]      # no temporary file, no lock left
    assert main(_run(p, out, "--resume")) == 2                           # still full: the same one line
    _one_line(capsys)
    monkeypatch.undo()                                                   # space freed
    assert main(_run(p, out, "--resume")) == 0
    assert filecmp.cmp(tmp_path / "whole" / "metrics.jsonl", out / "metrics.jsonl", shallow=False)
    assert folder_status(out) == "completed"


# ------------------------------------------------------------------ judged by the folder's own record
def test_a_finished_run_without_its_checkpoint_is_not_overwritten(tmp_path, capsys):
    p, out = _cfg(tmp_path), tmp_path / "run"
    assert main(_run(p, out)) == 0
    (out / "checkpoint.pt").unlink()
    before = _files(out)
    capsys.readouterr()
    assert main(_run(p, out, "--set", "defaults.lr=0.5")) == 2
    assert "already holds a run" in _one_line(capsys)
    assert _files(out) == before
    assert main(_run(p, out, "--overwrite", "--set", "defaults.lr=0.5")) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["algorithm"]["params"]["lr"] == 0.5


def test_a_run_and_a_compare_never_write_into_each_others_folder(tmp_path, capsys):
    p = _cfg(tmp_path)
    assert main(["compare", p, "--out", str(tmp_path / "cmp"), "--quiet"]) == 0
    assert main(_run(p, tmp_path / "run")) == 0
    capsys.readouterr()
    for argv, words in ((_run(p, tmp_path / "cmp", "--overwrite"), "holds a compare folder"),
                        (["compare", p, "--out", str(tmp_path / "run"), "--quiet", "--overwrite"],
                         "holds a run folder")):
        assert main(argv) == 2
        assert words in _one_line(capsys)


def test_compare_into_a_finished_folder_must_agree_with_its_record(tmp_path, capsys):
    p, out = _cfg(tmp_path), tmp_path / "cmp"
    assert main(["compare", p, "--out", str(out), "--quiet", "--only", "FedAvg"]) == 0
    before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}
    capsys.readouterr()
    refused = [(["--set", "seeds=[1,2]"], "seeds"),                                  # other seeds
               (["--only", "FedProx", "--set", "defaults.lr=0.05"], "defaults.lr (0.1 -> 0.05)"),
               (["--only", "FedProx", "--set", "simulation.rounds=5"], "simulation.rounds (3 -> 5)"),
               (["--resume", "--only", "FedAvg", "--set", "data.num_clients=5"], "data.num_clients")]
    for extra, words in refused:
        assert main(["compare", p, "--out", str(out), "--quiet", *extra]) == 2, extra
        err = _one_line(capsys)
        assert words in err and "--overwrite" in err, (extra, err)
    assert {f: f.read_bytes() for f in out.rglob("*") if f.is_file()} == before
    # an algorithm of the same config may be added; the record then lists both
    assert main(["compare", p, "--out", str(out), "--quiet", "--only", "FedProx"]) == 0
    record = yaml.safe_load((out / "config.yaml").read_text())
    assert [a["label"] for a in record["algorithms"]] == ["FedAvg", "FedProx"]
    # ... and later the other's params must agree too
    assert main(["compare", p, "--out", str(out), "--quiet", "--resume", "--set", "algorithms.0.params.lr=0.3"]) == 2
    assert "algorithms[FedAvg].params.lr" in _one_line(capsys)
    # a label that shares a recorded one's folder name is refused
    spaced = _cfg(tmp_path, "algorithms.0.label=Fed Avg", name="spaced.yaml")
    assert main(["compare", spaced, "--out", str(tmp_path / "c2"), "--quiet", "--only", "Fed Avg"]) == 0
    under = _cfg(tmp_path, "algorithms.0.label=Fed_Avg", name="under.yaml")
    assert main(["compare", under, "--out", str(tmp_path / "c2"), "--quiet", "--only", "Fed_Avg"]) == 2
    err = _one_line(capsys)
    assert "'Fed Avg'" in err and "share the folder name 'Fed_Avg'" in err, err


def test_labels_map_to_distinct_folders_inside_out(tmp_path, capsys):
    assert slug("Fed Avg") == slug("Fed_Avg") == "Fed_Avg"
    assert slug("..") == "_." and slug(".") == "_" and slug("") == "_" and slug("../x") == "_._x"
    p = _cfg(tmp_path, "algorithms.0.label=Fed Avg", "algorithms.1.label=Fed_Avg")
    assert main(["compare", p, "--out", str(tmp_path / "c"), "--quiet"]) == 2
    err = _one_line(capsys)
    assert "'Fed Avg'" in err and "'Fed_Avg'" in err and "share the folder name" in err, err
    p = _cfg(tmp_path, "algorithms.0.label=..", "algorithms.1.label=../../escape", name="dots.yaml")
    out = tmp_path / "deep" / "c"
    assert main(["compare", p, "--out", str(out), "--quiet"]) == 0
    written = {f.resolve() for f in tmp_path.rglob("summary.json")}
    assert written and all(out.resolve() in f.parents for f in written), written
    assert (out / "_." / "seed0" / "summary.json").exists()


# ------------------------------------------------------------------ provenance
def test_every_run_folder_records_its_provenance(tmp_path):
    p = _cfg(tmp_path)
    assert main(_run(p, tmp_path / "a")) == 0
    assert main(_run(p, tmp_path / "b")) == 0
    assert main(_run(p, tmp_path / "c", "--set", "defaults.lr=0.2")) == 0
    prov = {d: json.loads((tmp_path / d / "summary.json").read_text())["provenance"] for d in "abc"}
    a = prov["a"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert a["commit"] == head and isinstance(a["dirty"], bool) and a["commit_source"] == "recorded"
    assert a["config_hash"] == prov["b"]["config_hash"] != prov["c"]["config_hash"]
    assert a["config_hash"].startswith("sha256:") and len(a["config_hash"]) == 7 + 64
    assert {"fedsolve", "torch", "numpy", "python"} <= set(a["versions"])
    assert a["versions"]["torch"] == torch.__version__
    assert a["machine"]["cpu_count"] == os.cpu_count() and a["device"] == "cpu"
    assert {"cpu", "simd"} <= set(a["machine"])
    assert a["command"].startswith("fedsolve run ") and "--out" in a["command"]
    assert json.loads((tmp_path / "a" / "run.json").read_text())["provenance"]["commit"] == head
    assert main(["compare", p, "--out", str(tmp_path / "cmp"), "--quiet"]) == 0
    assert json.loads((tmp_path / "cmp" / "summary.json").read_text())["provenance"]["commit"] == head


def test_outside_a_git_checkout_the_commit_is_unknown(tmp_path):
    """An installed copy of the package (here: the package folder copied out of the checkout) records
    ``commit: unknown``."""
    shutil.copytree(ROOT / "src" / "fedsolve", tmp_path / "site" / "fedsolve",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = "from fedsolve.engine.provenance import provenance; import json; print(json.dumps(provenance()))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    prov = json.loads(out.stdout)
    assert prov["commit"] == "unknown" and prov["dirty"] is None and prov["versions"]["fedsolve"]


def test_the_recorded_commit_is_the_one_the_process_loaded_even_when_head_moves(tmp_path):
    """A long suite keeps recording the commit its code was loaded from (pinned at the first record, or at the
    CLI's start) although a commit lands in the checkout meanwhile; the checkout's HEAD itself has moved."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "src" / "fedsolve", repo / "fedsolve", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a"]):
        subprocess.run(["git", *cmd] if cmd[0] == "init" else [*git, *cmd], cwd=repo, check=True)
    code = (
        "import json, subprocess, sys\n"
        "from fedsolve.engine.provenance import provenance, source_commit\n"
        "first = provenance()['commit']\n"
        "subprocess.run(sys.argv[1:], check=True)\n"
        "print(json.dumps([first, provenance()['commit'], source_commit()[0]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo)}
    out = subprocess.run([sys.executable, "-c", code, *git, "commit", "-q", "--allow-empty", "-m", "b"],
                         capture_output=True, text=True, env=env, cwd=repo)
    assert out.returncode == 0, out.stderr
    first, later, head = json.loads(out.stdout)
    heads = subprocess.run(["git", "log", "--format=%H"], cwd=repo, capture_output=True, text=True).stdout.split()
    assert first == later == heads[1] and head == heads[0] != first


# ------------------------------------------------------------------ one-line errors (Python API, --import, files)
@pytest.mark.parametrize("args, kwargs, words", [
    ((5,), {}, "config: expected a YAML path"),
    (([1, 2],), {}, "config: expected a YAML path"),
    ((BASE,), {"sed": 1}, "unknown keyword 'sed' (did you mean 'seed'?)"),
    ((BASE,), {"seed": -1}, "seed: expected a non-negative integer"),
    ((BASE,), {"overrides": "simulation.rounds=1"}, "overrides: expected a list"),
    ((BASE,), {"algorithm": 3}, "algorithm: expected a label"),
])
def test_python_api_bad_arguments_are_config_errors_naming_them(args, kwargs, words):
    import fedsolve

    with pytest.raises(ConfigError) as e:
        fedsolve.run(*args, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_python_api_out_is_locked_checked_and_refuses_a_file(tmp_path):
    import fedsolve

    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="out: .*afile is a file"):
        fedsolve.run(BASE, algorithm="FedAvg", out=tmp_path / "afile")
    fedsolve.run(BASE, algorithm="FedAvg", out=tmp_path / "o")
    assert folder_status(tmp_path / "o") == "completed" and (tmp_path / "o" / "config.yaml").exists()
    with pytest.raises(ConfigError, match="already holds a run; .*--overwrite"):
        fedsolve.run(BASE, algorithm="FedAvg", out=tmp_path / "o", overrides=["defaults.lr=0.3"])
    fedsolve.run(BASE, algorithm="FedAvg", out=tmp_path / "o", overrides=["defaults.lr=0.3"], overwrite=True)


def test_import_of_a_broken_module_and_a_broken_summary_are_one_line(tmp_path, capsys):
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "needs.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    for argv, words in (
            (["--import", str(tmp_path / "bad_syntax.py"), "list"], "not valid Python"),
            (["--import", str(tmp_path / "raises.py"), "list"], "RuntimeError: boom at import"),
            (["--import", str(tmp_path / "needs.py"), "list"], "'no_such_dependency_xyz', which is not installed"),
            (["report", str(tmp_path / "broken")], str(tmp_path / "broken" / "summary.json"))):
        assert main(argv) == 2, argv
        err = _one_line(capsys)
        assert words in err, (argv, err)


def test_labels_beyond_the_classes_and_a_model_of_another_float_type_are_refused():
    import numpy as np

    from fedsolve.data.federated import FederatedData
    from fedsolve.families.minimax.problem import adversarial_problem
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    rng = np.random.default_rng(0)
    train = [(rng.normal(size=(10, 5)).astype(np.float32), rng.integers(0, 5, 10)) for _ in range(3)]
    with pytest.raises(ValueError, match="train_y: label 4 is outside the 3 classes .*allowed: labels 0 to 2"):
        FederatedData.from_client_arrays(train, train, num_classes=3)
    data = FederatedData.from_client_arrays(train, train, num_classes=5)
    with pytest.raises(ValueError, match="model_fn: the model's parameters are float64 but the data's features "
                                         "are float32"):
        FederatedProblem(data, lambda: torch.nn.Linear(5, 5).double())
    FederatedProblem(data, build_model_fn("logreg", data.input_shape, 5))       # the same type: fine
    with pytest.raises(ValueError, match="loss: unknown 'foo'; allowed"):
        adversarial_problem(data, loss="foo")
