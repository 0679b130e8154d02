"""fedsolve command line: run, suite (compare), list, report.

    fedsolve run CONFIG [--set key=value ...] [--out DIR] [--resume | --overwrite] [--seed N] [--track csv,...]
                 [--distributed]   (under torchrun: the clients sharded over its processes)
    fedsolve suite SUITE|CONFIG [--set key=value ...] [--only LABEL ...] [--out DIR] [--resume | --overwrite]
                   [--jobs N] [--no-batch-sweeps] [--track csv,...]   (a grid of runs, or a registered protocol)
    fedsolve compare CONFIG [...]   (the same as fedsolve suite CONFIG: an experiment is a grid of one cell)
    fedsolve list [algorithms|datasets|partitioners|models|schedules|wrappers|protocols]
    fedsolve report DIR
    fedsolve verify DIR [--full] [--cell LABEL|KEY] [--rounds R] [--rtol X] [--atol X]
    fedsolve ledger DIR [--check | --recheck [--only ID ...]]
    fedsolve examples [NAME]       (the example configs shipped with fedsolve: their paths)
    fedsolve --version

Exit codes: 0 done, 1 ``verify`` found a difference (or ``ledger --check`` a problem), 2 bad input (a one-line
message naming the field and what is allowed), 3 the run diverged, 130 interrupted (Ctrl-C; continue with
``--resume``).

Process settings happen in :func:`main`, when a command starts (never on import): ``OMP_WAIT_POLICY=PASSIVE``
unless the environment sets it (before torch loads; see docs/getting-started.md, "Threads").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

EXIT_DIFFERS, EXIT_CONFIG, EXIT_DIVERGED, EXIT_INTERRUPTED = 1, 2, 3, 130


def _out_dir(path: Path) -> Path:
    """Create the output folder (a clear error when it cannot be: under a file, read-only, ...)."""
    from fedsolve.experiments.config import ConfigError

    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of its own (two runs started on one folder at once must not unlink each other's)
        fd, probe = tempfile.mkstemp(prefix=".fedsolve-write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = "it is a file" if path.is_file() else (e.strerror or str(e))
        raise ConfigError(
            f"--out {path}: cannot write there ({why}); allowed: a writable folder (not under a file)"
        ) from None
    return path


def _cmd_run(args) -> int:
    from fedsolve.experiments.config import load_config
    from fedsolve.experiments.runner import default_run_dir, run_one

    cfg = load_config(args.config, args.set)
    spec = cfg.algorithm or (cfg.algorithms[0] if len(cfg.algorithms) == 1 else None)
    if args.algorithm is not None:
        match = [a for a in cfg.all_algorithms() if a.display == args.algorithm or a.name == args.algorithm]
        if not match:
            print(
                f"error: --algorithm {args.algorithm!r} not in config; allowed: "
                f"{[a.display for a in cfg.all_algorithms()]}",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        spec = match[0]
    elif spec is None:
        names = [a.display for a in cfg.algorithms]
        print(
            f"error: config lists several algorithms {names}; use `fedsolve compare`, or pick one with --algorithm",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.seed is not None and args.seed < 0:
        print(f"error: --seed: expected a non-negative integer, got {args.seed}", file=sys.stderr)
        return EXIT_CONFIG
    seed = args.seed if args.seed is not None else cfg.seeds[0]
    run_dir = Path(args.out) if args.out else default_run_dir(cfg, spec, seed)
    if args.resume and args.overwrite:
        print("error: --resume and --overwrite contradict each other; give one", file=sys.stderr)
        return EXIT_CONFIG
    if args.resume and not run_dir.exists():
        print(
            f"error: --resume: there is no run at {run_dir}; allowed: the folder of a run to continue, or leave "
            f"out --resume to start one",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.distributed:  # every rank torchrun started runs this; rank 0 alone writes the folder and prints
        from fedsolve.experiments.distributed import run_distributed

        def prepare() -> None:
            _not_live(run_dir)
            _out_dir(run_dir)

        summary = run_distributed(
            cfg,
            spec,
            seed,
            run_dir,
            resume=args.resume,
            progress=not args.quiet,
            track=_track(args),
            overwrite=args.overwrite,
            prepare=prepare,
        )
        if summary is None:
            return 0
    else:
        _not_live(run_dir)
        track = _track(args)
        _out_dir(run_dir)
        summary = run_one(
            cfg, spec, seed, run_dir, resume=args.resume, progress=not args.quiet, track=track, overwrite=args.overwrite
        )
    fin = summary["metrics"]["final"]
    shown = {
        k: round(v, 4)
        for k, v in fin.items()
        if k
        in (
            "test_accuracy",
            "test_f1",
            "test_auc",
            "test_rmse",
            "train_loss",
            "num_clusters",
            "ari",
            "objective",
            "kkt_eps1",
            "kkt_eps2",
        )
    }
    print(f"{spec.display} seed {seed}: {json.dumps(shown)}  ({summary['wall_time_s']:.1f} s)")
    if summary.get("message"):  # the solver's own verdict, e.g. Prox-AL FL's certificate
        print(f"{spec.display}: {summary['message']}")
    print(f"run folder: {run_dir}  (report: {run_dir / 'report.md'})")
    return 0


def _cmd_compare(args) -> int:
    from fedsolve.experiments.compare import compare
    from fedsolve.experiments.config import load_config

    cfg = load_config(args.config, args.set)
    if args.only:
        specs = cfg.all_algorithms()
        unknown = [o for o in args.only if not any(o in (a.display, a.name) for a in specs)]
        if unknown:
            print(f"error: --only {unknown[0]!r} not in config; allowed: {[a.display for a in specs]}", file=sys.stderr)
            return EXIT_CONFIG
        keep = [a for a in specs if a.display in args.only or a.name in args.only]
        cfg = cfg.model_copy(update={"algorithms": keep, "algorithm": None})
    if args.jobs < 1:
        print(f"error: --jobs: expected a whole number >= 1 (worker processes), got {args.jobs}", file=sys.stderr)
        return EXIT_CONFIG
    out = Path(args.out) if args.out else Path(cfg.out_dir) / cfg.name
    if args.resume and args.overwrite:
        print("error: --resume and --overwrite contradict each other; give one", file=sys.stderr)
        return EXIT_CONFIG
    _not_live(out)
    track = _track(args)
    _out_dir(out)
    agg = compare(
        cfg,
        out,
        resume=args.resume,
        progress=not args.quiet and args.jobs == 1,
        jobs=args.jobs,
        overwrite=args.overwrite,
        track=track,
        batch=not args.no_batch_sweeps,
    )
    print(
        f"\n{cfg.name}: {len(agg['algorithms'])} algorithms x {len(cfg.seeds)} seeds in {agg['wall_time_s']:.1f} s "
        f"wall time (runs: {agg['run_time_s']:.1f} s together)"
    )
    for label, e in agg["algorithms"].items():
        acc = e["final"].get("test_accuracy") or e["final"].get("test_rmse") or {}
        if acc:
            print(f"  {label:<22} {acc['mean']:.4f} ± {acc['std']:.4f}")
    print(f"report: {out / 'report.md'}")
    return 0


def _not_live(path: Path) -> None:
    """Refuse to write into ``path`` while a live run holds it or a folder around it (a compare, a suite):
    one line naming the lock and the holder's pid (:func:`fedsolve.engine.run_folder.busy_above`)."""
    from fedsolve.engine.run_folder import busy_above

    busy = busy_above(path)
    if busy is not None:
        raise busy


