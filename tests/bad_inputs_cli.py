"""The bad inputs that are not one config field (tests/bad_inputs.py judges them): data files with faults, a
misused command line, the evidence tools (verify, ledger, report, suite, compare) pointed at folders that are
not ours, and the Python API called wrongly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from tests.bad_inputs import BOGUS, Case, Outcome, call_api, call_cli, run_config, set_path


def _cfg_file(tmp: Path, raw: dict, name: str = "c.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


def cli(*argv: Any, prepare: Callable[[Path], Any] | None = None) -> Callable[[Path], Outcome]:
    """``fedsolve argv`` after ``prepare(tmp)``; ``{tmp}`` in an argument is the case's folder."""
    def go(tmp: Path) -> Outcome:
        if prepare is not None:
            prepare(tmp)
        return call_cli([str(a).replace("{tmp}", str(tmp)) for a in argv])
    return go


# ------------------------------------------------------------------ data files with faults
def _npz(tmp: Path, **arrays) -> None:
    np.savez(tmp / "d.npz", **arrays)


def _clean_xy(n: int = 80, d: int = 4, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, classes, n)


def _npz_case(fam: str, raw: dict, label: str, arrays: Callable[[], dict], words: str, runs: bool = False,
              **params) -> Case:
    """``runs``: float targets are read as regression targets (documented), a run."""
    r = set_path(raw, ("data",), {"dataset": "npz", "num_clients": 3, "params": {"path": "d.npz", **params}})

    def go(tmp: Path) -> Outcome:
        _npz(tmp, **arrays())
        return run_config(r)(tmp)
    return Case(f"{fam}/data/npz_{label}", fam, "data", go, words=(words,), runs=runs)


def _csv_case(fam: str, raw: dict, label: str, text: str, words: str, **params) -> Case:
    r = set_path(raw, ("data",), {"dataset": "csv", "num_clients": 3,
                                  "params": {"path": "d.csv", "label": "y", **params}})

    def go(tmp: Path) -> Outcome:
        (tmp / "d.csv").write_text(text)
        return run_config(r)(tmp)
    return Case(f"{fam}/data/csv_{label}", fam, "data", go, words=(words,))


def _csv_text(rows: int = 60, bad: Callable[[int, list[str]], list[str]] | None = None) -> str:
    rng = np.random.default_rng(1)
    lines = ["a,b,c,y"]
    for i in range(rows):
        cells = [f"{v:.3f}" for v in rng.normal(size=3)] + [str(int(rng.integers(0, 2)))]
        lines.append(",".join(bad(i, cells) if bad else cells))
    return "\n".join(lines) + "\n"


def _images(tmp: Path, sizes: list[tuple[int, int]], empty_class: bool = False) -> None:
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp / "img" / c).mkdir(parents=True, exist_ok=True)
        if empty_class and c == "dog":
            continue
        for i, (h, w) in enumerate(sizes * 6):
            Image.fromarray((np.random.default_rng(i).random((h, w, 3)) * 255).astype("uint8")).save(
                tmp / "img" / c / f"{i}.png")


