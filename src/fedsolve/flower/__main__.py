"""``python -m fedsolve.flower``: helpers for running a fedsolve experiment on Flower.

new-app DIR --experiment exp.yaml [--algorithm NAME] [--seed S] [--round-timeout 120] ...
    write a Flower app folder (pyproject.toml + a copy of the YAML) for `flwr run`
certs DIR --host 10.0.0.5 [--host superlink.example.org]
    write a private CA and a SuperLink TLS certificate for those hosts
node-keys DIR NAME [NAME ...]
    write one SuperNode authentication key pair per name (OpenSSH EC P-384)
local --experiment exp.yaml --algorithm NAME [--nodes auto] [--out DIR]
    start a SuperLink + one SuperNode per client on 127.0.0.1 (TLS + node authentication),
    run the experiment with `flwr run`, wait, print the final metrics, stop everything
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fedsolve.flower", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("new-app", help="write a Flower app folder")
    a.add_argument("dir")
    a.add_argument("--experiment", required=True)
    a.add_argument("--algorithm", default="")
    a.add_argument("--seed", type=int, default=-1)
    a.add_argument("--overrides", default="")
    a.add_argument("--round-timeout", type=float, default=120.0)
    a.add_argument("--eval-timeout", type=float, default=120.0)
    a.add_argument("--wait-for-nodes", type=float, default=300.0)
    a.add_argument("--results-dir", default="")
    a.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per app process (0: the experiment's threads, as its simulation)",
    )
    c = sub.add_parser("certs", help="CA + SuperLink certificate")
    c.add_argument("dir")
    c.add_argument("--host", action="append", default=[], help="IP or DNS name of the SuperLink (repeat)")
    k = sub.add_parser("node-keys", help="SuperNode authentication keys")
    k.add_argument("dir")
    k.add_argument("names", nargs="+")
    loc = sub.add_parser("local", help="run an experiment on a loopback Flower deployment")
    loc.add_argument("--experiment", required=True)
    loc.add_argument("--algorithm", default="")
    loc.add_argument("--seed", type=int, default=-1)
    loc.add_argument("--overrides", default="")
    loc.add_argument("--out", default="flower-local")
    loc.add_argument("--timeout", type=float, default=3600.0)
    args = p.parse_args(argv)

    if args.cmd == "new-app":
        from fedsolve.flower.appdir import write_app

        d = write_app(
            args.dir,
            experiment=args.experiment,
            algorithm=args.algorithm,
            seed=args.seed,
            overrides=args.overrides,
            round_timeout=args.round_timeout,
            eval_timeout=args.eval_timeout,
            wait_for_nodes=args.wait_for_nodes,
            results_dir=args.results_dir,
            threads=args.threads,
        )
        print(f"wrote {d / 'pyproject.toml'}")
    elif args.cmd == "certs":
        from fedsolve.flower.security import make_tls

        paths = make_tls(args.dir, args.host or ["127.0.0.1", "localhost"])
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    elif args.cmd == "node-keys":
        from fedsolve.flower.security import make_node_keys

        for n, (priv, pub) in make_node_keys(args.dir, args.names).items():
            print(f"{n}: private {priv}  public {pub}")
    elif args.cmd == "local":
        from fedsolve.flower.appdir import write_app
        from fedsolve.flower.launch import LocalFederation, read_history, wait_summary
        from fedsolve.flower.task import load_task

        out = Path(args.out).resolve()
        rc = {
            "experiment": str(Path(args.experiment).resolve()),
            "algorithm": args.algorithm,
            "seed": args.seed,
            "overrides": args.overrides,
        }
        m = load_task(rc).problem.num_clients
        app = write_app(
            out / "app",
            experiment=args.experiment,
            algorithm=args.algorithm,
            seed=args.seed,
            overrides=args.overrides,
            results_dir=str(out / "results"),
        )
        with LocalFederation(out / "federation", m, auth=True) as fed:
            fed.start_superlink()
            fed.register_nodes()
            fed.start_nodes()
            run_id = fed.run_app(app)
            print(f"run {run_id}: {m} SuperNodes; logs in {out / 'federation'}", flush=True)
            wait_summary(out / "results", args.timeout, fed)
        print(json.dumps(read_history(out / "results")[-1], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
