"""Bad inputs as a new user makes them (issue 45): tests/bad_inputs.py breaks one thing at a time in a valid
config of every family (a field's type, its range, an unknown key, a missing section, a name that does not
exist, a solver on another family's problem) and tests/bad_inputs_cli.py breaks data files, the command line and
the evidence tools. Each must end in exit 2 with one line naming what was broken (never a traceback, never a
silent acceptance); a control case per family must run. CI runs a sample spread over every (family, kind) group;
the whole sweep (about 4,000 cases, 20 minutes on 2 cores) is `python -m tests.bad_inputs`, which prints the
counts per group and every case that is not good."""

from __future__ import annotations

import pytest

from tests.bad_inputs import Case, Outcome, all_cases, judge, run_case, sample

CASES = all_cases()


def test_the_generator_covers_every_family_and_kind_of_mistake():
    fams = {c.family for c in CASES}
    cats = {c.category for c in CASES}
    assert {"classic", "personalized", "clustered", "constrained", "bilevel", "minimax", "cli", "api"} <= fams
    assert {"type", "range", "unknown_key", "unknown_name", "missing", "mismatch", "data", "control"} <= cats
    assert len(CASES) > 3000 and len({c.id for c in CASES}) == len(CASES)


def test_the_judge_catches_each_way_of_failing():
    """The judge this file rests on can fail a case: a traceback, a silent exit 0, two lines, the wrong field."""
    case = Case("x", "classic", "range", run=lambda tmp: Outcome(0), words=("lr",))
    assert judge(case, Outcome(2, err="error: lr: must be > 0\n")) == "good"
    assert judge(case, Outcome(None, tb="Traceback (most recent call last):\n ValueError")) == "traceback"
    assert judge(case, Outcome(0)) == "silent"
    assert judge(case, Outcome(2, err="error: lr\nmore\n")) == "lines"
    assert judge(case, Outcome(2, err="error: rounds: must be > 0\n")) == "wrong_field"
    assert judge(case, Outcome(1, err="error: lr\n")) == "exit1"


@pytest.mark.parametrize("case", sample(CASES, per_group=6), ids=lambda c: c.id)
def test_a_sample_of_bad_inputs_gets_one_line_naming_the_field(case, tmp_path):
    verdict, o = run_case(case, tmp_path)
    assert verdict == "good", (verdict, o.err[-2000:], (o.tb or "")[-3000:])