def data_cases(fam: str, raw: dict) -> list[Case]:
    """Faults in the user's own data files, fed to the family's solver (the plain model the family runs)."""
    if fam in ("constrained", "minimax"):   # their problem kinds build their own data; see target_cases
        return []
    x, y = _clean_xy()

    def with_nan():
        xx = x.copy()
        xx[5, 1] = np.nan
        return {"x": xx, "y": y}

    def with_inf():
        xx = x.copy()
        xx[7, 0] = np.inf
        return {"x": xx, "y": y}

    cases = [
        _npz_case(fam, raw, "nan_in_features", with_nan, "nan|finite"),
        _npz_case(fam, raw, "inf_in_features", with_inf, "inf|finite"),
        _npz_case(fam, raw, "no_keys", lambda: {"a": x, "b": y}, "d.npz|keys"),
        _npz_case(fam, raw, "length_mismatch", lambda: {"x": x, "y": y[:50]}, "d.npz|length|rows|samples"),
        _npz_case(fam, raw, "negative_labels", lambda: {"x": x, "y": y - 1}, "label"),
        _npz_case(fam, raw, "float_labels", lambda: {"x": x, "y": y + 0.5}, "label|y", runs=True),
        _npz_case(fam, raw, "labels_beyond_classes", lambda: {"x": x, "y": y}, "label|class", num_classes=2),
        _npz_case(fam, raw, "missing_file", lambda: {"x": x, "y": y}, "nope.npz", path="nope.npz"),
        _npz_case(fam, raw, "object_array", lambda: {"x": np.array(["a"] * 80), "y": y}, "d.npz|x"),
        _npz_case(fam, raw, "one_sample", lambda: {"x": x[:1], "y": y[:1]}, "num_clients|sample"),
        _csv_case(fam, raw, "missing_label_column", _csv_text().replace("a,b,c,y", "a,b,c,z"), "y"),
        _csv_case(fam, raw, "missing_feature_column", _csv_text(), "zz", features=["a", "zz"]),
        _csv_case(fam, raw, "empty_cell", _csv_text(bad=lambda i, c: ["", *c[1:]] if i == 3 else c), "d.csv|a"),
        _csv_case(fam, raw, "text_in_feature", _csv_text(bad=lambda i, c: ["hello", *c[1:]] if i == 9 else c),
                  "d.csv|a"),
        _csv_case(fam, raw, "nan_in_feature", _csv_text(bad=lambda i, c: ["nan", *c[1:]] if i == 2 else c),
                  "nan|finite"),
        _csv_case(fam, raw, "inf_in_label_regression",
                  _csv_text(bad=lambda i, c: [*c[:3], "inf"] if i == 2 else [*c[:3], c[3] + ".5"]),
                  "inf|finite|y", task="regression"),
        _csv_case(fam, raw, "header_only", "a,b,c,y\n", "d.csv"),
        _csv_case(fam, raw, "empty_file", "", "d.csv"),
        _csv_case(fam, raw, "ragged_rows", _csv_text(bad=lambda i, c: c[:2] if i == 4 else c), "d.csv"),
        _csv_case(fam, raw, "client_column_missing", _csv_text(), "client", client="client"),
    ]
    img = set_path(raw, ("data",), {"dataset": "image_folder", "num_clients": 3, "params": {"root": "img"}})
    cases.append(Case(f"{fam}/data/images_of_different_sizes", fam, "data",
                      lambda tmp: (_images(tmp, [(8, 8), (10, 6)]), run_config(img)(tmp))[1], words=("size",)))
    cases.append(Case(f"{fam}/data/image_folder_with_an_empty_class", fam, "data",
                      lambda tmp: (_images(tmp, [(8, 8)], empty_class=True), run_config(img)(tmp))[1],
                      words=("dog|class|img",)))
    cases.append(Case(f"{fam}/data/image_folder_missing", fam, "data", run_config(img), words=("img|root",)))
    cases += target_cases(fam, raw)
    return cases


TARGET_MODULE = '''
import numpy as np
import torch
from torch.utils.data import TensorDataset

def returns_int():
    return 5

def raises():
    raise RuntimeError("my loader broke")

def nan_clients(num_clients=3):
    g = np.random.default_rng(0)
    out = []
    for i in range(num_clients):
        x = torch.tensor(g.normal(size=(30, 4)), dtype=torch.float32)
        if i == num_clients - 1:
            x[3, 2] = float("nan")
        out.append(TensorDataset(x, torch.tensor(g.integers(0, 2, 30))))
    return out

def empty_client(num_clients=3):
    g = np.random.default_rng(0)
    sizes = [30] * (num_clients - 1) + [0]
    return [TensorDataset(torch.tensor(g.normal(size=(n, 4)), dtype=torch.float32),
                          torch.tensor(g.integers(0, 2, n))) for n in sizes]

def float64_data():
    g = np.random.default_rng(0)
    return TensorDataset(torch.tensor(g.normal(size=(90, 4))), torch.tensor(g.integers(0, 2, 90)))

def needs_arg(size):
    return float64_data()
'''


