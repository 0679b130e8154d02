"""A generator of bad inputs, run through the CLI and the Python API as a new user would, and a judge of what came
back (issue 45).

Every case starts from a small valid config of one family (the fast lane's smoke configs,
tests/test_smoke_families.py) or from a valid command line, and breaks one thing: a field of the config
reference given the wrong type, a value out of range, an unknown key, a missing section, a name that does not
exist, a solver on another family's problem; a data file with a fault; a command line misused; an evidence tool
pointed at a folder that is not ours. :func:`judge` classifies what came back:

* ``good``: exit 2 and exactly one line on stderr naming the field or file (``Case.words``); an API call raised
  ``ConfigError`` (a ValueError) with one such line; a case marked ``runs`` ran (exit 0);
* ``traceback``: a Python exception escaped (or stderr holds a traceback);
* ``silent``: exit 0 for nonsense (a silent acceptance);
* ``exit1``/``exit<N>``: another exit code than 2 (3 is good where ``Case.diverges`` allows a diverged run);
* ``lines``: not exactly one line on stderr;
* ``wrong_field``: the line does not name what was broken.

``python -m tests.bad_inputs [--family F] [--category C]`` runs the whole sweep and prints the counts per
family and category and every bad case; tests/test_bad_inputs.py runs a sample (and the sweep when slow).
The cases of files, the command line and the evidence tools are in tests/bad_inputs_cli.py.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import traceback
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

FAMILIES = ("classic", "personalized", "clustered", "constrained", "bilevel", "minimax")
BOGUS = "no_such_thing"


@dataclass
class Outcome:
    """What came back: the exit code (None when an exception escaped), stdout, stderr, the traceback."""

    rc: int | None
    out: str = ""
    err: str = ""
    tb: str | None = None


@dataclass
class Case:
    """One bad input: ``run(tmp)`` does it in an empty folder; ``words``: what the one line must name (each
    entry is ``a|b``: any of them, case-insensitive); ``runs``: a control case that must run (exit 0);
    ``diverges``: exit 3 with one line is good too (a run that cannot go on and says so); ``rc``: the exit code
    expected (1 for a check that finds a problem: its one line may be on stdout)."""

    id: str
    family: str
    category: str
    run: Callable[[Path], Outcome]
    words: tuple[str, ...] = ()
    runs: bool = False
    diverges: bool = False
    rc: int = 2


# ------------------------------------------------------------------ running and judging
def call_cli(argv: list[str]) -> Outcome:
    """``fedsolve.cli.main(argv)`` in this process, stdout and stderr captured."""
    from fedsolve.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:   # argparse
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except BaseException:   # noqa: BLE001 - the point is to see it
            return Outcome(None, out.getvalue(), err.getvalue(), traceback.format_exc())
    return Outcome(rc, out.getvalue(), err.getvalue())


def call_api(fn: Callable[[], Any]) -> Outcome:
    """A Python API call: a ``ConfigError`` is judged as exit 2 with its message as the one line."""
    from fedsolve.experiments.config import ConfigError

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            fn()
        except ConfigError as e:
            return Outcome(2, out.getvalue(), str(e))
        except BaseException:   # noqa: BLE001
            return Outcome(None, out.getvalue(), err.getvalue(), traceback.format_exc())
    return Outcome(0, out.getvalue(), err.getvalue())


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def judge(case: Case, o: Outcome) -> str:
    """``good`` or what is wrong (see the module docstring)."""
    if o.tb is not None or "Traceback (most recent call last)" in o.err:
        return "traceback"
    if case.runs:
        return "good" if o.rc == 0 else f"exit{o.rc}"
    if o.rc == 0:
        return "silent"
    if o.rc != case.rc and not (o.rc == 3 and case.diverges):
        return f"exit{o.rc}"
    lines = _lines(o.err) if case.rc == 2 else _lines(o.err + o.out)
    if len(lines) != 1:
        return "lines"
    low = lines[0].lower()
    if not all(any(w.lower() in low for w in alts.split("|")) for alts in case.words):
        return "wrong_field"
    return "good"


def run_case(case: Case, tmp: Path) -> tuple[str, Outcome]:
    tmp.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(tmp)   # data.target / --import modules written by a case live in its folder
    try:
        o = case.run(tmp)
    finally:
        os.chdir(here)
    return judge(case, o), o


# ------------------------------------------------------------------ the families' small valid configs
def bases() -> dict[str, dict[str, Any]]:
    """The smoke config of each family, cut to one or two rounds."""
    from tests.test_smoke_families import SMOKE

    out = {}
    for fam, text in SMOKE.items():
        raw = yaml.safe_load(text)
        raw["simulation"]["rounds"] = 2 if fam == "constrained" else 1
        raw["simulation"]["eval_every"] = 1
        out[fam] = raw
    return out


def set_path(raw: dict, path: tuple, value: Any) -> dict:
    """A copy of ``raw`` with ``path`` set to ``value`` (``DELETE`` removes it); missing sections are made."""
    raw = copy.deepcopy(raw)
    node = raw
    for p in path[:-1]:
        if isinstance(node, list):
            node = node[p]
        else:
            if not isinstance(node.get(p), (dict, list)):
                node[p] = {}
            node = node[p]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return raw


DELETE = object()


def run_config(raw: dict, *more: str, cmd: str = "run") -> Callable[[Path], Outcome]:
    def go(tmp: Path) -> Outcome:
        p = tmp / "c.yaml"
        p.write_text(yaml.safe_dump(raw, sort_keys=False))
        return call_cli([cmd, p, "--out", tmp / "out", "--quiet", *more])
    return go


# ------------------------------------------------------------------ field introspection
def _args(ann: Any) -> tuple:
    return typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, getattr(__import__("types"),
                                                                                   "UnionType", None)) else (ann,)


def _bounds(info) -> dict[str, float]:
    b = {}
    for m in info.metadata:
        for k in ("gt", "ge", "lt", "le"):
            if getattr(m, k, None) is not None:
                b[k] = getattr(m, k)
    return b


def field_mutations(info, current: Any) -> list[tuple[str, str, Any]]:
    """(category, label, value) for one pydantic field: the wrong type, null where it is not allowed, values
    just outside its bounds, NaN and infinities where a float is read."""
    args = _args(info.annotation)
    nullable = type(None) in args
    kinds = {a for a in args if a is not type(None)}
    lit = [a for a in kinds if typing.get_origin(a) is typing.Literal]
    sub = [a for a in kinds if hasattr(a, "model_fields")]
    muts: list[tuple[str, str, Any]] = []
    number = int in kinds or float in kinds
    if number:
        muts.append(("type", "string", "abc"))
        muts.append(("type", "list", [1, 2]))
    elif str in kinds and not lit:
        muts.append(("type", "list", [1, 2]))
        muts.append(("type", "dict", {"a": 1}))
    elif bool in kinds:
        muts.append(("type", "string", "maybe"))
    elif lit:
        muts.append(("type", "number", 12345))
        muts.append(("unknown_name", "choice", BOGUS))
    elif sub:
        muts.append(("type", "list", [1, 2]))
    elif any(typing.get_origin(a) is dict or a is dict for a in kinds):
        muts.append(("type", "list", [1, 2]))
    elif any(typing.get_origin(a) is list for a in kinds):
        muts.append(("type", "dict", {"a": 1}))
        muts.append(("type", "string", "abc"))
    if not nullable and info.is_required() is False and info.default is not None:
        muts.append(("type", "null", None))
    b = _bounds(info)
    is_int = int in kinds and float not in kinds
    eps = 1 if is_int else 1e-9
    if "gt" in b:
        muts.append(("range", "at_gt", b["gt"]))
        muts.append(("range", "below", b["gt"] - (1 if is_int else 0.5)))
    if "ge" in b:
        muts.append(("range", "below_ge", b["ge"] - eps if is_int else b["ge"] - 0.5))
    if "lt" in b:
        muts.append(("range", "at_lt", b["lt"]))
    if "le" in b:
        muts.append(("range", "above_le", b["le"] + (1 if is_int else 0.5)))
    if float in kinds:
        muts.append(("range", "nan", math.nan))
        muts.append(("range", "inf", math.inf))
        muts.append(("range", "-inf", -math.inf))
    if is_int:
        muts.append(("type", "float", 1.5))
    return muts


def model_cases(fam: str, raw: dict, model, path: tuple, *, cmd: str = "run") -> list[Case]:
    """Every field of the pydantic ``model`` at ``path`` of ``raw``, mutated; plus an unknown key there."""
    cases = []
    node = raw
    for p in path:
        node = node.get(p, {}) if isinstance(node, dict) else node[p]
    for name, info in model.model_fields.items():
        cur = node.get(name) if isinstance(node, dict) else None
        for cat, label, value in field_mutations(info, cur):
            if label == "null" and name in ("name",) and path and path[-1] == "algorithm":
                cat = "missing"
            dotted = ".".join(str(p) for p in path + (name,))
            cases.append(Case(f"{fam}/{cat}/{dotted}={label}", fam, cat, run_config(set_path(raw, path + (name,),
                                                                                                value), cmd=cmd),
                              words=(name,)))
    dotted = ".".join(str(p) for p in path) or "top"
    cases.append(Case(f"{fam}/unknown_key/{dotted}.{BOGUS}", fam, "unknown_key",
                      run_config(set_path(raw, path + (BOGUS,), 1), cmd=cmd), words=(BOGUS,)))
    return cases


# ------------------------------------------------------------------ the config cases of one family
def family_algorithms(fam: str) -> list[str]:
    from fedsolve.families import ALGORITHMS

    return sorted(k for k, v in ALGORITHMS.items() if v.__module__.startswith(f"fedsolve.families.{fam}."))


def _with_algorithm(raw: dict, name: str) -> dict:
    """``raw`` running algorithm ``name`` with its defaults (the base's params dropped; the base's defaults kept
    only where ``name`` has them)."""
    from fedsolve.families import get_algorithm

    raw = set_path(raw, ("algorithm",), {"name": name})
    fields = get_algorithm(name).Config.model_fields
    raw["defaults"] = {k: v for k, v in raw.get("defaults", {}).items() if k in fields}
    return raw


def config_cases(fam: str, raw: dict) -> list[Case]:
    from fedsolve.engine.loop import SimulationConfig, WorkConfig
    from fedsolve.engine.sampling import SamplingConfig
    from fedsolve.experiments.config import AlgorithmSpec, DataConfig, ExperimentConfig, ModelConfig, TuneSpec
    from fedsolve.families import get_algorithm

    cases = [Case(f"{fam}/control/base", fam, "control", run_config(raw), runs=True)]
    top = {k: v for k, v in ExperimentConfig.model_fields.items()
           if k in ("name", "description", "seeds", "threads", "out_dir", "defaults", "paper")}
    for name, info in top.items():
        for cat, label, value in field_mutations(info, raw.get(name)):
            cases.append(Case(f"{fam}/{cat}/{name}={label}", fam, cat, run_config(set_path(raw, (name,), value)),
                              words=(name,)))
    cases.append(Case(f"{fam}/unknown_key/top.{BOGUS}", fam, "unknown_key", run_config(set_path(raw, (BOGUS,), 1)),
                      words=(BOGUS,)))
    for model, path in ((DataConfig, ("data",)), (ModelConfig, ("model",)), (SimulationConfig, ("simulation",)),
                        (SamplingConfig, ("simulation", "sampling")), (WorkConfig, ("simulation", "work")),
                        (AlgorithmSpec, ("algorithm",))):
        cases += [c for c in model_cases(fam, raw, model, path)
                  if not c.id.endswith(("data.dataset=null", "data.target=list", "data.target=dict"))
                  or c.category != "type"]
    # every solver of the family: each field of its config (defaults kept elsewhere)
    for algo in family_algorithms(fam):
        base = raw if raw["algorithm"]["name"] == algo else _with_algorithm(raw, algo)
        cls = get_algorithm(algo)
        for name, info in cls.Config.model_fields.items():
            for cat, label, value in field_mutations(info, None):
                cases.append(Case(f"{fam}/{cat}/{algo}.params.{name}={label}", fam, cat,
                                  run_config(set_path(base, ("algorithm", "params", name), value)), words=(name,)))
        cases.append(Case(f"{fam}/unknown_key/{algo}.params.{BOGUS}", fam, "unknown_key",
                          run_config(set_path(base, ("algorithm", "params", BOGUS), 1)), words=(BOGUS,)))
    tune = {"param": tunable(raw), "grid": [0.01, 0.1]}
    for name, info in TuneSpec.model_fields.items():
        tuned = set_path(raw, ("algorithm", "tune"), tune)
        for cat, label, value in field_mutations(info, None):
            cases.append(Case(f"{fam}/{cat}/algorithm.tune.{name}={label}", fam, cat,
                              run_config(set_path(tuned, ("algorithm", "tune", name), value), cmd="compare"),
                              words=(name,)))
    cases += problem_cases(fam, raw) + name_cases(fam, raw) + missing_cases(fam, raw) + mismatch_cases(fam, raw)
    cases += params_cases(fam, raw)
    return cases


def problem_cases(fam: str, raw: dict) -> list[Case]:
    """Every field of the family's problem kind's parameters."""
    if "problem" not in raw:
        return []
    from fedsolve.families.bilevel.kind import HyperRepresentationParams
    from fedsolve.families.constrained.kind import QPParams
    from fedsolve.families.minimax.kind import DomainAdaptationParams, PretrainParams

    model = {"constrained_qp": QPParams, "hyper_representation": HyperRepresentationParams,
             "domain_adaptation": DomainAdaptationParams}[raw["problem"]["kind"]]
    cases = model_cases(fam, raw, model, ("problem", "params"))
    if model is DomainAdaptationParams:
        pre = set_path(raw, ("problem", "params", "regime"), "pretrained")
        pre = set_path(pre, ("problem", "params", "pretrain"), {"steps": 2})
        cases += model_cases(fam, pre, PretrainParams, ("problem", "params", "pretrain"))
    return cases


def tunable(raw: dict) -> str:
    """A float hyper-parameter of the base's algorithm that a tuning grid can choose."""
    from fedsolve.families import get_algorithm

    fields = get_algorithm(raw["algorithm"]["name"]).Config.model_fields
    return next(k for k in ("lr", "beta", "eta_x") if k in fields)


