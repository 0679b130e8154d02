"""docs/datasets.md's front door runs as written.

Every snippet before the registry section is run in order in a fresh folder that holds the files the
snippets name (small files in the real formats, from ``front_door_fixtures``): a ``python`` or ``yaml``
block whose first line is ``# <file>`` is written to that file, any other ``python`` block is executed, and
every ``fedsolve`` line of a ``bash`` block is run (exit code 0). The Hugging Face snippets need the
optional extra and are skipped, with the reason, where it is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

import front_door_fixtures as fx
from fedsolve.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "datasets.md"
REGISTRY = "## The registry datasets"


def front_door_blocks() -> list[tuple[str, str]]:
    text = DOC.read_text()
    assert REGISTRY in text, f"{DOC.name} has no section {REGISTRY!r}"
    return re.findall(r"^```(python|yaml|bash)\n(.*?)^```", text.split(REGISTRY)[0], flags=re.S | re.M)


def write_named_files(root: Path, with_hf: bool) -> None:
    """The files the snippets name: yours in practice, these small ones in the test."""
    fx.write_image_folder(root / "my_images", per_class=(6, 6, 6))
    fx.write_csv(root / "table.csv", fx.csv_rows(60))
    rng = np.random.default_rng(0)
    np.savez(root / "arrays.npz", x=rng.normal(size=(45, 4)).astype(np.float32), y=np.arange(45) % 3,
             client=np.arange(45) % 3)
    fx.write_torchvision_mnist(root / "torchvision_root", n=80)
    fx.write_cifar10(root / "torchvision_root", n_test=40)
    fx.write_cifar100(root / "torchvision_root", n=60, n_test=40)
    fx.write_leaf_femnist(root / "leaf" / "femnist" / "data")
    fx.write_leaf_shakespeare(root / "leaf" / "shakespeare" / "data")
    if with_hf:
        fx.write_hf_saved(root / "hf_saved")


def needs_hf(text: str) -> bool:
    return "hf.yaml" in text or "hf_saved" in text


def test_front_door_snippets_run_as_written(tmp_path, monkeypatch):
    with_hf = all(importlib.util.find_spec(m) is not None for m in ("datasets", "flwr_datasets"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("FEDSOLVE_DATA_DIR", str(tmp_path / "cache"))   # nothing may be fetched
    monkeypatch.setenv("FEDSOLVE_CALIBRATE", "0")
    write_named_files(tmp_path, with_hf)
    try:
        ran, skipped = run_blocks(tmp_path, with_hf)
    finally:
        sys.modules.pop("mydata", None)   # the snippet's module, imported from tmp_path
    assert (tmp_path / "runs" / "own" / "metrics.jsonl").read_bytes() == \
        (tmp_path / "runs" / "own-again" / "metrics.jsonl").read_bytes()
    assert len(ran) >= 10, ran
    assert not (tmp_path / "cache").exists()
    if skipped:
        pytest.skip(f"the optional extra fedsolve[hf] (datasets, flwr-datasets) is not installed: {skipped}")


def run_blocks(tmp_path: Path, with_hf: bool) -> tuple[list[str], list[str]]:
    """Write, execute or run each front-door snippet in order; the snippets run and the ones skipped."""
    ran, skipped = [], []
    for lang, body in front_door_blocks():
        first = body.splitlines()[0]
        named = re.fullmatch(r"# (\S+\.(?:py|yaml))", first)
        if named:
            (tmp_path / named.group(1)).write_text(body)
        elif lang == "python":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(body, f"{DOC.name} snippet", "exec"), {"__name__": "snippet"})
            ran.append("python")
        elif lang == "bash":
            for line in body.splitlines():
                line = line.split(" #")[0].strip()
                if not line.startswith("fedsolve "):
                    continue
                if needs_hf(line) and not with_hf:
                    skipped.append(line)
                    continue
                assert main(shlex.split(line)[1:] + ["--quiet"]) == 0, line
                ran.append(line)
    return ran, skipped