def target_cases(fam: str, raw: dict) -> list[Case]:
    """``data.target`` functions that return nonsense, raise, or give faulty data."""
    cases = []
    for fn, words in (("returns_int", "data.target"), ("raises", "data.target|my loader broke"),
                      ("nan_clients", "nan|finite"), ("empty_client", "client"), ("needs_arg", "size"),
                      ("not_there", "not_there")):
        r = set_path(raw, ("data",), {"target": f"userdata:{fn}", "num_clients": 3})
        if fam == "classic" and fn == "float64_data":
            continue

        def go(tmp: Path, r=r) -> Outcome:
            (tmp / "userdata.py").write_text(TARGET_MODULE)
            return run_config(r)(tmp)
        cases.append(Case(f"{fam}/data/target_{fn}", fam, "data", go, words=(words,)))
    return cases


# ------------------------------------------------------------------ the command line misused
def cli_cases(raw: dict) -> list[Case]:
    fam = "cli"

    def with_cfg(*argv, prepare=None) -> Callable[[Path], Outcome]:
        def go(tmp: Path) -> Outcome:
            _cfg_file(tmp, raw)
            if prepare is not None:
                prepare(tmp)
            return cli(*argv)(tmp)
        return go

    def finished(tmp: Path) -> None:
        _cfg_file(tmp, raw)
        assert call_cli(["run", tmp / "c.yaml", "--out", tmp / "done", "--quiet"]).rc == 0

    def locked(tmp: Path) -> None:
        from fedsolve.engine.run_folder import FolderLock

        tmp.joinpath("live").mkdir()
        _LOCKS.append(FolderLock(tmp / "live").acquire())

    def read_only(tmp: Path) -> None:
        (tmp / "afile").write_text("x")

    c = "{tmp}/c.yaml"
    cases = [
        ("missing_config", cli("run", "{tmp}/nope.yaml"), "nope.yaml"),
        ("config_is_a_folder", cli("run", "{tmp}"), "folder"),
        ("config_not_yaml", cli("run", "{tmp}/b.yaml", prepare=lambda t: (t / "b.yaml").write_bytes(b"\x00\xff{[")),
         "b.yaml"),
        ("config_empty", cli("run", "{tmp}/e.yaml", prepare=lambda t: (t / "e.yaml").write_text("")), "data|algorithm"),
        ("config_a_list", cli("run", "{tmp}/l.yaml", prepare=lambda t: (t / "l.yaml").write_text("- 1\n- 2\n")),
         "mapping"),
        ("config_duplicate_key", cli("run", "{tmp}/d.yaml", prepare=lambda t: (t / "d.yaml").write_text(
            yaml.safe_dump(raw) + "seeds: [1]\n")), "twice|seeds"),
        ("out_under_a_file", with_cfg("run", c, "--out", "{tmp}/afile/run", prepare=read_only), "--out"),
        ("out_is_a_file", with_cfg("run", c, "--out", "{tmp}/afile", prepare=read_only), "--out"),
        ("set_without_equals", with_cfg("run", c, "--set", "simulation.rounds"), "--set"),
        ("set_empty_key_part", with_cfg("run", c, "--set", "simulation..rounds=2"), "--set"),
        ("set_through_a_value", with_cfg("run", c, "--set", "simulation.rounds.x=2"), "rounds"),
        ("set_bad_yaml", with_cfg("run", c, "--set", "seeds=[0,"), "seeds"),
        ("set_list_index_out_of_range", with_cfg("run", c, "--set", "seeds.7=1"), "seeds"),
        ("set_unknown_key", with_cfg("run", c, "--set", "simulation.roundz=2"), "roundz"),
        ("set_empty_value_for_int", with_cfg("run", c, "--set", "simulation.rounds="), "rounds"),
        ("resume_without_a_run", with_cfg("run", c, "--out", "{tmp}/none", "--resume", "--quiet"), "--resume|none"),
        ("resume_and_overwrite", with_cfg("run", c, "--resume", "--overwrite"), "--resume|--overwrite"),
        ("overwrite_of_a_live_run", with_cfg("run", c, "--out", "{tmp}/live", "--overwrite", "--quiet",
                                             prepare=locked), "live|use"),
        ("resume_of_a_live_run", with_cfg("run", c, "--out", "{tmp}/live", "--resume", "--quiet", prepare=locked),
         "live|use"),
        ("rerun_into_a_finished_run", cli("run", c, "--out", "{tmp}/done", "--quiet", prepare=finished),
         "--overwrite|--resume"),
        ("negative_seed", with_cfg("run", c, "--seed", "-1"), "seed"),
        ("seed_not_a_number", with_cfg("run", c, "--seed", "one"), "seed"),
        ("unknown_algorithm_flag", with_cfg("run", c, "--algorithm", BOGUS), BOGUS),
        ("jobs_zero", with_cfg("compare", c, "--jobs", "0"), "jobs"),
        ("jobs_negative", with_cfg("suite", c, "--jobs", "-2"), "jobs"),
        ("only_unknown", with_cfg("compare", c, "--only", BOGUS), BOGUS),
        ("track_unknown", with_cfg("run", c, "--track", BOGUS), BOGUS),
        ("import_missing", with_cfg("--import", f"{BOGUS}_mod", "run", c), BOGUS),
        ("import_syntax_error", with_cfg("--import", "{tmp}/bad.py", "run", c,
                                         prepare=lambda t: (t / "bad.py").write_text("def f(:\n")), "bad.py"),
        ("import_raises", with_cfg("--import", "{tmp}/boom.py", "run", c,
                                   prepare=lambda t: (t / "boom.py").write_text("raise KeyError('x')\n")), "boom"),
        ("unknown_command", cli("runn", c), "runn"),
        ("list_unknown", cli("list", BOGUS), BOGUS),
        ("examples_unknown", cli("examples", BOGUS), BOGUS),
        ("run_without_config", cli("run"), "config"),
        ("unknown_flag", with_cfg("run", c, "--frobnicate"), "frobnicate"),
        ("suite_missing_file", cli("suite", "{tmp}/nope.yaml"), "nope.yaml"),
        ("compare_missing_file", cli("compare", "{tmp}/nope.yaml"), "nope.yaml"),
        ("suite_overwrite", with_cfg("suite", c, "--overwrite", "--quiet", "--out", "{tmp}/s"), None),
    ]
    out = []
    for label, go, words in cases:
        if words is None:
            out.append(Case(f"cli/cli/{label}", fam, "cli", go, runs=True))
        else:
            out.append(Case(f"cli/cli/{label}", fam, "cli", go, words=(words,)))
    return out