def name_cases(fam: str, raw: dict) -> list[Case]:
    """Names that do not exist, in every place a name is read."""
    places = {
        "data.dataset": (("data", "dataset"), BOGUS), "model.name": (("model", "name"), BOGUS),
        "algorithm.name": (("algorithm", "name"), BOGUS), "data.partition": (("data", "partition"), BOGUS),
        "problem.kind": (("problem", "kind"), BOGUS), "data.target": (("data", "target"), f"{BOGUS}.mod:fn"),
        "model.target": (("model", "target"), f"{BOGUS}.mod:fn"),
        "data.sample_transform": (("data", "sample_transform"), f"{BOGUS}.mod:fn"),
        "algorithm.wrap.kind": (("algorithm", "wrap"), [{"kind": BOGUS}]),
        "algorithm.schedule.kind": (("algorithm", "schedule"), {"kind": BOGUS}),
        "model.personalization": (("model", "personalization"), BOGUS),
        "model.blocks": (("model", "blocks"), {"mine": [f"{BOGUS}.*"]}),
        "simulation.device": (("simulation", "device"), "tpu:0"),
        "simulation.metrics": (("simulation", "metrics"), [BOGUS]),
        "algorithm.tune.param": (("algorithm", "tune"), {"param": BOGUS, "grid": [1, 2]}),
        "algorithm.tune.metric": (("algorithm", "tune"), {"param": tunable(raw), "grid": [0.01, 0.1],
                                                          "metric": BOGUS}),
        "data.cluster_transform": (("data", "cluster_transform"), BOGUS),
    }
    cases = []
    for label, (path, value) in places.items():
        r = set_path(raw, path, value)
        if label == "data.target":
            r["data"].pop("dataset", None)
        if label == "model.target":
            r["model"].pop("name", None)
        if path[0] == "problem" and "problem" not in raw:
            continue
        leaf = label.split(".")[-1]
        words = (f"{leaf}|{label}", ) if leaf not in ("kind", "target") else (label.rsplit(".", 1)[0],)
        if label == "algorithm.tune.metric" and fam == "minimax":   # toy domains: no labelled validation images
            words = ("tune",)
        if label == "model.blocks":
            words = ("mine",)
        cmd = "compare" if "tune" in label else "run"
        cases.append(Case(f"{fam}/unknown_name/{label}", fam, "unknown_name", run_config(r, cmd=cmd), words=words))
    return cases