def _track(args) -> list[str]:
    """``--track`` as writer names; an unknown name or a missing optional package is a one-line error."""
    from fedsolve.engine.tracking import parse_track
    from fedsolve.experiments.config import ConfigError

    try:
        return parse_track(args.track)
    except (ValueError, ImportError) as e:
        raise ConfigError(str(e)) from None


def _cmd_examples(args) -> int:
    from fedsolve.experiments.config import ConfigError
    from fedsolve.experiments.examples import example_files, example_path

    if args.name:
        try:
            print(example_path(args.name))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return 0
    for name, path in example_files().items():
        print(f"{name:<16} {path}")
    return 0


def _cmd_list(args) -> int:
    from fedsolve.data.datasets import DATASETS
    from fedsolve.data.partition import PARTITIONERS
    from fedsolve.engine.schedules import SCHEDULES
    from fedsolve.engine.wrappers import WRAPPERS
    from fedsolve.experiments.suite import builtin_protocols
    from fedsolve.families import ALGORITHMS
    from fedsolve.models import MODELS

    tables = {
        "algorithms": {k: v.description for k, v in ALGORITHMS.items()},
        "datasets": {k: v[1] for k, v in DATASETS.items()},
        "partitioners": {k: v[1] for k, v in PARTITIONERS.items()},
        "models": {k: v[1] for k, v in MODELS.items()},
        "schedules": {k: v.description for k, v in SCHEDULES.items()},  # protocols: algorithm.schedule.kind
        "wrappers": {k: v[1] for k, v in WRAPPERS.items()},  # algorithm.wrap[].kind
        "protocols": {k: v.description for k, v in builtin_protocols().items()},  # a suite's protocol
    }
    try:
        from fedsolve.models import multimodal

        tables["models"].update({k: v[1] for k, v in getattr(multimodal, "MODELS", {}).items()})
    except ImportError:
        pass
    which = [args.what] if args.what else list(tables)
    for w in which:
        print(f"{w}:")
        for k in sorted(tables[w]):
            print(f"  {k:<22} {tables[w][k]}")
    return 0


