"""Faults the run folder must survive (issue 45), beyond tests/test_trust.py and tests/test_run_folder.py: Ctrl-C
and kill -9 in a sweep of batched runs, in a suite cell and in ``fedsolve verify``; a full disk at every kind of
write; a read-only folder; two processes started on one folder; broken summaries and logs; a results folder moved
elsewhere. Each ends in one line (or a clean exit code), never a traceback, never a lost or mixed result, and
``--resume`` gives the uninterrupted run's numbers byte for byte."""

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
import yaml

from fedsolve.cli import main
from fedsolve.engine import io as fio
from fedsolve.engine.run_folder import LOCK, folder_status

BASE = {
    "name": "faults", "seeds": [0, 1, 2],
    "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
             "partition_params": {"alpha": 0.5, "min_size": 10}},
    "model": {"name": "mlp", "params": {"hidden": [8]}},
    "simulation": {"rounds": 6, "eval_every": 1, "executor": "batched"},
    "defaults": {"lr": 0.1, "batch_size": 16},
    "algorithms": [{"name": "fedavg", "label": "FedAvg"}],
}
SUITE = {"name": "faults_suite", "description": "two step sizes of the faults config", "experiment": "c.yaml",
         "seeds": [0, 1], "sweep": {"params.lr": [0.05, 0.1]}}


def _write(tmp: Path, raw: dict = BASE, name: str = "c.yaml") -> str:
    (tmp / name).write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(tmp / name)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _logs(folder: Path) -> dict[str, bytes]:
    """Every per-round log under ``folder`` by its path relative to it."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("metrics.jsonl"))}


def _same_to_roundoff(a: dict[str, bytes], b: dict[str, bytes], rel: float = 1e-5) -> bool:
    """The same logs, record by record and key by key, numbers equal to ``rel`` (a batched sweep's kernel rounds
    differently when other runs share its call: docs/suites.md)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        ra = [json.loads(x) for x in a[k].splitlines()]
        rb = [json.loads(x) for x in b[k].splitlines()]
        if len(ra) != len(rb) or any(x.keys() != y.keys() for x, y in zip(ra, rb)):
            return False
        for x, y in zip(ra, rb):
            if x != {key: (pytest.approx(v, rel=rel, abs=1e-9) if isinstance(v, float) else v)
                     for key, v in y.items()}:
                return False
    return True


def _no_temp_files(folder: Path) -> bool:
    return not [f for f in folder.rglob(".*") if f.name != LOCK]


class _Interrupt:
    """Ctrl-C (a real SIGINT to this process, which Python turns into KeyboardInterrupt in the main thread) at the
    ``at``-th write of a file named ``name``, inside the write before its rename: the moment a checkpoint, a log or
    a summary is half written (in a batched sweep the runs write from threads of their own; the main thread
    takes the signal, as it takes a user's Ctrl-C)."""

    def __init__(self, monkeypatch, name: str, at: int):
        self.name, self.at, self.seen = name, at, 0
        real = fio.os.fsync
        self.old = signal.signal(signal.SIGINT, signal.default_int_handler)

        def fsync(fd):
            if f".{self.name}." in os.readlink(f"/proc/self/fd/{fd}"):
                self.seen += 1
                if self.seen == self.at:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.5)   # the main thread takes it now
            return real(fd)

        monkeypatch.setattr(fio.os, "fsync", fsync)

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self.old)


pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")


# ------------------------------------------------------------------ Ctrl-C in a batched sweep and in a suite cell
@pytest.mark.parametrize("name, at, batch", [("checkpoint.pt", 4, True), ("metrics.jsonl", 7, True),
                                             ("summary.json", 2, True), ("checkpoint.pt", 4, False)])
