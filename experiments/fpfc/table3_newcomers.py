"""Table 3 (FPFC Sec. 6.4.2): generalization to newcomers on synthetic S1.

20% of the devices (5 per cluster, a fixed random draw per seed) join after federated training on
the other 80% ends. Each method's own newcomer rule is in ``fedsolve.protocols.newcomers`` (paper
Sec. 6.4.2 / spec 3.2; the choices are documented there):
  FPFC, FPFC-l1  local training, then asyncFPFC with only the newcomer active against the frozen old
                 devices (theta/v with every old device, zeta with 1/(m_old+1)); newcomers do not
                 interact with each other; scored with their own w_i.
  LOCAL          newcomers train alone (``--newcomer-rounds`` rounds of 10 GD steps).
  FedAvg         the final global model.
  Per-FedAvg     the final global model after its one-step adaptation on the newcomer's data.
  LG (code)      the FPFC code's LG (``lg_code``: FedAvg scored before aggregation): the final global model
                 after one round of local training (the paper's rule for LG).
  IFCA           the cluster model with the lowest training loss.
  CFL            Sattler et al.'s parameter tree: walk the recorded splits, at each one moving to the
                 side whose members' updates the newcomer's own update resembles more.
  PACFL          the PACFL code's rule: one-shot clustering of all signatures, the cluster's model,
                 one round of local training.
Metric: newcomers' mean test accuracy (mean +- std over seeds) next to the paper's Table 3. For the
methods that cluster (FPFC, FPFC-l1, IFCA, CFL, PACFL) the report also gives the clusters they found on
the old devices at the end of training (number, and ARI against the true clusters).

``--suite`` runs the MNIST / FMNIST columns: the data, CNN, simulation settings and each method's
parameters come from a label-swap suite (``experiments/fpfc/label_swap_mnist.yaml``; ``--set`` overrides
it as in ``fedsolve compare``). 20% of the 20 devices (one per cluster) are the newcomers; the other 16
train for the suite's rounds with its participation.

usage: python experiments/fpfc/table3_newcomers.py [--rounds 2000] [--seeds 0 1 2]
       python experiments/fpfc/table3_newcomers.py --suite experiments/fpfc/label_swap_mnist.yaml \
           [--set simulation.rounds=50] [--lam 0.5] [--newcomer-rounds 20] [--resume] [--jobs 2]
       python experiments/fpfc/table3_newcomers.py --smoke
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Partial, cached_suite, cached_suite_data, driver_args, driver_parser, fmt_pct,  # noqa: E402
                    load_suite, params_for, run, run_cells, run_suite, suite_params, suite_participation,
                    suite_problem, write_report)

from fedsolve.algorithms import get_algorithm  # noqa: E402
from fedsolve.data.synthetic import fpfc_synthetic  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.protocols.newcomers import newcomer_models  # noqa: E402
from fedsolve.simulation.metrics import evaluate  # noqa: E402

LABELS = {"fpfc": "FPFC", "fpfc_l1": "FPFC-l1", "local": "LOCAL", "fedavg": "FedAvg", "lg_code": "LG",
          "perfedavg": "Per-FedAvg", "ifca": "IFCA", "cfl": "CFL", "pacfl": "PACFL"}
PAPER = {"LOCAL": 0.7900, "FedAvg": 0.3873, "LG": 0.6622, "Per-FedAvg": 0.4326, "IFCA": 0.3357, "CFL": 0.6943,
         "PACFL": 0.7188, "FPFC-l1": 0.6772, "FPFC": 0.7931}
#: Table 3's MNIST and FMNIST columns (spec 4.4)
PAPER_BY_DATASET = {
    "synthetic": PAPER,
    "mnist": {"LOCAL": 0.9081, "FedAvg": 0.7367, "LG": 0.9571, "Per-FedAvg": 0.9662, "IFCA": 0.9665, "CFL": 0.9546,
              "PACFL": 0.7445, "FPFC-l1": 0.9273, "FPFC": 0.9351},
    "fmnist": {"LOCAL": 0.7529, "FedAvg": 0.6626, "LG": 0.8025, "Per-FedAvg": 0.7794, "IFCA": 0.7393, "CFL": 0.7066,
               "PACFL": 0.6642, "FPFC-l1": 0.7554, "FPFC": 0.7573},
}


def split_old_new(data, seed: int, share: float = 0.2):
    rng = np.random.default_rng(20_000 + seed)
    cl = data.clusters.numpy()
    new = []
    for c in np.unique(cl):
        members = np.flatnonzero(cl == c)
        new += rng.choice(members, size=max(1, int(round(share * members.size))), replace=False).tolist()
    new = sorted(new)
    old = [i for i in range(data.num_clients) if i not in set(new)]
    return old, new


def cluster_lines(found: dict[str, dict], seeds) -> list[str]:
    """Report rows: per clustering method and seed, the clusters found on the old devices (number / ARI)."""
    labels = [lab for lab in LABELS.values() if any(f"{s}/{lab}" in found for s in seeds)]
    if not labels:
        return []
    out = ["", "Clusters found on the old devices at the end of training (number / ARI against the true "
               "clusters; - where that run predates this record):", "",
           "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for lab in labels:
        cells = []
        for s in seeds:
            d = found.get(f"{s}/{lab}")
            cells.append("-" if d is None else f"{d['num_clusters']:.0f}"
                         + (f" / {d['ari']:.2f}" if "ari" in d else ""))
        out.append(f"| {lab} | " + " | ".join(cells) + " |")
    return out


def acc(problem, params) -> float:
    return evaluate(problem, params, problem.vmappable, ())[0]["test_accuracy"]


@functools.lru_cache(maxsize=2)
def _split(seed: int, opts_key: str):
    """(old-device problem, newcomer problem, old ids, new ids, all devices) of one seed."""
    opts = json.loads(opts_key)
    if opts["suite"] is None:
        data = fpfc_synthetic(opts["scenario"], seed=seed, features="uniform", size_scale=opts["size_scale"],
                              max_size=opts["max_size"])
        old, new = split_old_new(data, seed)
        mf = build_model_fn("logreg", (60,), 10)
        return (FederatedProblem(data.subset(old), mf, name="old"), FederatedProblem(data.subset(new), mf, name="newcomers"),
                old, new, data.num_clients)
    cfg = cached_suite(opts["suite"], tuple(opts["sets"]))
    data = cached_suite_data(opts["suite"], tuple(opts["sets"]), seed)
    old, new = split_old_new(data, seed)
    return suite_problem(cfg, data, old, "old"), suite_problem(cfg, data, new, "newcomers"), old, new, data.num_clients


def one_method(name: str, seed: int, opts: dict) -> dict:
    """One method and seed: train on the old devices, then the method's newcomer rule. Returns the newcomers' mean
    test accuracy (``acc``) and, for a clustering method, the clusters it found on the old devices."""
    p_old, p_new, *_ = _split(seed, json.dumps(opts, sort_keys=True))
    cfg = None if opts["suite"] is None else cached_suite(opts["suite"], tuple(opts["sets"]))
    lam = opts["lam"]
    extra = {"lam": lam} if name == "fpfc" and lam is not None else None
    prm = params_for(name, extra) if cfg is None else suite_params(cfg, name, extra)
    if name == "local":          # nothing to train on the old devices
        algo, server, final = get_algorithm("local")(prm, p_old), {}, {}
    else:
        _, algo, out = (run(p_old, name, prm, opts["rounds"], seed, eval_every=max(1, opts["rounds"]))
                        if cfg is None else run_suite(cfg, p_old, name, prm, seed))
        server, final = out.server, out.extras          # extras: the algorithm's finalize()
    W = newcomer_models(algo, server, p_new, rounds=opts["newcomer_rounds"], seed=seed)
    clusters = {k: float(final[k]) for k in ("num_clusters", "ari") if k in final} if "num_clusters" in final else None
    return {"acc": float(acc(p_new, W)), "clusters": clusters}


def main(argv=None):
    p = driver_parser(__doc__, "runs/fpfc_table3_newcomers", resume=True, jobs=True)
    p.add_argument("--newcomer-rounds", type=int, default=100)
    p.add_argument("--lam", type=float, default=None, help="FPFC's lambda (default: 0.6; with --suite the suite's)")
    p.add_argument("--algorithms", nargs="+", default=list(LABELS), choices=list(LABELS))
    p.add_argument("--suite", default=None, help="a label-swap suite YAML: the MNIST / FMNIST columns")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of --suite (repeatable)")
    a = driver_args(p, argv, dict(rounds=2, newcomer_rounds=2, seeds=[0], size_scale=0.05, max_size=100))
    t0 = time.perf_counter()
    settings = {k: getattr(a, k) for k in ("scenario", "rounds", "size_scale", "max_size", "newcomer_rounds", "lam",
                                           "suite", "sets")}
    part = Partial(a.out, settings, a.resume, ("results", "old_clusters"))
    done: dict[str, float] = part["results"]
    found: dict[str, dict] = part["old_clusters"]   # "seed/label" -> {"num_clusters", "ari"}
    cfg = load_suite(a.suite, a.sets) if a.suite else None
    lam = a.lam if a.lam is not None or cfg is not None else 0.6   # None with --suite: the suite's own
    opts = {**settings, "lam": lam}
    todo = {f"{seed}/{LABELS[name]}": dict(name=name, seed=seed, opts=opts)
            for seed in a.seeds for name in a.algorithms if f"{seed}/{LABELS[name]}" not in done}

    def store(key: str, result: dict) -> None:
        done[key] = result["acc"]
        if result["clusters"] is not None:
            found[key] = result["clusters"]
        part.save()
        print(key, result["acc"], flush=True)

    run_cells(one_method, todo, a.jobs, store)
    res: dict[str, list[float]] = {}
    for seed in a.seeds:
        for name in a.algorithms:
            res.setdefault(LABELS[name], []).append(float(done[f"{seed}/{LABELS[name]}"]))
    _, _, old, new, num_clients = _split(a.seeds[-1], json.dumps(opts, sort_keys=True))
    if cfg is None:
        dataset, paper = "synthetic", PAPER
        lines = ["# Table 3: newcomers (FPFC Sec. 6.4.2), synthetic " + a.scenario, "",
                 f"80% of the devices train for {a.rounds} rounds (30% participation, paper hyper-parameters, FPFC "
                 f"lam {lam}); 20% (5 per cluster) join afterwards and get "
                 f"{a.newcomer_rounds} newcomer rounds. size_scale={a.size_scale}, max n_i={a.max_size}, "
                 f"seeds {a.seeds}.", ""]
    else:
        dataset = cfg.data.dataset
        paper = PAPER_BY_DATASET.get(dataset, {})
        sc = cfg.simulation
        lam = lam if lam is not None else suite_params(cfg, "fpfc").get("lam")
        lines = [f"# Table 3: newcomers (FPFC Sec. 6.4.2), {dataset} label swap (suite {cfg.name})", "",
                 f"{len(old)} of {num_clients} devices train for {sc.rounds} rounds ({suite_participation(cfg)}, "
                 f"the suite's parameters, FPFC lam {lam}); {len(new)} newcomers (20%, one draw per "
                 f"cluster and seed) join afterwards and get {a.newcomer_rounds} newcomer rounds. "
                 f"Data {dict(cfg.data.params)}, seeds {a.seeds}.", ""]
    lines += [f"| method | paper ({dataset}) | ours |", "|---|---|---|"]
    for label, pv in paper.items():
        lines.append(f"| {label} | {100 * pv:.2f}% | {fmt_pct(res[label]) if label in res else 'not run'} |")
    lines += [f"| {label} | not in the paper | {fmt_pct(v)} |" for label, v in res.items() if label not in paper]
    lines += cluster_lines(found, a.seeds)
    lines.append(f"\nTotal wall time {time.perf_counter() - t0:.0f} s{part.kept_note()}.")
    write_report(a.out, lines, res)
    return res


if __name__ == "__main__":
    main()