def missing_cases(fam: str, raw: dict) -> list[Case]:
    """Required sections and keys removed."""
    cases = []
    for path, words in ((("data",), "data"), (("algorithm",), "algorithm"), (("algorithm", "name"), "name"),
                        (("data", "dataset"), "data"), (("problem",), "problem"), (("problem", "kind"), "kind"),
                        (("model",), "model")):
        if path[0] not in raw:
            continue
        r = set_path(raw, path, DELETE)
        # logreg by default: a valid config (FedAPM with no personal block is plain ADMM, a tested reduction)
        runs = path == ("model",) and fam != "bilevel"
        if path == ("model",) and fam == "bilevel":   # logreg's one layer is the head: x would be empty
            words = "head"
        c = Case(f"{fam}/missing/{'.'.join(path)}", fam, "missing", run_config(r), words=(words,), runs=runs)
        cases.append(c)
    empty = {"data": {}}
    cases.append(Case(f"{fam}/missing/everything_but_data", fam, "missing", run_config(empty),
                      words=("data.dataset|algorithm",)))
    return cases


#: each family's own kind of problem and a solver of it
HOME = {"classic": (None, "fedavg"), "personalized": (None, "fedapm"), "clustered": (None, "fpfc"),
        "constrained": ("constrained_qp", "proxal"), "bilevel": ("hyper_representation", "shrofbo"),
        "minimax": ("domain_adaptation", "fedmm")}


