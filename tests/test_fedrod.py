"""FedRoD (families/personalized/fedrod.py): its rounds against a plain re-statement of the paper's two losses with
two real heads (the Balanced Softmax step on the shared model, the personal head trained on the generic logits and
detached features, the sum of the two heads' logits as the personal prediction), its reductions to FedAvg (gamma 0;
every client with balanced labels), and bad input."""

from __future__ import annotations

import fnmatch

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedsolve.data.federated import FederatedData
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.personalized.fedrod import FedRoD
from fedsolve.models import MLP, LeNet
from fedsolve.models.multimodal import HARClassifier
from fedsolve.problems import FederatedProblem
from test_personalized import blobs, mlp_problem, run, sim_for


def _head_and_body(prob, vec):
    """The MLP's output layer ``out`` as its own module's parameters, and the rest."""
    params = prob.layout.unflatten(vec)
    head = {k[len("out."):]: v for k, v in params.items() if k.startswith("out.")}
    body = {k: v for k, v in params.items() if not k.startswith("out.")}
    return head, body


def _features(prob, body, x):
    """z = body(x): the MLP's hidden layers (its forward without the output layer)."""
    model = prob.model
    z = x.reshape(x.shape[0], -1)
    for i, layer in enumerate(model.hidden):
        if isinstance(layer, torch.nn.Linear):
            z = F.linear(z, body[f"hidden.{i}.weight"], body[f"hidden.{i}.bias"])
        else:
            z = layer(z)
    return z


def test_fedrod_matches_a_plain_restatement_with_two_heads():
    prob = mlp_problem(personal=None)
    lr, lr_p, wd, gamma = 0.1, 0.05, 0.01, 1.0
    cfg = dict(lr=lr, personal_lr=lr_p, weight_decay=wd, gamma=gamma, batch_size=None, local_steps=2)
    sim = sim_for(prob, FedRoD(cfg, prob))
    w = sim.server["w"].clone()
    head0, _ = _head_and_body(prob, w)
    P = [{k: v.clone() for k, v in head0.items()} for _ in range(4)]   # p starts as a copy of the initial head
    wts = prob.data.weights.double() / prob.data.weights.double().sum()
    counts = [torch.bincount(prob.data.client_train(i)[1], minlength=3) for i in range(4)]
    assert any(bool((c == 0).any()) for c in counts)   # a client lacks a class: the prior's log 0
    for t in range(3):
        sim.run_round(t)
        ups = []
        for i in range(4):
            x, y = prob.data.client_train(i)
            prior = gamma * counts[i].double().log()    # the official form: -inf for an absent class
            wi = w.clone()
            for _ in range(2):
                head, body = _head_and_body(prob, wi)
                q = wi.detach().requires_grad_(True)
                bsm = F.cross_entropy(functional_call(prob.model, prob.layout.unflatten(q), (x,)) + prior, y)
                (g,) = torch.autograd.grad(bsm, q)
                z = _features(prob, body, x).detach()
                generic = F.linear(z, head["weight"], head["bias"]).detach()
                ph = {k: v.detach().requires_grad_(True) for k, v in P[i].items()}
                ce = F.cross_entropy(generic + F.linear(z, ph["weight"], ph["bias"]), y)
                gw, gb = torch.autograd.grad(ce, [ph["weight"], ph["bias"]])
                wi = wi - lr * (g + wd * wi)
                P[i] = {"weight": P[i]["weight"] - lr_p * (gw + wd * P[i]["weight"]),
                        "bias": P[i]["bias"] - lr_p * (gb + wd * P[i]["bias"])}
            ups.append(wi)
        w = (torch.stack(ups) * wts[:, None]).sum(0)
        torch.testing.assert_close(sim.server["w"], w, rtol=1e-6, atol=1e-9)   # log 1e-8 against -inf, float32 weights
        for i in range(4):
            p = torch.cat([P[i]["weight"].reshape(-1), P[i]["bias"]])
            torch.testing.assert_close(sim.clients["p"][i], p, rtol=1e-6, atol=1e-9)
    # the personal prediction: the sum of the two heads' logits, which is the model with head g + p
    personal = sim.eval_params()
    for i in range(4):
        x, _ = prob.data.client_train(i)
        head, body = _head_and_body(prob, sim.server["w"])
        z = _features(prob, body, x)
        pw, pb = sim.clients["p"][i][:-3].reshape(3, 8), sim.clients["p"][i][-3:]
        two_heads = F.linear(z, head["weight"], head["bias"]) + F.linear(z, pw, pb)
        one_model = functional_call(prob.model, prob.layout.unflatten(personal[i]), (x,))
        torch.testing.assert_close(one_model, two_heads, rtol=1e-12, atol=1e-12)


