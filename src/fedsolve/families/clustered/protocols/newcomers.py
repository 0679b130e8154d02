"""Newcomers: clients that join after training (FPFC Sec. 6.4.2 / Table 3, "each method's own procedure").

:func:`newcomer_models` gives flat parameters ``[m_new, d]`` for the clients of ``new_problem`` from a trained
algorithm and its final server state, by the rule registered for the algorithm's class (or its nearest base
class) in :data:`RULES`:

* LOCAL: a newcomer trains alone from the common init for ``rounds`` rounds of local work;
* FedAvg / FedProx: the final global model (not for subclasses that score a personal model: Ditto, pFedMe);
* LG (``lg_code``): the global model after one round of local training;
* Per-FedAvg: the global model after Per-FedAvg's own one-step adaptation;
* IFCA: the cluster model with the lowest training loss (IFCA's own assignment step);
* CFL: Sattler et al.'s parameter tree (walk the recorded splits from the root, moving to the side whose
  members' updates the newcomer's own update resembles more), scored with its leaf cluster's model;
* PACFL: the PACFL code's unseen-client rule (one-shot clustering of all signatures, the cluster's model,
  one round of local training);
* FPFC / FPFC-l1: asyncFPFC with only the newcomers active against the frozen devices
  (:func:`fpfc_newcomers`, a ``Simulation`` of ``algorithms.fpfc.FPFCNewcomers``), scored with their own w_i.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import numpy as np
import torch
from torch import Tensor

from fedsolve.engine.algorithm import Algorithm, adapt_for_eval, run_plain
from fedsolve.families.clustered.baselines import (CFL, IFCA, PACFL, LGCode, PerFedAvg, pacfl_bases,
                                                      pacfl_clusters, pacfl_proximity)
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.clustered.fpfc import FPFC, FPFCConfig, FPFCNewcomers
from fedsolve.families.classic.local import Local
from fedsolve.core.executor import Work
from fedsolve.core.rng import RngStreams
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.engine.metrics import evaluate

Rule = Callable[..., Tensor]


# ---------------------------------------------------------------------- shared mechanics
def train_on(algo: Algorithm, problem, start: Tensor, *, seed: int = 0, work: Work | None = None,
             lr: float | None = None, executor: str = "auto") -> Tensor:
    """Plain local training of every client of ``problem`` from ``start`` ``[m, d]``: ``algo``'s ``local_sgd``
    on ``f_i`` (its lr unless ``lr`` is given, weight decay and mask) for ``work`` (default: one round's
    ``train`` phase)."""
    work = algo.work(0)["train"] if work is None else work
    return run_plain(problem, start, {"train": work}, lambda ctx, w: algo.local_sgd(ctx, w, lr=lr),
                     RngStreams(seed), 0, executor)


def rounds_of_work(algo: Algorithm, rounds: int) -> Work:
    """``rounds`` rounds of ``algo``'s ``train`` phase as one phase (same steps, same batches)."""
    w = algo.work(0)["train"]
    if w.steps is not None:
        return Work(epochs=None, steps=w.steps * rounds, batch_size=w.batch_size)
    return Work(epochs=w.epochs * rounds, batch_size=w.batch_size)


def _global(server, new_problem) -> Tensor:
    return server["w"].unsqueeze(0).expand(new_problem.num_clients, -1)


# ---------------------------------------------------------------------- the rules
def local_rule(algo, server, new_problem, *, rounds=100, seed=0):
    x0 = new_problem.init_params(RngStreams(seed).torch("init"))
    return train_on(algo, new_problem, repeat_rows(x0, new_problem.num_clients), seed=seed,
                    work=rounds_of_work(algo, rounds))


def fedavg_rule(algo, server, new_problem, *, rounds=100, seed=0):
    if type(algo).eval_model is not FedAvg.eval_model:   # scores a personal model: no global one to hand out
        raise NotImplementedError(f"{algo.name} defines no newcomer rule")
    return _global(server, new_problem).clone()


def lg_code_rule(algo, server, new_problem, *, rounds=100, seed=0):
    return train_on(algo, new_problem, _global(server, new_problem), seed=seed)


def perfedavg_rule(algo, server, new_problem, *, rounds=100, seed=0):
    return adapt_for_eval(algo, _global(server, new_problem), new_problem, RngStreams(seed), 0)


def ifca_rule(algo, server, new_problem, *, rounds=100, seed=0):
    models, mn = server["models"], new_problem.num_clients
    losses = [[d["loss"] for d in evaluate(new_problem, models[l].unsqueeze(0).expand(mn, -1),
                                           new_problem.vmappable, (), split="train")[1]]
              for l in range(models.shape[0])]
    return models[torch.as_tensor(np.argmin(np.array(losses), axis=0))].clone()


def cfl_rule(algo, server, new_problem, *, rounds=100, seed=0):
    mn = new_problem.num_clients
    cur = torch.zeros(mn, dtype=torch.long)
    for s, (parent, child) in enumerate(server["tree_ids"].tolist()):
        here = cur == parent
        if not bool(here.any()):
            continue
        w_s = server["tree_w"][s]
        upd = train_on(algo, new_problem, repeat_rows(w_s, mn), seed=seed) - w_s
        sim = torch.nn.functional.normalize(upd.double(), dim=1) @ server["tree_dir"][s].double().T  # [mn, 2]
        cur[here & (sim[:, 1] > sim[:, 0])] = child
    cl = server["cluster"]
    first = {int(c): int(torch.nonzero(cl == c)[0, 0]) for c in torch.unique(cl).tolist()}
    return server["W"][torch.as_tensor([first[int(c)] for c in cur])].clone()