def mismatch_cases(fam: str, raw: dict) -> list[Case]:
    """A solver of another family on this family's problem; settings a solver cannot honour."""
    cases = []
    own_kind = HOME[fam][0]
    for other, (kind, algo) in HOME.items():
        if kind == own_kind:   # the plain families run one another's solvers on purpose
            continue
        r = _with_algorithm(raw, algo)
        cases.append(Case(f"{fam}/mismatch/{algo}_on_{fam}", fam, "mismatch", run_config(r),
                          words=(f"{algo}|problem|{kind or 'problem'}",)))
    for algo in family_algorithms(fam):
        base = raw if raw["algorithm"]["name"] == algo else _with_algorithm(raw, algo)
        cls_needs_all = fam == "constrained" and algo in ("proxal",)
        if fam == "bilevel" and algo in ("simfbo", "shrofbo"):
            r = set_path(base, ("simulation", "sampling"), {"clients_per_round": 2, "scheme": "weighted"})
            # their server weights are p_i / pi_i under weighted sampling: unbiased (tests/test_bilevel_clients.py)
            cases.append(Case(f"{fam}/mismatch/{algo}_weighted_sampling", fam, "mismatch", run_config(r),
                              runs=True))
        if cls_needs_all:
            r = set_path(base, ("simulation", "sampling"), {"fraction": 0.5})
            cases.append(Case(f"{fam}/mismatch/{algo}_partial_participation", fam, "mismatch", run_config(r),
                              words=("sampling|fraction",)))
        r = set_path(base, ("simulation", "sampling"), {"clients_per_round": 50})
        cases.append(Case(f"{fam}/mismatch/{algo}_more_clients_per_round_than_clients", fam, "mismatch",
                          run_config(r), words=("clients_per_round",)))
    r = set_path(raw, ("data", "dtype"), "float64")
    if fam in ("classic", "clustered"):   # the batched executor follows the data's float type
        cases.append(Case(f"{fam}/mismatch/float64_with_batched_executor", fam, "mismatch",
                          run_config(set_path(r, ("simulation", "executor"), "batched")), runs=True))
    cases.append(Case(f"{fam}/mismatch/float64_with_linear_executor", fam, "mismatch",
                      run_config(set_path(r, ("simulation", "executor"), "linear")), words=("executor|dtype",)))
    if raw.get("model", {}).get("personalization"):
        r = set_path(raw, ("model", "blocks"), {"personal": ["out.*"]})
        cases.append(Case(f"{fam}/mismatch/personal_block_twice", fam, "mismatch", run_config(r),
                          words=("personal",)))
    cases.append(Case(f"{fam}/mismatch/device_cuda_without_gpu", fam, "mismatch",
                      run_config(set_path(raw, ("simulation", "device"), "cuda:7")), words=("device",)))
    cases.append(Case(f"{fam}/mismatch/data_num_clients_beyond_samples", fam, "mismatch",
                      run_config(set_path(raw, ("data", "num_clients"), 100000)), words=("num_clients",)))
    return cases