def _cmd_suite(args) -> int:
    """A suite YAML runs as a suite (all the logic lives in ``fedsolve.experiments.suite``); an experiment config as
    a grid of one cell, which is what ``compare`` runs."""
    from fedsolve.experiments.config import ConfigError
    from fedsolve.experiments.records import read_yaml
    from fedsolve.experiments.suite import is_suite, main as run_suite

    path = Path(args.config)
    if not path.is_file():
        raise ConfigError(f"suite: no file {path}")
    if not is_suite(read_yaml(path)):
        return _cmd_compare(args)
    if args.overwrite:
        raise ConfigError("--overwrite: a suite does not start over in its folder; allowed: --resume, or another --out")
    sets = list(args.set) + ([f"algorithms={json.dumps(args.only)}"] if args.only else [])
    run_suite(
        args.config,
        args.out,
        jobs=args.jobs,
        resume=args.resume,
        sets=sets,
        progress=not args.quiet,
        batch=not args.no_batch_sweeps,
        track=_track(args),
    )
    return 0


def _cmd_report(args) -> int:
    from fedsolve.experiments.report import report_dir

    try:
        print(report_dir(args.dir))
    except (ValueError, OSError) as e:  # a broken summary.json / config.yaml, a missing file
        allowed = "" if "allowed:" in str(e) else "; allowed: a run or compare folder written by fedsolve"
        print(f"error: fedsolve report {args.dir}: {e}{allowed}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _cmd_verify(args) -> int:
    from fedsolve.experiments.verify import verify

    if args.rounds is not None and args.rounds < 0:
        print(f"error: --rounds: expected a whole number >= 0, got {args.rounds}", file=sys.stderr)
        return EXIT_CONFIG
    found = verify(args.dir, full=args.full, cell=args.cell, rounds=args.rounds, rtol=args.rtol, atol=args.atol)
    print("\n".join(found.lines))
    return 0 if found.agrees else EXIT_DIFFERS


def _cmd_ledger(args) -> int:
    from fedsolve.experiments.ledger import check_ledger, stamp_commits, write_ledger

    if (args.check and args.recheck) or (args.only and not args.recheck):
        print(
            "error: ledger --check, --recheck, --only: allowed: --check alone, or --recheck [--only ID ...]",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.check:
        problems = check_ledger(args.dir)
        print("\n".join(problems) or f"{args.dir}: the ledger agrees with claims.json and every evidence path exists")
        return EXIT_DIFFERS if problems else 0
    stamped = stamp_commits(args.dir)
    readme = write_ledger(args.dir, recheck=args.recheck, only=args.only)
    print(
        f"{readme}: ledger written from {Path(args.dir) / 'claims.json'}"
        + (f"; {len(stamped)} summary.json given the commit that added them" if stamped else "")
    )
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (``fedsolve run: error: ...; see fedsolve run --help``, exit 2), like
    every other bad input; the usage is what ``--help`` shows."""

    def error(self, message: str):
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    from fedsolve._version import __version__

    p = _Parser(
        prog="fedsolve",
        description="Structured federated optimization",
        epilog="exit codes: 0 done, 2 bad input, 3 diverged, 130 interrupted (Ctrl-C)",
    )
    p.add_argument("--version", action="version", version=f"fedsolve {__version__}", help="print the version and exit")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="import MODULE first: a module name on the path or in the current folder, or a .py file "
        "path (e.g. a file of your own @register-ed algorithms); repeatable",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(
        sp, config="experiment YAML", sets="override a config value, e.g. --set simulation.rounds=5 (repeatable)"
    ):
        sp.add_argument("config", help=config)
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=sets)
        sp.add_argument("--out", help="output folder (default: runs/<name>/...)")
        sp.add_argument(
            "--resume",
            action="store_true",
            help="continue from the checkpoints in the output folder; refused when the config differs "
            "in anything but a larger simulation.rounds and cosmetic fields",
        )
        sp.add_argument("--overwrite", action="store_true", help="start over in an output folder that holds runs")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")
        sp.add_argument(
            "--track",
            default="",
            metavar="NAMES",
            help="also write each run's evaluations with these writers, comma-separated: csv "
            "(metrics.csv), tensorboard (tensorboard/), wandb, mlflow (see docs/tracking.md)",
        )

    r = sub.add_parser("run", help="run one algorithm with one seed")
    common(r)
    r.add_argument("--seed", type=int, help="seed (default: the config's first seed)")
    r.add_argument("--algorithm", help="which of the config's algorithms (by label or name)")
    r.add_argument(
        "--distributed",
        action="store_true",
        help="shard the clients over the processes torchrun starts (torchrun --nproc-per-node N -m "
        "fedsolve run CONFIG --distributed; see docs/distributed.md)",
    )
    r.set_defaults(fn=_cmd_run)

    def grid(sp):
        sp.add_argument(
            "--only",
            action="append",
            default=[],
            metavar="LABEL",
            help="run only this algorithm of the config (label or name; repeatable); the report shows "
            "the others' paper values as 'not run'",
        )
        sp.add_argument(
            "--jobs",
            type=int,
            default=1,
            help="run the runs (a suite's cells) in this many processes at once, each with threads/jobs "
            "torch threads (default 1)",
        )
        sp.add_argument(
            "--no-batch-sweeps",
            action="store_true",
            help="run every run on its own; by default runs that differ only in seed and scalar "
            "hyper-parameters (and a tuning grid's runs) train as one batch where the executor is "
            "the batched one: the same numbers up to float round-off",
        )

    c = sub.add_parser("compare", help="several algorithms x several seeds on one problem (fedsolve suite CONFIG)")
    common(c)
    grid(c)
    c.set_defaults(fn=_cmd_compare)
    ls = sub.add_parser("list", help="algorithms, datasets, partitioners, models, schedules, wrappers, protocols")
    ls.add_argument(
        "what",
        nargs="?",
        choices=["algorithms", "datasets", "partitioners", "models", "schedules", "wrappers", "protocols"],
        help="which registry to list (default: all)",
    )
    ls.set_defaults(fn=_cmd_list)
    rp = sub.add_parser("report", help="rebuild report.md and plots of a run or compare folder")
    rp.add_argument("dir", help="a run or compare folder (holds summary.json)")
    rp.set_defaults(fn=_cmd_report)
    vf = sub.add_parser(
        "verify",
        help="re-run one reported cell of a run, compare or suite folder and compare "
        "with its recorded numbers (exit 1 when they differ)",
    )
    vf.add_argument("dir", help="a run, compare or suite folder, e.g. one under results/")
    vf.add_argument("--full", action="store_true", help="re-run the whole cell (default: up to a reduced round)")
    vf.add_argument(
        "--cell",
        help="which cell: an algorithm label of a compare folder, a cells/ file name of a suite (default: the first)",
    )
    vf.add_argument(
        "--rounds",
        type=int,
        help="a reduced re-run stops at the first recorded evaluation at or after this round (default 10)",
    )
    vf.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    vf.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance (default 1e-8)")
    vf.set_defaults(fn=_cmd_verify)
    lg = sub.add_parser(
        "ledger",
        help="write the claims ledger table of a results/<family> folder from its "
        "claims.json (and stamp summaries that name no commit)",
    )
    lg.add_argument("dir", help="a results/<family> folder with a claims.json")
    lg.add_argument(
        "--check",
        action="store_true",
        help="only check: exit 1 when the README's table is not the generated one or an evidence path is missing",
    )
    lg.add_argument(
        "--recheck",
        action="store_true",
        help="first re-run a cell of each claim's evidence to its first evaluation with the current (committed) "
        "source and record whether it agrees (docs/fair-reporting.md)",
    )
    lg.add_argument(
        "--only", nargs="+", action="extend", metavar="ID", help="with --recheck: only these claims (repeatable)"
    )
    lg.set_defaults(fn=_cmd_ledger)
    ex = sub.add_parser("examples", help="the example configs shipped with fedsolve (their paths)")
    ex.add_argument("name", nargs="?", help="print only this example's path (e.g. demo)")
    ex.set_defaults(fn=_cmd_examples)

    st = sub.add_parser(
        "suite",
        help="run a suite (methods x data x parameters x seeds: a grid of runs or a "
        "registered protocol) or an experiment config (a grid of one cell) and write "
        "its report",
    )
    common(
        st,
        config="suite YAML (e.g. experiments/minimax/grid_suite.yaml) or experiment YAML",
        sets="override a suite field (seeds=[0], args.rounds=5) or experiment.<field>; for an experiment YAML "
        "its field (repeatable)",
    )
    grid(st)
    st.set_defaults(fn=_cmd_suite)
    return p


def _import_plugin(mod: str) -> None:
    """``--import``: a module name (searched on the path and in the current folder) or a ``.py`` file path
    (imported as a module named after the file, with its folder put on the path so workers find it too)."""
    import importlib

    from fedsolve.experiments.config import ConfigError

    path = Path(mod)
    if mod.endswith(".py") or os.sep in mod:
        if not path.is_file():
            raise ConfigError(f"--import {mod}: no such file; allowed: a module name or a .py file path")
        sys.path.insert(0, str(path.resolve().parent))
        name = path.stem
    else:
        sys.path.insert(0, os.getcwd())
        name = mod
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(
                f"--import {mod}: no module named {e.name!r} (looked in the current folder and on "
                f"the path); allowed: a module name or a .py file path"
            ) from None
        raise ConfigError(
            f"--import {mod}: it imports {e.name!r}, which is not installed; allowed: a module whose "
            f"imports are installed"
        ) from None
    except SyntaxError as e:
        raise ConfigError(
            f"--import {mod}: not valid Python ({e.msg}, {e.filename} line {e.lineno}); allowed: a module that imports"
        ) from None
    except Exception as e:  # noqa: BLE001  (the module's own code failed while it was imported)
        raise ConfigError(
            f"--import {mod}: importing it raised {type(e).__name__}: {str(e)[:200]}; allowed: a "
            f"module that imports without an error"
        ) from None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see the module docstring)
    args = build_parser().parse_args(argv)
    if argv is None:  # the fedsolve program: a SIGTERM (kill, a batch system's stop) ends it as Ctrl-C does
        signal.signal(signal.SIGTERM, _sigterm)
    from fedsolve.engine.loop import DivergenceError, ResumeError, RunInterrupted
    from fedsolve.engine.provenance import COMMAND, command_line, pin_source
    from fedsolve.engine.run_folder import FolderBusy
    from fedsolve.experiments.config import ConfigError

    COMMAND.set(command_line(argv))
    pin_source()  # the commit of the code this process loaded, before any run (HEAD may move during a long one)
    try:
        for mod in args.imports or []:  # user plugins: modules that @register algorithms
            _import_plugin(mod)
        return args.fn(args)
    except ConfigError as e:
        print(f"config error: {str(e).removeprefix('config: ')}", file=sys.stderr)
        return EXIT_CONFIG
    except ResumeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except DivergenceError as e:
        print(f"run diverged: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except FolderBusy as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as e:  # a full disk, a folder one may not write: one line, the folder marked incomplete
        print(f"error: {_os_error(e)}", file=sys.stderr)
        return EXIT_CONFIG
    except RunInterrupted as e:
        where = getattr(e, "where", None)
        kept = f" (last checkpoint: round {e.checkpoint_round})" if e.checkpoint_round is not None else ""
        return _interrupted(
            f"interrupted at round {e.round}{kept}{' in ' + where if where else ''}; continue with --resume",
            fast=argv is None,
        )
    except KeyboardInterrupt:
        return _interrupted(
            "interrupted; finished runs and the last checkpoints are kept; continue with --resume", fast=argv is None
        )


def _os_error(e: OSError) -> str:
    """One line for an operating-system error while writing results."""
    import errno

    where = f"cannot write {e.filename}" if e.filename else "cannot write"
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return (
            f"{where}: {e.strerror or 'no space left on device'}; the run folder is marked incomplete "
            f"(run.json); free some space and continue with --resume"
        )
    return f"{where}: {e.strerror or e}; the run folder is marked incomplete (run.json)"


def _sigterm(signum, frame) -> None:
    """SIGTERM as Ctrl-C: the running round stops, worker processes are stopped, the last checkpoint stays."""
    raise KeyboardInterrupt


def _interrupted(message: str, fast: bool) -> int:
    """Ctrl-C: one line, exit code 130. As the ``fedsolve`` program (``fast``) the process ends at once: every
    file is already on disk (atomic writes), and the interpreter's teardown of torch and the imported modules
    takes seconds on a busy machine."""
    print(f"\n{message}", file=sys.stderr)
    if fast:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
