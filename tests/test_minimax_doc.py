"""docs/minimax.md's scripts run as written: the opening saddle problem (solved: the gradient of its mean f vanishes
at the answer) and "Your own pair of domains" (the Python snippet, then the module and the config it names, run with
`fedsolve compare` at reduced rounds)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import torch

from fedsolve.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "minimax.md"


def _blocks(section: str) -> list[tuple[str, str]]:
    text = DOC.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    body = text[start:end if end > 0 else None]
    return re.findall(r"^```(python|yaml|bash)\n(.*?)^```", body, flags=re.S | re.M)


def test_the_opening_script_solves_its_saddle_problem(capsys):
    (lang, code), = [b for b in _blocks("## A saddle problem of your own") if b[0] == "python"]
    ns: dict = {}
    exec(compile(code, "docs/minimax.md", "exec"), ns)
    assert "f(x, y) =" in capsys.readouterr().out
    f, data = ns["f"], ns["data"]
    x, y = (t.detach().requires_grad_(True) for t in (ns["x"], ns["y"]))
    mean_f = torch.stack([f(torch.tensor(i), x, y, d) for i, d in enumerate(data)]).mean()
    gx, gy = torch.autograd.grad(mean_f, (x, y))
    print(f"|grad f| at the doc's answer: {float(torch.cat([gx, gy]).norm()):.1e}")
    assert float(torch.cat([gx, gy]).norm()) < 1e-4      # float32: the saddle point to round-off


def test_your_own_pair_of_domains_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = _blocks("### Your own pair of domains")
    assert [b[0] for b in blocks] == ["python", "python", "yaml", "bash"]
    ns: dict = {}
    exec(compile(blocks[0][1], "docs/minimax.md", "exec"), ns)
    assert ns["problem"].num_clients == 2 and ns["data"].input_shape == (3, 8, 8)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "mydomains", raising=False)   # the module written here, not an earlier one
    for _, code in blocks[1:3]:
        name = code.splitlines()[0].removeprefix("# ").strip()
        (tmp_path / name).write_text(code)
    line, = [ln for ln in blocks[3][1].splitlines() if ln.startswith("fedsolve ")]
    rc = main([*shlex.split(line)[1:], "--set", "simulation.rounds=2", "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "report.md").is_file()
