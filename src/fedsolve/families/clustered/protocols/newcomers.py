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
  (:func:`fpfc_newcomers`, a run of ``fpfc.FPFCNewcomers``, whose round 0 is the warm-up), scored with their own
  w_i.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedsolve.core.plans import Work
from fedsolve.core.rng import RngStreams
from fedsolve.core.statements import Descend
from fedsolve.core.states import repeat_rows
from fedsolve.engine.algorithm import Algorithm, run_statement, shared_mask
from fedsolve.engine.loop import Simulation, SimulationConfig
from fedsolve.engine.metrics import evaluate
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.classic.local import Local
from fedsolve.families.clustered.baselines import (
    CFL,
    IFCA,
    PACFL,
    LGCode,
    PerFedAvg,
    pacfl_bases,
    pacfl_clusters,
    pacfl_proximity,
)
from fedsolve.families.clustered.fpfc import FPFC, FPFCConfig, FPFCNewcomers

Rule = Callable[..., Tensor]


# ---------------------------------------------------------------------- shared mechanics
def train_on(
    algo: Algorithm, problem, start: Tensor, *, seed: int = 0, work: Work | None = None, lr: float | None = None
) -> Tensor:
    """Plain local training of every client of ``problem`` from ``start`` ``[m, d]``: local SGD on ``f_i`` with
    ``algo``'s lr (unless ``lr`` is given), weight decay and trained mask, for ``work`` (default: one round's
    ``train`` phase)."""
    work = algo.work(0)["train"] if work is None else work
    c = algo.cfg
    stmt = Descend(
        start=start.contiguous(),
        lr=c.lr if lr is None else lr,
        weight_decay=c.weight_decay,
        mask=shared_mask(algo),
        then=lambda w, steps: ({"w": w}, {}),
    )
    return run_statement(problem, stmt, {"train": work}, RngStreams(seed), 0)


def train_losses(problem, params: Tensor) -> Tensor:
    """``[m]``: every client's mean training loss f_i with the flat parameters ``params[i]`` (float64)."""
    per = evaluate(problem, params, which=(), split="train")[1]
    return torch.tensor([d["loss"] for d in per], dtype=torch.float64)


def rounds_of_work(algo: Algorithm, rounds: int) -> Work:
    """``rounds`` rounds of ``algo``'s ``train`` phase as one phase (same steps, same batches)."""
    w = algo.work(0)["train"]
    if w.steps is not None:
        return Work(epochs=None, steps=w.steps * rounds, batch_size=w.batch_size)
    assert w.epochs is not None, "Work: a phase without steps has epochs (checked in Work.__post_init__)"
    return Work(epochs=w.epochs * rounds, batch_size=w.batch_size)


def _global(server, new_problem) -> Tensor:
    return server["w"].unsqueeze(0).expand(new_problem.num_clients, -1)


# ---------------------------------------------------------------------- the rules
def local_rule(algo, server, new_problem, *, rounds=100, seed=0):
    x0 = new_problem.init_params(RngStreams(seed).torch("init"))
    return train_on(
        algo, new_problem, repeat_rows(x0, new_problem.num_clients), seed=seed, work=rounds_of_work(algo, rounds)
    )


def fedavg_rule(algo, server, new_problem, *, rounds=100, seed=0):
    if type(algo).eval_model is not FedAvg.eval_model:  # scores a personal model: no global one to hand out
        raise NotImplementedError(f"{algo.name} defines no newcomer rule")
    return _global(server, new_problem).clone()


def lg_code_rule(algo, server, new_problem, *, rounds=100, seed=0):
    return train_on(algo, new_problem, _global(server, new_problem), seed=seed)


def perfedavg_rule(algo, server, new_problem, *, rounds=100, seed=0):
    # the adaptation Per-FedAvg states before scoring (eval_model), from the global model, on work(None)'s phases
    adapt = algo.eval_model({}, {"w": _global(server, new_problem).contiguous()})
    return run_statement(new_problem, adapt, algo.work(None), RngStreams(seed), 0)


def ifca_rule(algo, server, new_problem, *, rounds=100, seed=0):
    models, mn = server["models"], new_problem.num_clients
    losses = torch.stack(
        [train_losses(new_problem, models[l].unsqueeze(0).expand(mn, -1)) for l in range(models.shape[0])]
    )
    return models[losses.argmin(0)].clone()


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
    bases = pacfl_bases(algo.problem.data, c.n_basis, c.per_class) + pacfl_bases(
        new_problem.data, c.n_basis, c.per_class
    )
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
RULES: dict[type[Algorithm], Rule] = {
    Local: local_rule,
    FedAvg: fedavg_rule,
    LGCode: lg_code_rule,
    PerFedAvg: perfedavg_rule,
    IFCA: ifca_rule,
    CFL: cfl_rule,
    PACFL: pacfl_rule,
    FPFC: fpfc_rule,
}


def newcomer_models(algo: Algorithm, server, new_problem, *, rounds: int = 100, seed: int = 0) -> Tensor:
    """Flat parameters ``[m_new, d]`` for the clients of ``new_problem`` by ``algo``'s rule (module docstring),
    given its final ``server`` state; ``rounds`` bounds the newcomers' own work where the rule trains."""
    rule = next((RULES[k] for k in type(algo).__mro__ if k in RULES), None)
    if rule is None:
        raise NotImplementedError(f"{algo.name} defines no newcomer rule")
    return rule(algo, server, new_problem, rounds=rounds, seed=seed)


# ---------------------------------------------------------------------- FPFC's protocol
def fpfc_newcomers(
    algo: FPFC,
    server: dict[str, Tensor],
    new_problem,
    rounds: int = 50,
    seed: int = 0,
    init_epochs: float = 10.0,
    simulation: dict[str, Any] | None = None,
    denominator: Literal["m_old+1", "m_old"] = "m_old+1",
    eval_with: Literal["local", "cluster"] = "local",
) -> dict[str, Any]:
    """Newcomers after training (Sec. 6.4.2, spec 3.2): asyncFPFC with only the newcomer active.

    A run of ``FPFCNewcomers`` with every newcomer (a client of ``new_problem``) active: in round 0 each first
    trains locally (``init_epochs`` of plain local steps starting from the mean of the old models; choice
    documented, the paper is silent) and uploads w_i; then ``rounds`` rounds of eq. (5) against the frozen old
    devices (pairs with every old device, v initialized to 0; newcomers never pair with each other).
    ``eval_with='cluster'`` scores a newcomer with the n_i-weighted average of the old cluster it is fused
    with (||theta_ij|| <= nu for some old j), else its own w_i. Returns the newcomers' models, per-newcomer
    test scores and their summary, the ``[n, m_old]`` ||theta_ij|| and the old cluster each newcomer joined.
    """
    c = algo.cfg
    W_old = server["W"]
    denom = W_old.shape[0] + 1 if denominator == "m_old+1" else W_old.shape[0]
    new_algo = FPFCNewcomers(
        {k: v for k, v in c.model_dump().items() if k in FPFCConfig.model_fields},
        new_problem,
        frozen=W_old,
        denom=denom,
        init_epochs=init_epochs,
    )
    mn = new_problem.num_clients
    cfg = SimulationConfig(
        **{
            **(simulation or {}),
            "rounds": rounds + 1,
            "eval_every": rounds + 1,
            "metrics": [],
            "sampling": {"fraction": 1.0},
        }
    )
    srv = Simulation(new_problem, new_algo, cfg, seed=seed).run().server
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
    summary, per = evaluate(new_problem, params, which=())
    return {"params": params, "summary": summary, "per_client": per, "theta_norms": tnorm, "joined": joined}
