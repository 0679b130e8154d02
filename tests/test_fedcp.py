"""FedCP (families/personalized/fedcp.py, its network in models/policy.py): two rounds against a plain re-statement of
the paper's client step (the policy's Gumbel-softmax split of the features between a personal and the frozen global
head,
CE plus the authors' RBF MMD to the received body's features, the half-and-half upload head, the server's weighted
means, the context from the uploaded and the new global head); the network's identities (with p = g it is the model
plus the head's bias, whatever the policy; the MMD of a sample with itself is 0 and equals the authors' mean form);
executors agree; the noise is a pure function of its keys; bad input gets one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedsolve.core.rng import counter_uniform, open_unit
from fedsolve.engine.algorithm import fitted_problem
from fedsolve.families.personalized.fedcp import MMD_BANDWIDTHS, FedCP, gumbel, rbf_mmd
from fedsolve.models import MLP
from fedsolve.models.policy import ConditionalPolicyNet
from fedsolve.problems import FederatedProblem
from test_personalized import blobs, mlp_problem, run, sim_for

pytestmark = pytest.mark.fast


def _authors_mmd(x, y):
    """The authors' MMD, written out: mean over all pairs of K_xx + K_yy - 2 K_xy."""

    def d(a, b):
        return (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T

    k = lambda dd: sum(torch.exp(-0.5 * dd / s) for s in MMD_BANDWIDTHS)
    return (k(d(x, x)) + k(d(y, y)) - 2 * k(d(x, y))).mean()


def _forward(P, x, noise):
    """The network by hand on the MLP (hidden 8): features, policy, the two heads."""
    z = F.relu(F.linear(x, P["body.hidden.0.weight"], P["body.hidden.0.bias"]))
    c = P["context"] / P["context"].norm()
    h = F.linear(z * c, P["cs.0.weight"], P["cs.0.bias"])
    h = F.relu(F.layer_norm(h, (16,), P["cs.1.weight"], P["cs.1.bias"]))
    a = torch.softmax(h.reshape(-1, 2, 8) + noise, dim=1)
    out = F.linear(z * a[:, 0], P["p.weight"], P["p.bias"]) + F.linear(z * a[:, 1], P["g.weight"], P["g.bias"])
    return out, z


def test_fedcp_matches_a_plain_restatement_for_two_rounds():
    prob = fitted_problem(FedCP, mlp_problem(personal=None))
    lr, wd, lam, steps = 0.2, 0.01, 5.0, 2
    sim = sim_for(prob, FedCP(dict(lr=lr, weight_decay=wd, lamda=lam, batch_size=None, local_steps=steps), prob))
    L = prob.layout
    server = L.unflatten(sim.server["w"].clone())
    salt = sim.server["salt"]
    ctx0 = sim.clients["context"].clone()
    P = [server["p.weight"].clone(), server["p.bias"].clone()]
    personal = [list(P) for _ in range(4)]
    sent: list = [None] * 4
    n = prob.data.weights.double()
    trained = [
        "body.hidden.0.weight",
        "body.hidden.0.bias",
        "p.weight",
        "p.bias",
        "cs.0.weight",
        "cs.0.bias",
        "cs.1.weight",
        "cs.1.bias",
    ]
    for t in range(2):
        sim.run_round(t)
        ups = []
        for i in range(4):
            x, y = prob.data.client_train(i)
            ctx = ctx0[i] if sent[i] is None else (sent[i] - server["g.weight"]).abs().sum(0)
            P = {
                **{k: v.clone() for k, v in server.items()},
                "p.weight": personal[i][0],
                "p.bias": personal[i][1],
                "context": ctx,
            }
            for s in range(steps):
                noise = gumbel(counter_uniform([salt, t, i, s], (x.shape[0], 2, 8), torch.float64))
                leaves = {k: P[k].detach().requires_grad_(True) for k in trained}
                out, z = _forward({**P, **leaves}, x, noise)
                z0 = F.relu(F.linear(x, server["body.hidden.0.weight"], server["body.hidden.0.bias"]))
                loss = F.cross_entropy(out, y) + lam * _authors_mmd(z, z0)
                grads = torch.autograd.grad(loss, list(leaves.values()))
                P.update({k: (leaves[k] - lr * (g + wd * leaves[k])).detach() for k, g in zip(trained, grads)})
            personal[i] = [P["p.weight"], P["p.bias"]]
            up = {
                **P,
                "g.weight": 0.5 * P["p.weight"] + 0.5 * server["g.weight"],
                "g.bias": 0.5 * P["p.bias"] + 0.5 * server["g.bias"],
            }
            sent[i] = up["g.weight"]
            ups.append(up)
        new = {
            k: sum(n[i] * ups[i][k] for i in range(4)) / n.sum()
            for k in server
            if k.split(".")[0] in ("body", "g", "cs")
        }
        server.update(new)
        got = L.unflatten(sim.server["w"])  # to 1e-7, not 1e-15: the engine's row weights 1/n are float32
        for k, v in server.items():
            torch.testing.assert_close(got[k], v, rtol=1e-6, atol=2e-7, msg=f"round {t}: {k}")
    scored = sim.eval_params()
    for i in range(4):
        row = L.unflatten(scored[i])
        torch.testing.assert_close(row["p.weight"], personal[i][0], rtol=1e-6, atol=2e-7)
        torch.testing.assert_close(row["context"], (sent[i] - server["g.weight"]).abs().sum(0))


def test_with_equal_heads_the_network_is_the_model_plus_a_bias_whatever_the_policy():
    torch.manual_seed(0)
    base = MLP(10, 3, hidden=(8,))
    net = ConditionalPolicyNet(base)
    x = torch.randn(16, 10)
    with torch.no_grad():
        net.context.copy_(torch.rand(8))
        noise = gumbel(counter_uniform([1, 2], (16, 2, 8)))
        # p = g: W(z pm) + W(z gm) = W z whatever the split; each head brings its bias (the authors' network too)
        torch.testing.assert_close(net(x), base(x) + base.out.bias)
        torch.testing.assert_close(net(x, noise), base(x) + base.out.bias)
        pm, gm = net.gates(net.body(x), noise)
        torch.testing.assert_close(pm + gm, torch.ones_like(pm))
        net.p.weight.add_(1.0)  # the heads differ: the split matters
        assert not torch.allclose(net(x, noise), net(x))


def test_mmd_is_the_authors_and_ignores_padding_rows():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    w = torch.full((6,), 1 / 6, dtype=torch.float64)
    torch.testing.assert_close(rbf_mmd(a, b, w), _authors_mmd(a, b))
    assert abs(float(rbf_mmd(a, a, w))) < 1e-12
    pad = torch.cat([w, torch.zeros(2, dtype=torch.float64)])
    junk = torch.randn(2, 4, generator=g, dtype=torch.float64) * 50
    torch.testing.assert_close(rbf_mmd(torch.cat([a, junk]), torch.cat([b, junk]), pad), _authors_mmd(a, b))


def test_noise_is_a_pure_function_of_its_keys():
    u = counter_uniform([7, 3, 2, 1], (4000,), torch.float64)
    assert float(u.min()) > 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.02
    torch.testing.assert_close(u, counter_uniform([7, 3, torch.tensor(2), 1], (4000,), torch.float64))
    assert not torch.equal(u, counter_uniform([7, 3, 2, 2], (4000,), torch.float64))
    rows = counter_uniform([7, 3, 2, 1], (10, 2, 5))  # a row's noise does not depend on how many rows follow
    torch.testing.assert_close(rows[:4], counter_uniform([7, 3, 2, 1], (4, 2, 5)))
    f = lambda c: counter_uniform([7, 3, c], (5,))
    torch.testing.assert_close(torch.func.vmap(f)(torch.arange(3)), torch.stack([f(torch.tensor(i)) for i in range(3)]))


def test_noise_stays_finite_in_float32():
    """The largest 32-bit values would round to 1.0 in float32 (Gumbel noise +inf, NaN in the softmax): they stay
    below 1 (a run diverged at round 18 before this)."""
    h = torch.tensor([0, 2**31, 2**32 - 1], dtype=torch.int64)
    for dtype in (torch.float32, torch.float64):
        u = open_unit(h, dtype)
        assert bool(((u > 0) & (u < 1)).all()) and bool(torch.isfinite(gumbel(u)).all())
    assert float(open_unit(h[2:], torch.float64)) == (2**32 - 0.5) / 2**32


def test_executors_agree():
    prob = fitted_problem(FedCP, mlp_problem(personal=None, double=False))
    cfg = dict(lr=0.1, batch_size=8, local_epochs=1)
    a = run(prob, FedCP(cfg, prob), rounds=2, executor="sequential", clients_per_round=3)
    b = run(prob, FedCP(cfg, prob), rounds=2, executor="vectorized", clients_per_round=3)
    torch.testing.assert_close(a.server["w"], b.server["w"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.eval_params(), b.eval_params(), rtol=1e-5, atol=1e-6)


class _Softmaxed(torch.nn.Module):
    GROUPS = {"last": ["out.*"]}  # noqa: RUF012

    def __init__(self):
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(10, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return torch.log_softmax(self.out(torch.relu(self.hidden(x))) * 2.0, -1)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="fedcp: the problem's model must be the conditional policy network"):
        prob = mlp_problem(personal=None)
        FedCP(dict(lr=0.1), prob)
    with pytest.raises(ValueError, match=r"fedcp: the model's output is not its output layer applied"):
        prob = fitted_problem(FedCP, FederatedProblem(blobs(double=False), _Softmaxed))
        FedCP(dict(lr=0.1), prob)
    with pytest.raises(ValueError, match=r"fedcp: the model's head .* must be its final linear layer"):
        fitted_problem(FedCP, FederatedProblem(blobs(double=False), lambda: torch.nn.Sequential(torch.nn.Flatten())))
