"""The documentation stays true to the code.

* docs/config-reference.md equals what scripts/gen_config_reference.py generates now;
* examples/my_fedavgm.py runs, and the algorithm shown in docs/writing-an-algorithm.md is that file's;
* every relative link in README.md and docs/*.md points to an existing file (and heading);
* every `fedsolve` command line in README.md and docs/getting-started.md parses, and its config
  with its --set overrides validates;
* those lines run as written, in each page's order, straight after the demo (scripts/demo.sh): no line writes
  into a folder an earlier one filled, a --resume line continues a run (checked without running), and on a tiny
  demo every line exits 0 (slow);
* docs/deployment.md's simulate_with_participation snippet runs as written (slow).
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
def _doc_commands(md: Path) -> list[str]:
    """The `.venv/bin/fedsolve` lines of the bash blocks of ``md``, in order (continuations joined, comments cut)."""
    out = []
    for block in _code_blocks(md.read_text(), "bash"):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(".venv/bin/fedsolve "):
                out.append(" ".join(line.split()))
    return out


def _command_lines():
    for md in (ROOT / "README.md", DOCS / "getting-started.md"):
        for line in _doc_commands(md):
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


# ------------------------------------------------------------------ the documented sequence, after the demo
#: what scripts/demo.sh runs (test_demo_script_runs_the_demo_command holds it to that)
DEMO_COMMAND = ".venv/bin/fedsolve compare experiments/demo.yaml --out runs/demo --overwrite"
SEQUENCE_DOCS = ("README.md", "docs/getting-started.md")


def _sequence(name: str) -> list[str]:
    """The runnable `fedsolve` lines of a doc in its order (usage templates left out)."""
    return [ln for ln in _doc_commands(ROOT / name) if not _is_template(shlex.split(ln)[1:])]


def _parse(line: str):
    from fedsolve.cli import build_parser

    try:
        return build_parser().parse_args(shlex.split(line)[1:])
    except SystemExit:   # --version
        return None


def _writes(args, root: Path) -> tuple[Path, int | None, list[Path]] | None:
    """(the folder a run / compare / suite command writes, the rounds it runs to, its run folders), relative to the
    working directory; None for a command that writes no runs."""
    import yaml

    from fedsolve.experiments.config import load_config
    from fedsolve.experiments.folders import default_run_dir
    from fedsolve.experiments.suite import is_suite

    if args is None or args.cmd not in ("run", "compare", "suite"):
        return None
    data = yaml.safe_load((root / args.config).read_text())
    if is_suite(data):
        return Path(args.out or Path("runs") / data["name"]), None, []
    cfg = load_config(root / args.config, args.set)
    if args.cmd == "run":
        spec = next(a for a in cfg.all_algorithms() if args.algorithm in (None, a.display, a.name))
        folder = Path(args.out) if args.out else default_run_dir(cfg, spec, args.seed if args.seed is not None
                                                                  else cfg.seeds[0])
        return folder, cfg.simulation.rounds, [folder]
    base = Path(args.out) if args.out else Path(cfg.out_dir) / cfg.name
    return base, cfg.simulation.rounds, [default_run_dir(cfg, a, s, base) for a in cfg.all_algorithms()
                                         for s in cfg.seeds]


def test_demo_script_runs_the_demo_command():
    script = (ROOT / "scripts" / "demo.sh").read_text()
    line = r"^\.venv/bin/fedsolve compare experiments/demo\.yaml --out runs/demo \"\$\{fresh\[@\]\}\" \"\$@\"$"
    assert re.search(line, script, flags=re.M), "scripts/demo.sh no longer runs DEMO_COMMAND: update the docs' sequence"
    assert "fresh=(--overwrite)" in script


@pytest.mark.parametrize("name", SEQUENCE_DOCS)
def test_documented_commands_write_their_own_folders(name):
    """Run straight after the demo, in the doc's order, no command is refused: each writes a folder no earlier
    command filled (or says --resume / --overwrite), a --resume line continues a run an earlier line left with
    fewer rounds, and report / verify read a folder that exists by then."""
    written: dict[Path, int | None] = {}
    for line in [DEMO_COMMAND, *_sequence(name)]:
        args = _parse(line)
        target = _writes(args, ROOT)
        if target is None:
            if args is not None and args.cmd in ("report", "verify"):
                assert Path(args.dir) in written, f"{name}: `{line}` reads {args.dir}, which no earlier command wrote"
            continue
        base, rounds, runs = target
        if args.resume:
            assert runs and all(r in written for r in runs), f"{name}: `{line}` resumes a folder nothing wrote"
            assert any(written[r] < rounds for r in runs), f"{name}: `{line}` resumes finished runs: it does nothing"
        elif not args.overwrite:
            taken = [p for p in written if p == base or p.is_relative_to(base) or base.is_relative_to(p)]
            assert not taken, (f"{name}: `{line}` writes into {max(taken, key=lambda p: len(p.parts))}, which an "
                               "earlier command filled: refused")
        written.update({base: rounds, **{r: rounds for r in runs}})


def _tiny_checkout(where: Path) -> Path:
    """``where`` laid out like the checkout for the documented commands, with a tiny demo: 4 clients, a small MLP,
    2 seeds, the demo's 40 rounds and algorithms; the suite and results/ as they are."""
    import shutil

    import yaml

    demo = yaml.safe_load((ROOT / "experiments" / "demo.yaml").read_text())
    demo["seeds"] = [0, 1]
    demo["data"].update(num_clients=4)
    demo["model"] = {"name": "mlp", "params": {"hidden": [8]}}
    (where / "experiments").mkdir(parents=True)
    (where / "experiments" / "demo.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
    shutil.copy(ROOT / "experiments" / "demo_suite.yaml", where / "experiments")
    (where / "results").symlink_to(ROOT / "results")
    return where


def _run_line(line: str) -> int:
    from fedsolve.cli import main

    try:
        return main(shlex.split(line)[1:])
    except SystemExit as e:   # --version
        return int(e.code or 0)


@pytest.fixture(scope="module")
def after_demo(tmp_path_factory):
    """A tiny checkout in which the demo's command has run."""
    base = _tiny_checkout(tmp_path_factory.mktemp("checkout") / "repo")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        assert _run_line(DEMO_COMMAND + " --quiet") == 0
    return base


@pytest.mark.slow
@pytest.mark.parametrize("name", SEQUENCE_DOCS)
def test_documented_sequence_runs_after_the_demo(name, after_demo, tmp_path, monkeypatch):
    """Every `fedsolve` line of the README and of getting-started, as written and in order, on the tiny demo right
    after the demo's command: each exits 0; the resume line extends the 20-round run to the config's 40 rounds."""
    import shutil

    from fedsolve.experiments.folders import read_jsonl

    work = tmp_path / "repo"
    shutil.copytree(after_demo, work, symlinks=True)
    monkeypatch.chdir(work)
    for line in _sequence(name):
        before = [r["round"] for r in read_jsonl(Path("runs/fedadmm/metrics.jsonl"))]
        assert _run_line(line) == 0, f"{name}: `{line}` failed"
        if "--resume" in line.split() and "runs/fedadmm" in line:
            after = [r["round"] for r in read_jsonl(Path("runs/fedadmm/metrics.jsonl"))]
            assert before[-1] == 20 and after[-1] == 40, (before, after)


@pytest.mark.slow
def test_deployment_replay_snippet_runs(tmp_path, monkeypatch):
    """docs/deployment.md's simulate_with_participation snippet runs as written after the local run (here with a
    participation.json in which every sampled client answered): it prints the plain simulation's last record."""
    import ast
    import contextlib
    import io
    import json

    import fedsolve

    code = next(b for b in _code_blocks((DOCS / "deployment.md").read_text(), "python")
                if "simulate_with_participation" in b)
    (tmp_path / "experiments").symlink_to(ROOT / "experiments")
    results = tmp_path / "runs" / "flower-demo" / "results"
    results.mkdir(parents=True)
    (results / "participation.json").write_text(json.dumps([]))   # nobody dropped: no round restricted
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/deployment.md", "exec"), {})
    plain = fedsolve.run("experiments/demo.yaml", algorithm="FedAvg", overrides=[
        "data.num_clients=4", "simulation.rounds=5", "simulation.sampling.fraction=0.5",
        "simulation.executor=sequential"])
    printed = ast.literal_eval(out.getvalue().strip())
    want = plain.history[-1]
    assert printed.keys() == want.keys() and printed["round"] == 5
    assert all(printed[k] == pytest.approx(want[k], rel=1e-5) for k in want), (printed, want)   # float round-off