def test_fedrod_with_gamma_0_keeps_fedavgs_shared_model():
    prob = mlp_problem(personal=None)
    a = run(prob, FedRoD(dict(lr=0.1, batch_size=8, gamma=0.0), prob), 3, clients_per_round=2)
    b = run(prob, FedAvg(dict(lr=0.1, batch_size=8), prob), 3, clients_per_round=2)
    torch.testing.assert_close(a.server["w"], b.server["w"], rtol=0, atol=1e-15)
    assert not torch.equal(a.clients["p"][0], a.clients["p"][1])   # the personal heads did train


def test_fedrod_on_balanced_clients_is_fedavg_for_every_gamma():
    # every client holds each class equally often: the prior shifts all logits alike and the softmax ignores it
    g = np.random.default_rng(3)
    tr = [(g.normal(size=(12, 10)), np.repeat(np.arange(3), 4)) for _ in range(3)]
    te = [(g.normal(size=(6, 10)), np.repeat(np.arange(3), 2)) for _ in range(3)]
    data = FederatedData.from_client_arrays(tr, te, num_classes=3, dtype=torch.float64)
    prob = FederatedProblem(data, lambda: MLP(10, 3, hidden=(8,)).double())
    a = run(prob, FedRoD(dict(lr=0.1, batch_size=None, local_steps=3, gamma=2.0), prob), 2)
    b = run(prob, FedAvg(dict(lr=0.1, batch_size=None, local_steps=3), prob), 2)
    torch.testing.assert_close(a.server["w"], b.server["w"], rtol=1e-12, atol=1e-14)


def test_fedrod_global_scoring_is_the_shared_model():
    prob = mlp_problem(personal=None)
    sim = run(prob, FedRoD(dict(lr=0.1, batch_size=8, eval_model="global"), prob), 2)
    torch.testing.assert_close(sim.eval_params(), sim.server["w"].expand(4, -1), rtol=0, atol=0)


def test_fedrod_uses_lenets_last_layer_as_the_head():
    data = blobs(shape=(1, 8, 8), d=64, double=False)
    prob = FederatedProblem(data, lambda: LeNet((1, 8, 8), 3))
    algo = FedRoD(dict(lr=0.1), prob)
    assert prob.layout.entries[-2].name == "fc2.weight" and algo.head.size == 3 * 120 + 3 and algo.num_classes == 3


def test_the_har_models_last_group_is_its_output_layer():
    model = HARClassifier()
    names = [n for n, _ in model.named_parameters()]
    last = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in model.GROUPS["last"])]
    assert last == names[-2:] == ["head.2.weight", "head.2.bias"]


def test_fedrod_refuses_regression_and_a_head_that_is_not_the_last_layer():
    g = np.random.default_rng(0)
    tr = [(g.normal(size=(8, 4)), g.normal(size=8)) for _ in range(2)]
    data = FederatedData.from_client_arrays(tr, tr, task="regression")
    with pytest.raises(ValueError, match="fedrod: needs a classification problem"):
        FedRoD(dict(lr=0.1), FederatedProblem(data, lambda: MLP(4, 1, hidden=(3,))))

    class Tail(MLP):
        GROUPS = {"body": ["out.*"], "head": ["hidden.*"]}  # noqa: RUF012

    prob = FederatedProblem(blobs(double=False), lambda: Tail(10, 3, hidden=(8,)))
    with pytest.raises(ValueError, match="must be its final linear layer"):
        FedRoD(dict(lr=0.1), prob)