def pacfl_rule(algo, server, new_problem, *, rounds=100, seed=0):
    c, m_old = algo.cfg, algo.num_clients
    bases = pacfl_bases(algo.problem.data, c.n_basis, c.per_class) + pacfl_bases(new_problem.data, c.n_basis,
                                                                                 c.per_class)
    lab = pacfl_clusters(pacfl_proximity(bases), c.threshold, c.linkage)
    cl_old = server["cluster"].numpy()
    x0 = new_problem.init_params(RngStreams(seed).torch("init")).to(server["W"].dtype)
    start = []
    for i in range(new_problem.num_clients):
        co = np.flatnonzero(lab[:m_old] == lab[m_old + i])
        if co.size == 0:
            start.append(x0)
            continue
        vals, counts = np.unique(cl_old[co], return_counts=True)
        start.append(server["W"][int(np.flatnonzero(cl_old == vals[np.argmax(counts)])[0])])
    return train_on(algo, new_problem, torch.stack(start), seed=seed)


def fpfc_rule(algo, server, new_problem, *, rounds=100, seed=0):
    return fpfc_newcomers(algo, server, new_problem, rounds=rounds, seed=seed)["params"]


#: algorithm class -> its newcomer rule; a class without an entry uses its nearest base class's
RULES: dict[type[Algorithm], Rule] = {Local: local_rule, FedAvg: fedavg_rule, LGCode: lg_code_rule,
                                      PerFedAvg: perfedavg_rule, IFCA: ifca_rule, CFL: cfl_rule, PACFL: pacfl_rule,
                                      FPFC: fpfc_rule}


def newcomer_models(algo: Algorithm, server, new_problem, *, rounds: int = 100, seed: int = 0) -> Tensor:
    """Flat parameters ``[m_new, d]`` for the clients of ``new_problem`` by ``algo``'s rule (module docstring),
    given its final ``server`` state; ``rounds`` bounds the newcomers' own work where the rule trains."""
    rule = next((RULES[k] for k in type(algo).__mro__ if k in RULES), None)
    if rule is None:
        raise NotImplementedError(f"{algo.name} defines no newcomer rule")
    return rule(algo, server, new_problem, rounds=rounds, seed=seed)


# ---------------------------------------------------------------------- FPFC's protocol
def fpfc_newcomers(algo: FPFC, server: dict[str, Tensor], new_problem, rounds: int = 50, seed: int = 0,
                   init_epochs: float = 10.0, executor: str = "sequential",
                   denominator: Literal["m_old+1", "m_old"] = "m_old+1",
                   eval_with: Literal["local", "cluster"] = "local") -> dict[str, Any]:
    """Newcomers after training (Sec. 6.4.2, spec 3.2): asyncFPFC with only the newcomer active.

    Each newcomer i (a client of ``new_problem``) first trains locally (``init_epochs`` of plain local
    steps starting from the mean of the old models; choice documented, the paper is silent), uploads
    w_i; then ``rounds`` rounds of ``FPFCNewcomers`` (pairs with every frozen old device, v initialized to 0;
    newcomers never pair with each other) run in a ``Simulation`` with every newcomer active.
    ``eval_with='cluster'`` scores a newcomer with the n_i-weighted average of the old cluster it is fused
    with (||theta_ij|| <= nu for some old j), else its own w_i. Returns the newcomers' models, per-newcomer
    test scores and their summary, the ``[n, m_old]`` ||theta_ij|| and the old cluster each newcomer joined.
    """
    c = algo.cfg
    new_algo = FPFCNewcomers({k: v for k, v in c.model_dump().items() if k in FPFCConfig.model_fields}, new_problem)
    mn = new_problem.num_clients
    W_old = server["W"]
    W = train_on(new_algo, new_problem, repeat_rows(W_old.mean(0), mn), seed=seed,
                 work=Work(epochs=init_epochs, batch_size=c.batch_size), executor=executor)
    sim = Simulation(new_problem, new_algo, SimulationConfig(rounds=rounds + 1, metrics=[], executor=executor,
                                                             sampling={"fraction": 1.0}), seed=seed)
    denom = W_old.shape[0] + 1 if denominator == "m_old+1" else W_old.shape[0]
    sim.set_state(new_algo.start(W, W_old, denom), ClientStates(mn, {"w": W}))
    sim.start_round = 1                  # newcomer round r runs as round r + 1 (round 0 was the warm-up)
    for _ in range(rounds):
        sim.step()
    srv, _ = sim.state()
    tnorm = new_algo.theta_norms(srv)
    params = srv["W"].clone()
    joined = []
    if eval_with == "cluster":
        lab_old = algo.cluster_labels(server)
        models = algo.cluster_models(server, lab_old)
        fidx = algo.fidx
        for i in range(mn):
            near = torch.nonzero(tnorm[i] <= c.nu).flatten()
            if near.numel():
                j = int(near[torch.argmin(tnorm[i, near])])
                params[i, fidx] = models[j, fidx]
                joined.append(int(lab_old[j]))
            else:
                joined.append(-1)
    summary, per = evaluate(new_problem, params, new_problem.vmappable, ())
    return {"params": params, "summary": summary, "per_client": per, "theta_norms": tnorm, "joined": joined}
