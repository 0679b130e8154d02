"""fedsolve command line: run, compare, list, report.

    fedsolve run CONFIG [--set key=value ...] [--out DIR] [--resume] [--seed N]
    fedsolve compare CONFIG [--set key=value ...] [--only LABEL ...] [--out DIR] [--resume]
    fedsolve list [algorithms|datasets|partitioners|models]
    fedsolve report DIR
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

EXIT_CONFIG, EXIT_DIVERGED = 2, 3


def _cmd_run(args) -> int:
    from fedsolve.experiments.config import load_config
    from fedsolve.experiments.runner import default_run_dir, run_one

    cfg = load_config(args.config, args.set)
    spec = cfg.algorithm or (cfg.algorithms[0] if len(cfg.algorithms) == 1 else None)
    if spec is None:
        names = [a.display for a in cfg.algorithms]
        if args.algorithm is None:
            print(f"error: config lists several algorithms {names}; use `fedsolve compare`, or pick one "
                  f"with --algorithm", file=sys.stderr)
            return EXIT_CONFIG
    if args.algorithm is not None:
        match = [a for a in cfg.all_algorithms() if a.display == args.algorithm or a.name == args.algorithm]
        if not match:
            print(f"error: --algorithm {args.algorithm!r} not in config; allowed: "
                  f"{[a.display for a in cfg.all_algorithms()]}", file=sys.stderr)
            return EXIT_CONFIG
        spec = match[0]
    seed = args.seed if args.seed is not None else cfg.seeds[0]
    run_dir = Path(args.out) if args.out else default_run_dir(cfg, spec, seed)
    if not args.resume and (run_dir / "checkpoint.pt").exists() and not args.overwrite:
        print(f"error: {run_dir} already holds a run; pass --resume to continue it or --overwrite to start "
              f"over", file=sys.stderr)
        return EXIT_CONFIG
    summary = run_one(cfg, spec, seed, run_dir, resume=args.resume, progress=not args.quiet)
    fin = summary["metrics"]["final"]
    shown = {k: round(v, 4) for k, v in fin.items() if k in ("test_accuracy", "test_f1", "test_auc", "test_rmse",
                                                               "train_loss", "num_clusters", "ari")}
    print(f"{spec.display} seed {seed}: {json.dumps(shown)}  ({summary['wall_time_s']:.1f} s)")
    print(f"run folder: {run_dir}  (report: {run_dir / 'report.md'})")
    return 0


def _cmd_compare(args) -> int:
    from fedsolve.experiments.config import load_config
    from fedsolve.experiments.runner import compare

    cfg = load_config(args.config, args.set)
    if args.only:
        specs = cfg.all_algorithms()
        unknown = [o for o in args.only if not any(o in (a.display, a.name) for a in specs)]
        if unknown:
            print(f"error: --only {unknown[0]!r} not in config; allowed: {[a.display for a in specs]}",
                  file=sys.stderr)
            return EXIT_CONFIG
        keep = [a for a in specs if a.display in args.only or a.name in args.only]
        cfg = cfg.model_copy(update={"algorithms": keep, "algorithm": None})
    if args.jobs < 1:
        print(f"error: --jobs: expected a whole number >= 1 (worker processes), got {args.jobs}", file=sys.stderr)
        return EXIT_CONFIG
    out = Path(args.out) if args.out else Path(cfg.out_dir) / cfg.name
    agg = compare(cfg, out, resume=args.resume, progress=not args.quiet and args.jobs == 1, jobs=args.jobs)
    print(f"\n{cfg.name}: {len(agg['algorithms'])} algorithms x {len(cfg.seeds)} seeds in {agg['wall_time_s']:.1f} s")
    for label, e in agg["algorithms"].items():
        acc = e["final"].get("test_accuracy") or e["final"].get("test_rmse") or {}
        if acc:
            print(f"  {label:<22} {acc['mean']:.4f} ± {acc['std']:.4f}")
    print(f"report: {out / 'report.md'}")
    return 0


def _cmd_list(args) -> int:
    from fedsolve.algorithms import ALGORITHMS
    from fedsolve.data.datasets import DATASETS
    from fedsolve.data.partition import PARTITIONERS
    from fedsolve.models import MODELS

    tables = {
        "algorithms": {k: v.description for k, v in ALGORITHMS.items()},
        "datasets": {k: v[1] for k, v in DATASETS.items()},
        "partitioners": {k: v[1] for k, v in PARTITIONERS.items()},
        "models": {k: v[1] for k, v in MODELS.items()},
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


def _cmd_report(args) -> int:
    from fedsolve.experiments.report import report_dir

    print(report_dir(args.dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedsolve", description="Structured federated optimization")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="import MODULE first (e.g. a file of your own @register-ed algorithms); repeatable")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("config", help="experiment YAML")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set simulation.rounds=5 (repeatable)")
        sp.add_argument("--out", help="output folder (default: runs/<name>/...)")
        sp.add_argument("--resume", action="store_true", help="continue from checkpoint.pt in the output folder")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("run", help="run one algorithm with one seed")
    common(r)
    r.add_argument("--seed", type=int, help="seed (default: the config's first seed)")
    r.add_argument("--algorithm", help="which of the config's algorithms (by label or name)")
    r.add_argument("--overwrite", action="store_true", help="start over in an existing run folder")
    r.set_defaults(fn=_cmd_run)
    c = sub.add_parser("compare", help="several algorithms x several seeds on one problem")
    common(c)
    c.add_argument("--only", action="append", default=[], metavar="LABEL",
                   help="run only this algorithm of the config (label or name; repeatable); the report shows "
                        "the others' paper values as 'not run'")
    c.add_argument("--jobs", type=int, default=1,
                   help="run the algorithm x seed runs in this many processes at once, each with threads/jobs torch "
                        "threads (default 1)")
    c.set_defaults(fn=_cmd_compare)
    ls = sub.add_parser("list", help="algorithms, datasets, partitioners, models")
    ls.add_argument("what", nargs="?", choices=["algorithms", "datasets", "partitioners", "models"])
    ls.set_defaults(fn=_cmd_list)
    rp = sub.add_parser("report", help="rebuild report.md and plots of a run or compare folder")
    rp.add_argument("dir")
    rp.set_defaults(fn=_cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import importlib

    for mod in args.imports or []:  # user plugins: modules that @register algorithms
        sys.path.insert(0, os.getcwd())
        importlib.import_module(mod)
    from fedsolve.experiments.config import ConfigError
    from fedsolve.simulation.loop import DivergenceError

    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except DivergenceError as e:
        print(f"run diverged: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
