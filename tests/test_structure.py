"""Experiments are data: experiments/ holds YAML (and markdown) only, every YAML there loads as a suite or an
experiment config, and every claim of results/ that runs experiments names one `fedsolve suite` command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from fedsolve.experiments.config import load_config
from fedsolve.experiments.suite import is_suite, load_suite

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"


def test_experiments_hold_yaml_and_markdown_only():
    """A driver script (Python, shell) under experiments/ is a feature the suite format lacks: add the feature."""
    stray = sorted(str(p.relative_to(ROOT)) for p in EXPERIMENTS.rglob("*")
                   if p.is_file() and p.suffix not in (".yaml", ".yml", ".md"))
    assert not stray, f"experiments/ holds YAML and markdown only; found {stray}"


def test_every_yaml_under_experiments_loads_as_a_suite_or_an_experiment():
    paths = sorted(EXPERIMENTS.rglob("*.yaml"))
    assert len(paths) > 50
    suites = 0
    for p in paths:
        if is_suite(yaml.safe_load(p.read_text())):
            load_suite(p)            # every cell's experiment is built and checked too
            suites += 1
        else:
            load_config(p)
    assert suites >= 10


RUNS = re.compile(r"\bfedsolve (suite|compare|run)\b")
FORBIDDEN = [(re.compile(r"\bbash\b|\.sh\b"), "a shell script"),
             (re.compile(r"experiments/\S+\.py\b"), "a Python driver under experiments/"),
             (re.compile(r"\bfedsolve (compare|run)\b"), "fedsolve compare/run (one cell; use fedsolve suite)")]


def test_every_claim_that_runs_experiments_names_one_suite_command():
    """results/<family>/claims.json: a claim whose evidence is made by runs gives the single `fedsolve suite`
    command that rebuilds it (and the full-size one where the reduced size is what ran); a theorem check is a
    pytest command, a benchmark a benchmarks/ script."""
    checked = 0
    for f in sorted((ROOT / "results").glob("*/claims.json")):
        for claim in json.loads(f.read_text()):
            cmd = claim.get("command") or ""
            where = f"{f.relative_to(ROOT)} {claim['id']}: {cmd!r}"
            for pattern, what in FORBIDDEN:
                assert not pattern.search(cmd), f"{where} uses {what}"
            if RUNS.search(cmd):   # one command, or the reduced one and the full size where that takes hours
                n = len(RUNS.findall(cmd))
                assert n == 1 or (n == 2 and "full size" in cmd), f"{where}: give one fedsolve suite command"
                checked += 1
    assert checked >= 30


#: absolute paths of a developer's or CI's machine (a run's --out, a cache, a checkout): never in a commit
MACHINE_PATH = re.compile(r"(?<![\w.])/(tmp|root|home|work|Users|private/var)/[\w.-]")


def test_no_machine_path_in_committed_text():
    """Committed results, docs, experiments and sources name paths relative to the repository (a run's provenance
    records the command it was given: run experiments with --out runs/...)."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "results", "docs", "experiments", "src", "README.md", "examples"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for rel in files:
        p = ROOT / rel
        if p.suffix not in (".json", ".md", ".yaml", ".yml", ".txt", ".log", ".py", ".csv", ".jsonl") or not p.is_file():
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not found, "machine paths in committed files:\n" + "\n".join(found[:20])
