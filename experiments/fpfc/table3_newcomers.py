"""Table 3 (FPFC Sec. 6.4.2): generalization to newcomers on synthetic S1.

20% of the devices (5 per cluster, a fixed random draw per seed) join after federated training on
the other 80% ends. Each method's own newcomer rule is its ``newcomer_models`` (paper Sec. 6.4.2 /
spec 3.2; the choices are documented on each method):
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
Metric: newcomers' mean test accuracy (mean +- std over seeds) next to the paper's Table 3.

usage: python experiments/fpfc/table3_newcomers.py [--rounds 2000] [--seeds 0 1 2]
       python experiments/fpfc/table3_newcomers.py --smoke
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import driver_args, driver_parser, fmt_pct, params_for, run, write_report  # noqa: E402

from fedsolve.algorithms import get_algorithm  # noqa: E402
from fedsolve.data.synthetic import fpfc_synthetic  # noqa: E402
from fedsolve.models import build_model_fn  # noqa: E402
from fedsolve.problems import FederatedProblem  # noqa: E402
from fedsolve.simulation.metrics import evaluate  # noqa: E402

LABELS = {"fpfc": "FPFC", "fpfc_l1": "FPFC-l1", "local": "LOCAL", "fedavg": "FedAvg", "lg_code": "LG",
          "perfedavg": "Per-FedAvg", "ifca": "IFCA", "cfl": "CFL", "pacfl": "PACFL"}
PAPER = {"LOCAL": 0.7900, "FedAvg": 0.3873, "LG": 0.6622, "Per-FedAvg": 0.4326, "IFCA": 0.3357, "CFL": 0.6943,
         "PACFL": 0.7188, "FPFC-l1": 0.6772, "FPFC": 0.7931}


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


def acc(problem, params) -> float:
    return evaluate(problem, params, problem.vmappable, ())[0]["test_accuracy"]


def main(argv=None):
    p = driver_parser(__doc__, "runs/fpfc_table3_newcomers")
    p.add_argument("--newcomer-rounds", type=int, default=100)
    p.add_argument("--lam", type=float, default=0.6)
    p.add_argument("--algorithms", nargs="+", default=list(LABELS), choices=list(LABELS))
    a = driver_args(p, argv, dict(rounds=2, newcomer_rounds=2, seeds=[0], size_scale=0.05, max_size=100))
    t0 = time.perf_counter()
    res: dict[str, list[float]] = {}
    mf = build_model_fn("logreg", (60,), 10)
    for seed in a.seeds:
        data = fpfc_synthetic(a.scenario, seed=seed, features="uniform", size_scale=a.size_scale, max_size=a.max_size)
        old, new = split_old_new(data, seed)
        p_old = FederatedProblem(data.subset(old), mf, name="old")
        p_new = FederatedProblem(data.subset(new), mf, name="newcomers")
        for name in a.algorithms:
            if name == "local":          # nothing to train on the old devices
                algo, server = get_algorithm("local")(params_for("local"), p_old), {}
            else:
                extra = {"lam": a.lam} if name == "fpfc" else None
                sim, algo, _ = run(p_old, name, params_for(name, extra), a.rounds, seed, eval_every=max(1, a.rounds))
                server = sim.server
            W = algo.newcomer_models(server, p_new, rounds=a.newcomer_rounds, seed=seed)
            v = acc(p_new, W)
            res.setdefault(LABELS[name], []).append(float(v))
            print(seed, LABELS[name], v, flush=True)
    lines = ["# Table 3: newcomers (FPFC Sec. 6.4.2), synthetic " + a.scenario, "",
             f"80% of the devices train for {a.rounds} rounds (30% participation, paper hyper-parameters, FPFC "
             f"lam {a.lam}); 20% (5 per cluster) join afterwards and get {a.newcomer_rounds} newcomer rounds. "
             f"size_scale={a.size_scale}, max n_i={a.max_size}, seeds {a.seeds}.", "",
             "| method | paper (Synthetic) | ours |", "|---|---|---|"]
    for label, pv in PAPER.items():
        lines.append(f"| {label} | {100 * pv:.2f}% | {fmt_pct(res[label]) if label in res else 'not run'} |")
    lines.append(f"\nTotal wall time {time.perf_counter() - t0:.0f} s.")
    write_report(a.out, lines, res)
    return res


if __name__ == "__main__":
    main()
