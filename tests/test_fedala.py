"""FedALA (families/personalized/fedala.py): its rounds against a plain re-statement of the paper's steps (the ALA
start phase and its stop, the one-pass rounds after it, the mixed start, FedAvg's local steps and server), its
reduction to FedAvg when the weights cannot move, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, grad

from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.personalized.fedala import FedALA

from test_personalized import mlp_problem, run, sim_for


def test_fedala_matches_a_plain_restatement_of_its_rounds():
    prob = mlp_problem(personal=None, sizes=[16, 32, 16, 8])
    cfg = dict(lr=0.1, batch_size=None, local_steps=2, eta=0.7, rand_fraction=1.0, start_passes=3, top_params=2,
               num_pre_loss=2, threshold=1e9)
    sim = sim_for(prob, FedALA(cfg, prob))
    w = sim.server["w"].clone()
    d = w.numel()
    top = torch.zeros(d, dtype=w.dtype)
    last = prob.layout.entries[-2:]
    top[last[0].start:] = 1.0
    theta = [w.clone() for _ in range(4)]
    W = [torch.ones(d, dtype=w.dtype) for _ in range(4)]
    started = [False] * 4
    wts = prob.data.weights.double() / prob.data.weights.double().sum()
    for t in range(3):
        sim.run_round(t)
        ups = []
        for i in range(4):
            x, y = prob.data.client_train(i)

            def f(p, x=x, y=y):
                return torch.nn.functional.cross_entropy(functional_call(prob.model, prob.layout.unflatten(p), (x,)), y)

            diff = (w - theta[i]) * top
            base = w - diff
            if bool(diff.ne(0).any()):
                # start phase: until num_pre_loss = 2 losses are in (threshold huge), at most 3 full-batch passes;
                # afterwards one pass (rand_fraction 1, full batch: one step)
                for _ in range(2 if not started[i] else math.ceil(3 / 3)):
                    W[i] = (W[i] - 0.7 * grad(f)(base + diff * W[i]) * diff).clamp(0, 1)
                started[i] = True
            p = base + diff * W[i]
            for _ in range(2):
                p = p - 0.1 * grad(f)(p)
            theta[i] = p
            ups.append(p)
        w = (torch.stack(ups) * wts[:, None]).sum(0)
        for i in range(4):
            torch.testing.assert_close(sim.clients["theta"][i], theta[i], rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(sim.clients["W"][i], W[i], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(sim.server["w"], w, rtol=1e-7, atol=1e-8)   # float32 client weights
    assert started == [True] * 4 and all(bool((Wi[top == 0] == 1).all()) for Wi in W)   # only the top tensors mix
    assert not all(bool((Wi == 1).all()) for Wi in W)          # the weights did move


def test_fedala_whose_weights_cannot_move_keeps_fedavgs_global_model():
    # eta so small that W stays 1: every client starts from the global model, as in FedAvg
    prob = mlp_problem(personal=None)
    a = run(prob, FedALA(dict(lr=0.1, batch_size=8, eta=1e-300), prob), 3, clients_per_round=2)
    b = run(prob, FedAvg(dict(lr=0.1, batch_size=8), prob), 3, clients_per_round=2)
    torch.testing.assert_close(a.server["w"], b.server["w"], rtol=1e-12, atol=1e-12)
    assert bool((a.clients["W"] == 1).all())


def test_fedala_top_params_beyond_the_model_is_refused():
    prob = mlp_problem(personal=None)
    with pytest.raises(ValueError, match="top_params: 99; allowed: 1 to 4"):
        FedALA(dict(lr=0.1, top_params=99), prob)
