"""docs/personalized.md's scripts run as written: the opening script is examples/personalized_quadratic.py (run and
checked against its closed form in tests/test_personalized_clients.py), the personal-block snippet builds the head
block it prints, and the config of "From a config" runs with the command the page gives (at 2 rounds)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from fedsolve.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "personalized.md"


def _blocks(section: str) -> list[tuple[str, str]]:
    text = DOC.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    body = text[start:end if end > 0 else None]
    return re.findall(r"^```(python|yaml|bash)\n(.*?)^```", body, flags=re.S | re.M)


def test_the_opening_script_is_the_example_file():
    (lang, code), = _blocks("## A problem of your own")
    assert lang == "python" and code == (ROOT / "examples" / "personalized_quadratic.py").read_text()


def test_the_personal_block_snippet_runs(capsys):
    (_, code), = _blocks("## A model's personal block")
    ns: dict = {}
    exec(compile(code, "docs/personalized.md", "exec"), ns)
    assert capsys.readouterr().out.strip() == "['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']"
    assert ns["problem"].layout.block_size("personal") > 0


def test_the_config_runs_with_the_pages_command(tmp_path, monkeypatch, capsys):
    blocks = _blocks("## From a config")
    assert [b[0] for b in blocks] == ["yaml", "bash"]
    name = blocks[0][1].splitlines()[0].removeprefix("# ").strip()
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(blocks[0][1])
    args = shlex.split(blocks[1][1].strip())
    assert args[:3] == ["fedsolve", "compare", name]
    rc = main([*args[1:], "--set", "simulation.rounds=2", "--set", "simulation.eval_every=1", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    out = tmp_path / "runs" / "my_fedapm"
    assert (out / "report.md").is_file()