def test_ctrl_c_in_a_batched_sweep_resumes_to_the_same_logs(tmp_path, monkeypatch, capsys, name, at, batch):
    """Three seeds train as one batch (the batched executor); Ctrl-C while one of their files is written. The
    resumed sweep's logs: the uninterrupted one's to float round-off (its kernel calls hold other runs after the
    resume), byte for byte with --no-batch-sweeps."""
    p = _write(tmp_path)
    flags = [] if batch else ["--no-batch-sweeps"]
    assert main(["compare", p, "--out", str(tmp_path / "whole"), "--quiet", *flags]) == 0
    whole = _logs(tmp_path / "whole")
    assert len(whole) == 3
    cut = tmp_path / "cut"
    with monkeypatch.context() as m:
        stop = _Interrupt(m, name, at)
        capsys.readouterr()
        try:
            assert main(["compare", p, "--out", str(cut), "--quiet", *flags]) == 130
        finally:
            stop.restore()
        assert stop.seen >= at
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "continue with --resume" in err and len(err.splitlines()) == 1, err
    # not finished; a run's thread may have been inside a write when the signal came: its temporary file is
    # removed by the next start (issue 45), so the check for temporary files follows the resume
    assert not (cut / "summary.json").exists() and folder_status(cut) != "completed"
    assert main(["compare", p, "--out", str(cut), "--quiet", "--resume", *flags]) == 0
    assert folder_status(cut) == "completed" and _no_temp_files(cut)
    assert _same_to_roundoff(_logs(cut), whole) if batch else _logs(cut) == whole


def test_ctrl_c_in_a_suite_cell_resumes_to_the_same_table(tmp_path, monkeypatch, capsys):
    _write(tmp_path, {**BASE, "seeds": [0]})
    s = _write(tmp_path, SUITE, "s.yaml")
    assert main(["suite", s, "--out", str(tmp_path / "whole"), "--quiet"]) == 0
    whole = _logs(tmp_path / "whole")
    assert len(whole) == 4   # 2 cells x 2 seeds
    cut = tmp_path / "cut"
    with monkeypatch.context() as m:
        stop = _Interrupt(m, "checkpoint.pt", 9)   # in the second cell
        try:
            assert main(["suite", s, "--out", str(cut), "--quiet"]) == 130
        finally:
            stop.restore()
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "--resume" in err, err
    assert main(["suite", s, "--out", str(cut), "--quiet", "--resume"]) == 0
    assert _same_to_roundoff(_logs(cut), whole) and _no_temp_files(cut)   # a batched sweep: docs/suites.md


# ------------------------------------------------------------------ verify is read-only, also when interrupted
def test_ctrl_c_in_verify_is_one_line_and_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys):
    from fedsolve.experiments import verify as verify_mod

    p = _write(tmp_path, {**BASE, "seeds": [0]})
    out = tmp_path / "run"
    assert main(["run", p, "--out", str(out), "--quiet"]) == 0
    before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_mod, "rerun", interrupted)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 130
    err = _one_line(capsys)
    assert "interrupted" in err, err
    assert {f: f.read_bytes() for f in out.rglob("*") if f.is_file()} == before


