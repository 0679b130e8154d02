"""A protocol with phases: FedAvg with a server line-search round (the worked example of
docs/writing-an-algorithm.md, "Protocols with phases").

One iteration takes two communication rounds, declared as a phase table (``fedsolve.engine.phases``):

    train round:   w_i = LocalSGD_i(w);        d = sum_{i in S} p_i w_i - w        (FedAvg's step)
    search round:  L_j = sum_{i in S} p_i f_i(w + eta_j d)  for the step sizes eta_1..eta_K;
                   w <- w + eta_{j*} d,  j* = argmin_j L_j                      (a server line search)

The server reads its phase with ``PHASES.current(server)`` and moves with ``PHASES.enter``; a client reads the
phase of its message with ``PHASES.of(msg)`` (a marker key, the same for every client of a round), so the same
object runs unchanged in ``Simulation`` and under Flower (tests/test_examples_two_phase.py runs both and compares
the numbers). With the single step size 1 it is FedAvg, one FedAvg round every two rounds.

Run it with

    .venv/bin/python examples/two_phase_linesearch.py

It checks that the sequential and vectorized executors agree, prints the step size chosen in each search round
and compares the final training loss with FedAvg's after the same number of communication rounds.
"""

from __future__ import annotations

import sys

import torch
from pydantic import Field

from fedsolve.core import ClientStates, Work
from fedsolve.core.statements import Descend
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, register, weighted_mean
from fedsolve.engine.phases import Phase, PhaseTable

PHASES = PhaseTable(
    Phase("train", sends=("w",), uploads=("w",), then=("search",), doc="local SGD; the server forms d"),
    Phase("search", sends=("w", "d"), uploads=("loss",), then=("train",), doc="f_i(w + eta_j d) per step size"),
    start="train")


# --------------------------------------------------------------------------- the algorithm
class FedAvgLineSearchConfig(AlgorithmConfig):
    """Local SGD as FedAvg (lr, local_epochs, local_steps, batch_size, weight_decay inherited) and the server's
    candidate step sizes."""

    step_sizes: tuple[float, ...] = Field((0.5, 1.0, 2.0, 4.0), min_length=1,
                                          description="server step sizes eta_j tried along the averaged update d")


@register
class FedAvgLineSearch(Algorithm):
    name = "fedavg_linesearch"
    description = "FedAvg with a server line-search round (two rounds per iteration) -- docs example"
    Config = FedAvgLineSearchConfig
    phases = PHASES

    def init(self, x0, rngs):
        # the phase is server state (checkpointed with it), like the model w and the direction d
        return {**PHASES.init(), "w": x0.clone(), "d": torch.zeros_like(x0)}, ClientStates(self.num_clients)

    def work(self, round_=0):
        # a search round scores each step size on one full batch of the client's data ("probe")
        return {} if round_ is None else {**super().work(round_), "probe": Work(epochs=None, steps=1, batch_size=None)}

    def broadcast(self, server, ids, round_):
        w = expand(server["w"], ids)
        if round_ is None:                                   # the scoring message
            return {"w": w}
        if PHASES.current(server) == "search":
            return PHASES.message("search", w=w, d=expand(server["d"], ids))
        return PHASES.message("train", w=w)

    def local_update(self, state, msg, ctx):
        if PHASES.of(msg) == "train":                        # FedAvg's local SGD, stated
            return Descend(start=msg["w"], lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                           then=lambda w, steps: ({}, {"w": w}))
        losses = [ctx.loss(msg["w"] + eta * msg["d"], "probe") for eta in self.cfg.step_sizes]
        return {}, {"loss": torch.stack(losses)}             # f_i(w + eta_j d), j = 1..K

    def aggregate(self, server, ids, uploads, round_):
        if PHASES.current(server) == "train":
            d = weighted_mean(uploads["w"], self.client_weights[ids]) - server["w"]
            return PHASES.enter({**server, "d": d}, "search")
        L = weighted_mean(uploads["loss"], self.client_weights[ids])   # [K]: the weighted loss per step size
        eta = self.cfg.step_sizes[int(torch.argmin(L))]
        return PHASES.enter({**server, "w": server["w"] + eta * server["d"], "d": torch.zeros_like(server["d"])},
                            "train")

    def eval_model(self, state, msg):
        return msg["w"]


# --------------------------------------------------------------------------- using it
def tiny_problem(num_clients: int = 8, seed: int = 0):
    """FedProx's Synthetic(0.5, 0.5) data, small, with a logistic-regression model."""
    from fedsolve.data import fedprox_synthetic
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    data = fedprox_synthetic(0.5, 0.5, seed=seed, num_clients=num_clients, dim=20, max_size=120)
    return FederatedProblem(data, build_model_fn("logreg", data.input_shape, data.num_classes))


def simulation(problem, name: str, params: dict, rounds: int, executor: str = "auto", seed: int = 0,
               fraction: float = 0.5):
    from fedsolve.families import get_algorithm
    from fedsolve.engine import Simulation, SimulationConfig

    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor, sampling={"fraction": fraction},
                           metrics=[])
    return Simulation(problem, get_algorithm(name)(params, problem), cfg, seed=seed)


def main(argv: list[str]) -> int:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    problem = tiny_problem()
    params = {"lr": 0.05, "batch_size": 16}
    runs = {ex: simulation(problem, "fedavg_linesearch", params, 10, ex) for ex in ("sequential", "vectorized")}
    for sim in runs.values():
        sim.run()
    for k in ("w", "d"):
        torch.testing.assert_close(runs["sequential"].server[k], runs["vectorized"].server[k], rtol=1e-5, atol=1e-6)
    print("sequential == vectorized: ok")
    sim = simulation(problem, "fedavg_linesearch", params, 20)
    chosen = []
    while sim.round < 20:                    # drive it round by round through the public API
        server, _ = sim.state()
        searching = PHASES.current(server) == "search"
        w_before, d = server["w"], server["d"]
        sim.step()
        if searching:
            w_after = sim.state()[0]["w"]
            chosen.append(float((w_after - w_before).norm() / d.norm().clamp_min(1e-30)))
    print("step sizes chosen in the search rounds:", " ".join(f"{c:g}" for c in chosen))
    rec = sim.evaluate(sim.round, None)
    ref = simulation(problem, "fedavg", params, 20).run().history[-1]
    print(f"test loss after 20 communication rounds: line search {rec['test_loss']:.4f}, FedAvg {ref['test_loss']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
