"""FedAvgM (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution for
federated visual classification", Alg. 1): FedAvg with momentum on the server.

    w_i^{t+1} = LocalSGD_i(w^t)                                   (E epochs, lr eta)
    Delta^t   = sum_{i in S_t} p_i (w_i^{t+1} - w^t),   p_i = n_i / sum_{j in S_t} n_j
    v^{t+1}   = beta v^t + Delta^t
    w^{t+1}   = w^t + eta_s v^{t+1}

With beta = 0 and eta_s = 1 this is exactly FedAvg. (fedsolve ships FedAvgM as a server piece that composes with
any averaging solver, ``wrap: [{kind: server_opt, optimizer: momentum}]``; this file shows how a solver is written
from scratch.)

This file is the worked example of docs/writing-an-algorithm.md. Run it with

    .venv/bin/python examples/my_fedavgm.py

It (1) checks that the sequential and vectorized executors give the same numbers, (2) checks that
beta = 0, eta_s = 1 reproduces FedAvg, and (3) compares FedAvg and FedAvgM from an experiment config,
writing a compare folder (report.md, plots) under a temporary directory (or the folder given as the
first argument).
"""

from __future__ import annotations

import sys
import tempfile

import torch
from pydantic import Field

from fedsolve.core import ClientStates
from fedsolve.core.statements import Descend
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, register, weighted_mean


# --------------------------------------------------------------------------- the algorithm
class FedAvgMConfig(AlgorithmConfig):
    """FedAvgM hyper-parameters (lr, local_epochs, local_steps, batch_size, weight_decay inherited)."""

    server_lr: float = Field(1.0, gt=0, description="server step size eta_s")
    momentum: float = Field(0.9, ge=0, lt=1, description="server momentum beta")


@register
class FedAvgM(Algorithm):
    name = "my_fedavgm"
    description = "FedAvgM: FedAvg with server momentum (Hsu et al. 2019) -- docs example"
    Config = FedAvgMConfig
    cfg: FedAvgMConfig

    def init(self, x0, rngs):
        # server state: the global model and the momentum buffer; no per-client state
        return {"w": x0.clone(), "v": torch.zeros_like(x0)}, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        # only w goes down (the momentum buffer stays on the server): [k, d]; round_ None: the scoring message
        return {"w": expand(server["w"], ids)}

    def local_update(self, state, msg, ctx):
        # ONE client's update, stated: local SGD on its loss from msg["w"] ([d]); then its upload. The engine
        # runs the statement on whatever executes clients fastest for this model.
        w0 = msg["w"]
        return Descend(
            start=w0, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, then=lambda w, steps: ({}, {"delta": w - w0})
        )

    def aggregate(self, server, ids, uploads, round_):
        # uploads["delta"] is [k, d]; weighted by the selected clients' sample counts
        delta = weighted_mean(uploads["delta"], self.client_weights[ids])
        v = self.cfg.momentum * server["v"] + delta
        return {"w": server["w"] + self.cfg.server_lr * v, "v": v}

    def eval_model(self, state, msg):
        return msg["w"]  # every client is scored with the global model


# --------------------------------------------------------------------------- using it
def tiny_problem(num_clients: int = 8, seed: int = 0):
    """FedProx's Synthetic(0.5, 0.5) data, small, with a logistic-regression model."""
    from fedsolve.data import fedprox_synthetic
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    data = fedprox_synthetic(0.5, 0.5, seed=seed, num_clients=num_clients, dim=20, max_size=120)
    return FederatedProblem(data, build_model_fn("logreg", data.input_shape, data.num_classes))


def simulate(problem, name: str, params: dict, executor: str, rounds: int = 5, seed: int = 0):
    from fedsolve.engine import Simulation, SimulationConfig
    from fedsolve.families import get_algorithm

    algo = get_algorithm(name)(params, problem)
    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor, sampling={"fraction": 0.5})
    sim = Simulation(problem, algo, cfg, seed=seed)
    return sim, sim.run()


def check_executors() -> None:
    """The sequential and vectorized executors give the same numbers (see the doc's testing section)."""
    problem = tiny_problem()
    params = {"lr": 0.1, "batch_size": 16, "momentum": 0.9}
    s1, r1 = simulate(problem, "my_fedavgm", params, "sequential")
    s2, r2 = simulate(problem, "my_fedavgm", params, "vectorized")
    for k in r1.server:
        torch.testing.assert_close(r1.server[k], r2.server[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1.eval_params(), s2.eval_params(), rtol=1e-5, atol=1e-6)
    assert r1.ledger.uplink_bytes == r2.ledger.uplink_bytes
    print(
        f"sequential == vectorized: ok (test accuracy {r1.history[-1]['test_accuracy']:.4f}, "
        f"{r1.ledger.uplink_bytes} bytes up)"
    )


def check_reduces_to_fedavg() -> None:
    """beta = 0, eta_s = 1 is FedAvg (same minibatches: all randomness is keyed by seed/round/client)."""
    problem = tiny_problem()
    _, rm = simulate(problem, "my_fedavgm", {"lr": 0.1, "batch_size": 16, "momentum": 0.0}, "auto")
    _, ra = simulate(problem, "fedavg", {"lr": 0.1, "batch_size": 16}, "auto")
    torch.testing.assert_close(rm.server["w"], ra.server["w"], rtol=1e-5, atol=1e-6)
    print("momentum=0 reproduces FedAvg: ok")


def compare_from_config(out: str) -> dict:
    """The same algorithm from an experiment config, next to FedAvg (a compare folder in ``out``)."""
    from fedsolve.experiments import compare, parse_config

    cfg = parse_config(
        {
            "name": "fedavgm_example",
            "seeds": [0, 1],
            "data": {
                "dataset": "fedprox_synthetic",
                "num_clients": 10,
                "params": {"alpha": 0.5, "beta": 0.5, "dim": 20, "max_size": 150},
            },
            "model": {"name": "logreg"},
            "simulation": {"rounds": 20, "eval_every": 5, "sampling": {"clients_per_round": 5}},
            "defaults": {"lr": 0.05, "batch_size": 16, "local_epochs": 1},
            "algorithms": [
                {"name": "fedavg", "label": "FedAvg"},
                {"name": "my_fedavgm", "label": "FedAvgM", "params": {"momentum": 0.9}},
            ],
        }
    )
    agg = compare(cfg, out, progress=False)
    for label, e in agg["algorithms"].items():
        acc = e["final"]["test_accuracy"]
        print(f"  {label:<8} final test accuracy {acc['mean']:.4f} ± {acc['std']:.4f}")
    print(f"report: {out}/report.md")
    return agg


def main(argv: list[str]) -> int:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    check_executors()
    check_reduces_to_fedavg()
    if argv:
        compare_from_config(argv[0])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            compare_from_config(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