def params_cases(fam: str, raw: dict) -> list[Case]:
    """Free-form parameter sections (data.params, partition_params, model.params, wraps, schedules): unknown
    keys and bad values."""
    cases = []
    for path in (("data", "params"), ("data", "partition_params"), ("model", "params")):
        r = set_path(raw, path + (BOGUS,), 1)
        cases.append(Case(f"{fam}/unknown_key/{'.'.join(path)}.{BOGUS}", fam, "unknown_key", run_config(r),
                          words=(BOGUS,)))
    part = raw["data"].get("partition")
    if part == "dirichlet":
        for label, value in (("alpha=-1", -1.0), ("alpha=0", 0.0), ("alpha=nan", math.nan), ("alpha=abc", "abc"),
                             ("min_size=-5", -5), ("min_size=abc", "abc")):
            key, _ = label.split("=")
            r = set_path(raw, ("data", "partition_params", key), value)
            cases.append(Case(f"{fam}/range/partition_params.{label}", fam, "range", run_config(r), words=(key,)))
    if raw.get("model", {}).get("name") == "mlp":
        for label, value in (("hidden=-1", [-1]), ("hidden=0", [0]), ("hidden=abc", "abc"), ("hidden=dict", {"a": 1})):
            r = set_path(raw, ("model", "params", "hidden"), value)
            cases.append(Case(f"{fam}/range/model.params.{label}", fam, "range", run_config(r), words=("hidden",)))
    if fam == "minimax":
        for key, value in (("n", -3), ("n", "abc"), ("rotation", math.nan), ("noise", -1.0), ("source_clients", 0),
                           ("source_clients", 9), ("n_test", 0), ("p", 1.5)):
            r = set_path(raw, ("data", "params", key), value)
            cases.append(Case(f"{fam}/range/data.params.{key}={value}", fam, "range", run_config(r), words=(key,)))
    if fam == "constrained":
        r = set_path(raw, ("data", "params", "standardize"), "maybe")
        cases.append(Case(f"{fam}/type/data.params.standardize=maybe", fam, "type", run_config(r),
                          words=("standardize",)))
    for label, wrap, word in (("server_opt.bogus_optimizer", {"kind": "server_opt", "optimizer": BOGUS}, "optimizer"),
                              ("dp.clip=-1", {"kind": "dp", "clip": -1.0, "noise_multiplier": 0.5}, "clip"),
                              ("dp.unknown_key", {"kind": "dp", BOGUS: 1}, BOGUS),
                              ("wrap_not_a_mapping", "dp", "wrap")):
        r = set_path(raw, ("algorithm", "wrap"), [wrap])
        cases.append(Case(f"{fam}/range/algorithm.wrap.{label}", fam, "range", run_config(r), words=(word,)))
    for label, sched, word in (("local_budget.no_params", {"kind": "local_budget"}, "schedule"),
                               ("virtual_clock.unknown_key", {"kind": "virtual_clock", BOGUS: 1}, BOGUS),
                               ("schedule_without_kind", {"rounds": 3}, "kind")):
        r = set_path(raw, ("algorithm", "schedule"), sched)
        cases.append(Case(f"{fam}/range/algorithm.schedule.{label}", fam, "range", run_config(r), words=(word,)))
    return cases


