"""The documentation stays true to the code.

* docs/config-reference.md equals what scripts/gen_config_reference.py generates now;
* examples/my_fedavgm.py runs, and the algorithm shown in docs/writing-an-algorithm.md is that file's;
* every relative link in README.md and docs/*.md points to an existing file (and heading);
* every `fedsolve` command line in README.md and docs/getting-started.md parses, and its config
  with its --set overrides validates.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOC_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
REGEN = ".venv/bin/python scripts/gen_config_reference.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _strip_code(text: str) -> str:
    """Markdown without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _anchors(md: str) -> set[str]:
    """GitHub-style anchors of the headings of a markdown file."""
    gen = _load_generator()
    out = set()
    for line in re.sub(r"^```.*?^```", "", md, flags=re.S | re.M).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(gen._anchor(m.group(1)))
    return out


# ------------------------------------------------------------------ generated reference
def test_config_reference_is_up_to_date():
    gen = _load_generator()
    path = DOCS / "config-reference.md"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing; run: {REGEN}"
    expected = gen.render()
    assert path.read_text() == expected, (
        f"{path.relative_to(ROOT)} is out of date with the typed configs / registries; run: {REGEN}")


def test_config_reference_is_deterministic():
    gen = _load_generator()
    assert gen.render() == gen.render()


def test_config_reference_covers_every_algorithm_and_registry():
    from fedsolve.families import ALGORITHMS
    from fedsolve.data.datasets import DATASETS
    from fedsolve.data.partition import PARTITIONERS
    from fedsolve.models import MODELS

    text = _load_generator().render()
    for name, cls in ALGORITHMS.items():
        if cls.__module__.startswith("fedsolve."):
            assert f"### algorithm `{name}`" in text
            for field in cls.Config.model_fields:
                assert f"| `{field}` |" in text
    for name in [*DATASETS, *PARTITIONERS, *MODELS]:
        assert f"| `{name}` |" in text


# ------------------------------------------------------------------ example
@pytest.mark.slow
def test_example_algorithm_runs(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "my_fedavgm.py"), str(tmp_path / "cmp")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sequential == vectorized: ok" in res.stdout
    assert "momentum=0 reproduces FedAvg: ok" in res.stdout
    assert (tmp_path / "cmp" / "report.md").is_file()
    assert (tmp_path / "cmp" / "FedAvgM" / "seed1" / "metrics.jsonl").is_file()


def test_doc_shows_the_example_code():
    doc = (DOCS / "writing-an-algorithm.md").read_text()
    example = (ROOT / "examples" / "my_fedavgm.py").read_text()
    blocks = [b for b in _code_blocks(doc, "python") if "@register" in b]
    assert blocks, "docs/writing-an-algorithm.md has no code block with @register"
    block = blocks[0]
    body = block[block.index("class FedAvgMConfig"):]
    assert body.strip() in example, "the algorithm in docs/writing-an-algorithm.md differs from examples/my_fedavgm.py"
    for line in block[:block.index("class FedAvgMConfig")].splitlines():
        if line.startswith(("import ", "from ")):
            assert line in example, f"import {line!r} of the doc is not in the example"


# ------------------------------------------------------------------ links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _links():
    for md in DOC_FILES:
        for target in LINK.findall(_strip_code(md.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield md, target


@pytest.mark.parametrize("md,target", list(_links()), ids=lambda v: v if isinstance(v, str) else v.name)
def test_relative_link_exists(md, target):
    path_part, _, anchor = target.partition("#")
    dest = (md.parent / path_part).resolve() if path_part else md
    assert dest.exists(), f"{md.relative_to(ROOT)}: link to {target!r}: {dest} does not exist"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest.read_text()), (
            f"{md.relative_to(ROOT)}: link to {target!r}: no heading with anchor #{anchor} in {dest.name}")


def test_docs_link_each_other():
    readme = (ROOT / "README.md").read_text()
    for name in ("getting-started.md", "concepts.md", "writing-an-algorithm.md", "config-reference.md",
                 "datasets.md"):
        assert (DOCS / name).exists(), f"docs/{name} is missing"
        assert f"(docs/{name})" in readme, f"README.md does not link docs/{name}"


# ------------------------------------------------------------------ documented commands
def _command_lines():
    for md in (ROOT / "README.md", DOCS / "getting-started.md"):
        for block in _code_blocks(md.read_text(), "bash"):
            block = block.replace("\\\n", " ")
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith(".venv/bin/fedsolve "):
                    yield md.name, line


def _is_template(tokens: list[str]) -> bool:
    return any("[" in t and "=[" not in t for t in tokens) or any(t.isupper() and len(t) > 1 for t in tokens)


@pytest.mark.parametrize("where,line", list(_command_lines()))
def test_documented_command_parses(where, line):
    from fedsolve.cli import build_parser

    tokens = shlex.split(line)[1:]
    if _is_template(tokens):
        pytest.skip("a usage template, not a command")
    try:
        args = build_parser().parse_args(tokens)
    except SystemExit as e:  # argparse error (exit 0: --version / --help did their job)
        if e.code == 0:
            return
        pytest.fail(f"{where}: `{line}` does not parse (exit {e.code})")
    config = getattr(args, "config", None)
    if config and (ROOT / config).is_file():
        import yaml

        from fedsolve.experiments.config import load_config
        from fedsolve.experiments.suite import is_suite, load_suite

        if is_suite(yaml.safe_load((ROOT / config).read_text())):   # `fedsolve suite SUITE`: the suite loads
            load_suite(ROOT / config, args.set)
            return
        cfg = load_config(ROOT / config, args.set)
        if getattr(args, "algorithm", None):
            assert any(args.algorithm in (a.display, a.name) for a in cfg.all_algorithms()), (
                f"{where}: `{line}`: --algorithm {args.algorithm} is not in {config}")