_LOCKS: list = []   # locks held by cases of a live run (released when the process ends)


# ------------------------------------------------------------------ the evidence tools on folders not ours
def evidence_cases(raw: dict) -> list[Case]:
    fam = "evidence"

    def empty(tmp: Path) -> None:
        (tmp / "f").mkdir()

    def foreign(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "summary.json").write_text(json.dumps({"hello": 1}))

    def broken_json(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "summary.json").write_text("{not json")

    def a_file(tmp: Path) -> None:
        (tmp / "f").write_text("x")

    def list_summary(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "summary.json").write_text("[1, 2]")

    def run_then(breaker: Callable[[Path], None]) -> Callable[[Path], None]:
        def prep(tmp: Path) -> None:
            _cfg_file(tmp, raw)
            assert call_cli(["run", tmp / "c.yaml", "--out", tmp / "f", "--quiet"]).rc == 0
            breaker(tmp / "f")
        return prep

    def garbage_metrics(f: Path) -> None:
        (f / "metrics.jsonl").write_text('{"round": 0, "x": 1}\n{broken\n')

    def no_config(f: Path) -> None:
        (f / "config.yaml").unlink()

    def bad_config(f: Path) -> None:
        (f / "config.yaml").write_text("data: [\n")

    def foreign_config(f: Path) -> None:
        (f / "config.yaml").write_text("hello: 1\n")

    def claims_bad(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "claims.json").write_text('{"not": "a list"}')

    def claims_missing_fields(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "claims.json").write_text('[{"id": "x"}]')

    def claims_bad_json(tmp: Path) -> None:
        (tmp / "f").mkdir()
        (tmp / "f" / "claims.json").write_text('[{"id": ')

    folders = {"missing": None, "empty": empty, "foreign_summary": foreign, "broken_summary": broken_json,
               "a_file": a_file, "list_summary": list_summary}
    cases = []
    for tool in ("report", "verify", "ledger"):
        for label, prep in folders.items():
            cases.append(Case(f"evidence/{tool}/{label}", fam, tool, cli(tool, "{tmp}/f", prepare=prep),
                              words=("{tmp}/f|/f|summary.json|claims.json|folder",)))
    for label, prep in (("claims_not_a_list", claims_bad), ("claims_without_fields", claims_missing_fields),
                        ("claims_broken_json", claims_bad_json)):
        for extra in ((), ("--check",)):   # the check reports a broken claims.json as its problem: exit 1
            cases.append(Case(f"evidence/ledger/{label}{'_check' if extra else ''}", fam, "ledger",
                              cli("ledger", "{tmp}/f", *extra, prepare=prep), words=("claims.json",),
                              rc=1 if extra else 2))
    for label, prep in folders.items():
        cases.append(Case(f"evidence/ledger/{label}_check", fam, "ledger", cli("ledger", "{tmp}/f", "--check",
                                                                            prepare=prep),
                          words=("{tmp}/f|/f|claims.json|folder",)))
    for label, breaker in (("garbage_metrics", garbage_metrics), ("no_config", no_config),
                           ("bad_config", bad_config), ("foreign_config", foreign_config)):
        for tool in ("report", "verify"):
            word = "metrics.jsonl" if "metrics" in label else "config.yaml"
            runs = tool == "report" and label in ("no_config", "foreign_config")   # it reads summary and metrics
            cases.append(Case(f"evidence/{tool}/run_with_{label}", fam, tool,
                              cli(tool, "{tmp}/f", prepare=run_then(breaker)), words=(word,), runs=runs))
    for label, args in (("verify_negative_rounds", ("--rounds", "-1")), ("verify_negative_rtol", ("--rtol", "-1")),
                        ("verify_nan_atol", ("--atol", "nan")), ("verify_unknown_cell", ("--cell", BOGUS))):
        word = {"verify_negative_rounds": "rounds", "verify_negative_rtol": "rtol", "verify_nan_atol": "atol",
                "verify_unknown_cell": BOGUS}[label]
        cases.append(Case(f"evidence/verify/{label}", fam, "verify",
                          cli("verify", "{tmp}/f", *args, prepare=run_then(lambda f: None)), words=(word,)))
    # suites
    about = {"name": "s", "description": "a suite"}
    suite_bad = {
        "unknown_protocol": {**about, "protocol": BOGUS},
        "grid_unknown_key": {**about, "experiment": "c.yaml", "grid": {BOGUS: [1]}},
        "experiment_missing": {**about, "experiment": "nope.yaml"},
        "sweep_unknown_field": {**about, "experiment": "c.yaml", "sweep": {f"simulation.{BOGUS}": [1, 2]}},
        "sweep_not_a_list": {**about, "experiment": "c.yaml", "sweep": {"simulation.rounds": 3}},
        "no_description": {"name": "s", "experiment": "c.yaml"},
        "algorithms_unknown_label": {**about, "experiment": "c.yaml", "algorithms": [BOGUS]},
    }
    for label, suite in suite_bad.items():
        def go(tmp: Path, suite=suite) -> Outcome:
            _cfg_file(tmp, raw)
            _cfg_file(tmp, suite, "s.yaml")
            return call_cli(["suite", tmp / "s.yaml", "--out", tmp / "o", "--quiet"])
        word = {"experiment_missing": "nope.yaml", "sweep_not_a_list": "simulation.rounds",
                "no_description": "description", "grid_unknown_key": "grid"}.get(label, BOGUS)
        cases.append(Case(f"evidence/suite/{label}", fam, "suite", go, words=(word,)))
    return cases