@pytest.mark.slow
def test_kill_9_in_verify_and_in_a_suite_cell(tmp_path):
    """kill -9 in ``fedsolve verify --full`` changes nothing in the verified folder; kill -9 in a suite cell leaves
    it incomplete, and ``--resume`` gives the uninterrupted suite's logs."""
    long = {**BASE, "seeds": [0], "simulation": {**BASE["simulation"], "rounds": 400, "eval_every": 20}}
    p = _write(tmp_path, long)
    run = tmp_path / "run"
    assert main(["run", p, "--out", str(run), "--quiet"]) == 0
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    proc = subprocess.Popen([sys.executable, "-m", "fedsolve.cli", "verify", str(run), "--full"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    s = _write(tmp_path, SUITE, "s.yaml")
    assert main(["suite", s, "--out", str(tmp_path / "whole"), "--quiet"]) == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "fedsolve.cli", "suite", s, "--out", str(cut), "--quiet"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t_end = time.time() + 240
    while time.time() < t_end and proc.poll() is None and len(list(cut.rglob("checkpoint.pt"))) < 1:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (cut / "report.md").exists()
    assert main(["suite", s, "--out", str(cut), "--quiet", "--resume"]) == 0
    assert _logs(cut) == _logs(tmp_path / "whole") and _no_temp_files(cut)


# ------------------------------------------------------------------ a full disk at every kind of write
def _disk_full_at(monkeypatch, name: str) -> None:
    """The disk is full from the first write of a file named ``name`` on (ENOSPC at the flush, as the kernel
    reports it)."""
    real, state = fio.os.fsync, {"full": False}

    def fsync(fd):
        state["full"] = state["full"] or f".{name}." in os.readlink(f"/proc/self/fd/{fd}")
        if state["full"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fio.os, "fsync", fsync)


@pytest.mark.parametrize("cmd, name", [("run", "config.yaml"), ("run", "metrics.jsonl"), ("run", "checkpoint.pt"),
                                       ("run", "summary.json"), ("run", "per_client.json"), ("run", "report.md"),
                                       ("run", "test_accuracy.png"), ("compare", "summary.json"),
                                       ("compare", "report.md"), ("suite", "suite.json")])
def test_a_full_disk_at_each_write_is_one_line_and_resumes(tmp_path, monkeypatch, capsys, cmd, name):
    _write(tmp_path, {**BASE, "seeds": [0], "simulation": {**BASE["simulation"], "rounds": 3}})
    target = _write(tmp_path, {**SUITE, "seeds": [0]}, "s.yaml") if cmd == "suite" else str(tmp_path / "c.yaml")
    argv = [cmd, target, "--quiet"] + (["--algorithm", "FedAvg"] if cmd == "run" else [])
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "full"
    if cmd == "compare" and name == "summary.json":   # the compare's own summary, after its runs' summaries
        real, seen = fio.os.fsync, {"n": 0}

        def fsync(fd):
            seen["n"] += ".summary.json." in os.readlink(f"/proc/self/fd/{fd}")
            if seen["n"] >= 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd)
        monkeypatch.setattr(fio.os, "fsync", fsync)
    else:
        _disk_full_at(monkeypatch, name)
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert "No space left on device" in err and name in err, err
    assert folder_status(out) != "completed" and _no_temp_files(out)
    monkeypatch.undo()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    assert _logs(out) == _logs(tmp_path / "whole") and folder_status(out) == "completed"


# ------------------------------------------------------------------ a read-only folder
def _read_only(folder: Path) -> bool:
    """Make ``folder`` read-only even for root (the immutable flag), or by its mode for others; False when
    neither holds here."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return True
    return subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0 if shutil.which(
        "chattr") else False


def _writable(folder: Path) -> None:
    if os.geteuid() != 0:
        folder.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def test_a_read_only_folder_is_one_line_and_left_as_it_was(tmp_path, capsys):
    p = _write(tmp_path, {**BASE, "seeds": [0]})
    out = tmp_path / "run"
    assert main(["run", p, "--out", str(out), "--quiet"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    if not _read_only(out):
        pytest.skip("cannot make a folder read-only here (root without chattr)")
    try:
        capsys.readouterr()
        for extra in (["--resume", "--set", "simulation.rounds=8"], ["--overwrite"]):
            assert main(["run", p, "--out", str(out), "--quiet", *extra]) == 2, extra
            err = _one_line(capsys)
            assert str(out) in err and "cannot write" in err, err
        assert main(["report", str(out)]) == 2
        assert "report.md" in _one_line(capsys) or str(out) in err
    finally:
        _writable(out)
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before
    assert main(["run", p, "--out", str(out), "--quiet", "--resume", "--set", "simulation.rounds=8"]) == 0


# ------------------------------------------------------------------ two processes on one folder
@pytest.mark.slow
def test_two_runs_started_on_one_new_folder_one_wins_and_the_folder_is_its(tmp_path):
    p = _write(tmp_path, {**BASE, "seeds": [0], "simulation": {**BASE["simulation"], "rounds": 40}})
    out = tmp_path / "both"
    procs = [subprocess.Popen([sys.executable, "-m", "fedsolve.cli", "run", p, "--out", str(out), "--quiet",
                               "--set", f"defaults.lr={lr}"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for lr in (0.1, 0.2)]
    done = [(pr.wait(timeout=300), pr.communicate()[1]) for pr in procs]
    assert sorted(rc for rc, _ in done) == [0, 2], done   # never both
    loser = next(err for rc, err in done if rc == 2)   # it found the folder live, or holding the winner's run
    assert len(loser.strip().splitlines()) == 1 and "Traceback" not in loser, loser
    assert "in use by a live run" in loser or "already holds a run" in loser, loser
    winner_lr = (0.1, 0.2)[next(i for i, (rc, _) in enumerate(done) if rc == 0)]
    assert yaml.safe_load((out / "config.yaml").read_text())["algorithm"]["params"]["lr"] == winner_lr
    assert folder_status(out) == "completed" and _no_temp_files(out)


def test_runs_started_at_once_never_trip_over_each_others_write_probe(tmp_path):
    """The check that --out is writable leaves a probe there and removes it: a shared probe name let one run remove
    the other's probe first, and that run stopped with "cannot write there (No such file or directory)"."""
    import threading

    from fedsolve import cli

    out, errors, start = tmp_path / "shared", [], threading.Barrier(8)

    def probe():
        start.wait()
        for _ in range(200):
            try:
                cli._out_dir(out)
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                errors.append(str(e))

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and list(out.iterdir()) == []


# ------------------------------------------------------------------ broken records, a moved folder
def test_a_broken_summary_or_log_is_repaired_by_resume_and_never_overwritten(tmp_path, capsys):
    p = _write(tmp_path, {**BASE, "seeds": [0]})
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert main(["run", p, "--out", str(whole), "--quiet", "--set", "simulation.rounds=8"]) == 0
    assert main(["run", p, "--out", str(out), "--quiet"]) == 0
    (out / "summary.json").write_text("{broken")
    (out / "metrics.jsonl").write_text('{"round": 0}\n{bro')
    capsys.readouterr()
    assert main(["run", p, "--out", str(out), "--quiet"]) == 2          # still a run: not overwritten
    assert "already holds a run" in _one_line(capsys)
    assert main(["report", str(out)]) == 2
    assert "summary.json" in _one_line(capsys)
    assert main(["run", p, "--out", str(out), "--quiet", "--resume", "--set", "simulation.rounds=8"]) == 0
    assert filecmp.cmp(whole / "metrics.jsonl", out / "metrics.jsonl", shallow=False)
    assert json.loads((out / "summary.json").read_text())["rounds"] == 8


def test_a_moved_results_folder_reports_verifies_and_resumes(tmp_path):
    p = _write(tmp_path, {**BASE, "seeds": [0, 1]})
    assert main(["compare", p, "--out", str(tmp_path / "longer"), "--quiet", "--set", "simulation.rounds=8"]) == 0
    assert main(["compare", p, "--out", str(tmp_path / "here"), "--quiet"]) == 0
    moved = tmp_path / "elsewhere" / "results"
    moved.parent.mkdir()
    shutil.move(tmp_path / "here", moved)
    assert main(["report", str(moved)]) == 0
    assert main(["verify", str(moved)]) == 0
    assert main(["compare", p, "--out", str(moved), "--quiet", "--resume", "--set", "simulation.rounds=8"]) == 0
    assert _logs(moved) == _logs(tmp_path / "longer")


def test_a_resume_clears_temporary_files_in_finished_runs_of_a_compare(tmp_path):
    """A thread of a batched sweep may be inside a write when Ctrl-C comes; its run may already be finished, so
    the resume does not reopen it: opening the compare folder removes such leftovers in its run folders."""
    p = _write(tmp_path, {**BASE, "simulation": {**BASE["simulation"], "rounds": 3}})
    out = tmp_path / "cut"
    assert main(["compare", p, "--out", str(out), "--quiet"]) == 0
    stray = [out / "FedAvg" / "seed1" / ".metrics.jsonl.abcdefgh.tmp", out / ".summary.json.abcdefgh.tmp"]
    for f in stray:
        f.write_text("half a write")
    assert not _no_temp_files(out)
    assert main(["compare", p, "--out", str(out), "--quiet", "--resume"]) == 0
    assert _no_temp_files(out) and folder_status(out) == "completed"