# ------------------------------------------------------------------ all cases, a sample, the report
def all_cases() -> list[Case]:
    from tests.bad_inputs_cli import other_cases

    cases = []
    for fam, raw in bases().items():
        cases += config_cases(fam, raw)
    return cases + other_cases(bases())


def sample(cases: list[Case], per_group: int = 2) -> list[Case]:
    """A representative sample: the control case of each family and, per (family, category), ``per_group``
    cases spread over the group (the first, the middle, ...)."""
    groups: dict[tuple[str, str], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.family, c.category), []).append(c)
    out = []
    for (fam, cat), cs in sorted(groups.items()):
        k = len(cs) if cat == "control" else min(per_group, len(cs))
        out += [cs[(i * len(cs)) // k] for i in range(k)]
    return out


def _main() -> None:   # pragma: no cover - the full sweep, by hand
    import argparse
    import collections
    import tempfile
    import time
    import warnings

    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--family")
    ap.add_argument("--category")
    ap.add_argument("--id")
    ap.add_argument("--sample", action="store_true")
    a = ap.parse_args()
    cases = all_cases()
    cases = sample(cases) if a.sample else cases
    cases = [c for c in cases if (a.family in (None, c.family)) and (a.category in (None, c.category))
             and (a.id is None or a.id in c.id)]
    counts: dict = collections.defaultdict(collections.Counter)
    bad = []
    with tempfile.TemporaryDirectory() as d:
        for i, c in enumerate(cases):
            t0 = time.time()
            verdict, o = run_case(c, Path(d) / f"c{i}")
            counts[(c.family, c.category)][verdict] += 1
            if verdict != "good":
                msg = (o.tb or "").strip().splitlines()[-1:] if o.tb else _lines(o.err)[:3]
                bad.append(f"{verdict:<12} {c.id}  [{time.time() - t0:.1f}s]  {' | '.join(msg)[:400]}")
            print(f"{i + 1}/{len(cases)} {verdict:<11} {c.id} {time.time() - t0:.1f}s "
                  + (" | ".join(_lines(o.err))[:300] if verdict == "good" else ""), flush=True)
    print("\n".join(bad))
    total = collections.Counter()
    for (fam, cat), ctr in sorted(counts.items()):
        total.update(ctr)
        print(f"{fam:<13} {cat:<13} {sum(ctr.values()):>4} cases, bad {sum(ctr.values()) - ctr['good']:>3}  "
              f"{dict(ctr)}")
    print(f"total {sum(total.values())} cases, bad {sum(total.values()) - total['good']}: {dict(total)}")


if __name__ == "__main__":   # pragma: no cover
    _main()