# ------------------------------------------------------------------ the Python API called wrongly
def api_cases(raw: dict) -> list[Case]:
    import fedsolve

    def with_cfg(fn: Callable[[Path], Any]) -> Callable[[Path], Outcome]:
        def go(tmp: Path) -> Outcome:
            _cfg_file(tmp, raw)
            (tmp / "afile").write_text("x")
            return call_api(lambda: fn(tmp))
        return go

    c = lambda t: str(t / "c.yaml")  # noqa: E731
    calls = [
        ("int_config", lambda t: fedsolve.run(5), "config"),
        ("list_config", lambda t: fedsolve.run([1, 2]), "config"),
        ("none_config", lambda t: fedsolve.run(None), "config"),
        ("misspelled_keyword", lambda t: fedsolve.run(c(t), sed=1), "sed"),
        ("out_is_a_file", lambda t: fedsolve.run(c(t), out=str(t / "afile")), "out"),
        ("negative_seed", lambda t: fedsolve.run(c(t), seed=-1), "seed"),
        ("seed_a_string", lambda t: fedsolve.run(c(t), seed="0"), "seed"),
        ("overrides_a_string", lambda t: fedsolve.run(c(t), overrides="simulation.rounds=1"), "overrides"),
        ("unknown_algorithm", lambda t: fedsolve.run(c(t), algorithm=BOGUS), BOGUS),
        ("callback_not_a_callback", lambda t: fedsolve.run(c(t), callbacks=[5]), "callbacks"),
        ("dict_config_unknown_key", lambda t: fedsolve.run({**raw, BOGUS: 1}), BOGUS),
        ("missing_path", lambda t: fedsolve.run(str(t / "nope.yaml")), "nope.yaml"),
    ]
    return [Case(f"api/api/{label}", "api", "api", with_cfg(fn), words=(w,)) for label, fn, w in calls]


