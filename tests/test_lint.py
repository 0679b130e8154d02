"""The usual guards on src/ (issue 44 item 4): ruff's linter and formatter and mypy, configured in pyproject.toml,
run clean. They run in the fast lane, so an edit that breaks them is seen in the edit-test loop, not in CI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    exe = BIN / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if found is None:   # the test extra installs both: a missing tool is a broken set-up, not a pass
        pytest.fail(f"{name} is not installed; install the test extra: pip install -e '.[test]'")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_in_src():
    r = _run(_tool("ruff"), "check", "--no-cache", "src")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_src_is_ruff_formatted():
    r = _run(_tool("ruff"), "format", "--check", "--no-cache", "src")
    assert r.returncode == 0, "run `ruff format src`; these files differ:\n" + r.stdout[-6000:] + r.stderr[-2000:]


def test_mypy_finds_nothing_in_src():
    r = _run(_tool("mypy"), "--no-incremental", "src")   # settings and files from [tool.mypy] in pyproject.toml
    assert r.returncode == 0 and "Success: no issues found" in r.stdout, r.stdout[-6000:] + r.stderr[-2000:]


def test_the_checks_see_real_problems(tmp_path):
    """The three checks above can fail: each tool flags a file with a known problem of its kind."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x: int) -> str:\n    return x\n")
    assert _run(_tool("ruff"), "check", "--no-cache", "--isolated", "--select", "F401", str(bad)).returncode == 1
    assert _run(_tool("ruff"), "format", "--check", "--no-cache", "--isolated", str(tmp_path / "bad.py")
                ).returncode == 0   # formatted already; an unformatted one:
    (tmp_path / "ugly.py").write_text("x=[1,\n2]\n")
    assert _run(_tool("ruff"), "format", "--check", "--no-cache", "--isolated", str(tmp_path / "ugly.py")
                ).returncode == 1
    (tmp_path / "empty.toml").write_text("")
    r = _run(_tool("mypy"), "--no-incremental", "--config-file", str(tmp_path / "empty.toml"), str(bad))
    assert r.returncode == 1 and "Incompatible return value type" in r.stdout, r.stdout