def problem_api_cases() -> list[Case]:
    """The families' Python builders called with bad arguments."""
    from fedsolve.experiments.config import ConfigError

    def as_config_error(fn: Callable[[], Any]) -> Callable[[Path], Outcome]:
        def go(tmp: Path) -> Outcome:
            def call():
                try:
                    fn()
                except ValueError as e:   # the families' builders raise ValueError naming the argument
                    raise ConfigError(str(e)) from None
            return call_api(call)
        return go

    def qp(**kw):
        from fedsolve.families.constrained.kind import qp_problem

        return lambda: qp_problem(**{"d": 4, "n": 3, "m": 1, **kw})

    def rows(train):
        from fedsolve.families.constrained.kind import rows_data

        return lambda: rows_data(train)

    x = np.random.default_rng(0).normal(size=(10, 3))
    y = (x[:, 0] > 0).astype(float)
    xn = x.copy()
    xn[2, 1] = math.nan
    calls = [
        ("constrained", "qp_negative_d", qp(d=-1), "d = -1"),
        ("constrained", "qp_zero_clients", qp(n=0), "n = 0"),
        ("constrained", "rows_nan_features", rows([(x, y), (xn, y)]), "client 1|nan|finite"),
        ("constrained", "rows_length_mismatch", rows([(x, y[:5])]), "client 0|length|rows"),
    ]
    return [Case(f"{fam}/api/{label}", fam, "api", as_config_error(fn), words=(w,)) for fam, label, fn, w in calls]


def other_cases(bases: dict[str, dict]) -> list[Case]:
    cases = []
    for fam, raw in bases.items():
        cases += data_cases(fam, raw)
    return cases + cli_cases(bases["classic"]) + evidence_cases(bases["classic"]) + api_cases(bases["classic"]) \
        + problem_api_cases()
