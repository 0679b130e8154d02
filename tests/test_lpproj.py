"""lp-proj (families/personalized/lpproj.py): its rounds against a plain re-statement of the authors' two steps (the
theta-step with the clipped loss gradient and the projected lp pull, the w-step every ``personal_steps``), for p = 1
and p = 2; its projection; its reduction to local training when lam = 0; only k floats travel; bad input."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad

from fedsolve.families.classic.local import Local
from fedsolve.families.personalized.lpproj import LpProj
from test_personalized import mlp_problem, run, sim_for


def _P(k, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    P = torch.randn(k, d, generator=g, dtype=torch.float64)
    return P / P.norm(dim=1, keepdim=True)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_lpproj_matches_a_plain_restatement_of_its_rounds(p):
    prob = mlp_problem(personal=None)
    lr, local_lr, lam, wd, clip, k = 0.1, 0.05, 0.3, 0.01, 0.5, 3
    cfg = dict(lr=lr, local_lr=local_lr, lam=lam, p=p, weight_decay=wd, clip=clip, proj_dim=k, personal_steps=2,
               batch_size=None, local_steps=5)
    sim = sim_for(prob, LpProj(cfg, prob))
    x0 = sim.clients["theta"][0].clone()
    P = _P(k, x0.numel())
    theta = [x0.clone() for _ in range(4)]
    w = torch.zeros(k, dtype=torch.float64)
    wts = prob.data.weights.double() / prob.data.weights.double().sum()
    clipped = False
    for t in range(3):
        sim.run_round(t)
        ups = []
        for i in range(4):
            x, y = prob.data.client_train(i)

            def f(q, x=x, y=y):
                return torch.nn.functional.cross_entropy(functional_call(prob.model, prob.layout.unflatten(q), (x,)), y)

            wi = w.clone()
            for step in range(1, 6):
                g = grad(f)(theta[i])
                if g.norm() > clip:
                    g, clipped = g * clip / (g.norm() + 1e-6), True
                c = wi - P @ theta[i]
                theta[i] = theta[i] - lr * (g + wd * theta[i] - lam * P.T @ (torch.sign(c) * c.abs() ** (p - 1)))
                if step % 2 == 0:   # steps 2 and 4; the fifth ends the round without a w-step
                    c = wi - P @ theta[i]
                    wi = wi - local_lr * lam * torch.sign(c) * (c.abs() / torch.linalg.vector_norm(c, ord=p)) ** (p - 1)
            ups.append(wi)
        w = (torch.stack(ups) * wts[:, None]).sum(0)
        torch.testing.assert_close(sim.server["w"], w, rtol=1e-7, atol=1e-9)   # float32 client weights
        for i in range(4):
            torch.testing.assert_close(sim.clients["theta"][i], theta[i], rtol=1e-7, atol=1e-9)
    assert clipped and bool(w.abs().gt(0).all())
    torch.testing.assert_close(sim.eval_params(), torch.stack(theta), rtol=1e-7, atol=1e-9)


def test_lpproj_projection_has_unit_or_orthonormal_rows_from_its_seed():
    prob = mlp_problem(personal=None)
    a, b = LpProj(dict(proj_dim=4), prob), LpProj(dict(proj_dim=4), prob)
    assert torch.equal(a.P, b.P) and torch.equal(a.P, _P(4, prob.layout.dim))
    assert not torch.equal(a.P, LpProj(dict(proj_dim=4, proj_seed=1), prob).P)
    o = LpProj(dict(proj_dim=4, orthogonalize=True), prob).P
    torch.testing.assert_close(o @ o.T, torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-12)


def test_lpproj_with_lam_0_is_local_training_and_shares_only_k_floats():
    prob = mlp_problem(personal=None)
    a = run(prob, LpProj(dict(lr=0.1, batch_size=8, lam=0.0, clip=None, proj_dim=6), prob), 3)
    b = run(prob, Local(dict(lr=0.1, batch_size=8), prob), 3)
    torch.testing.assert_close(a.eval_params(), b.eval_params(), rtol=0, atol=1e-14)
    assert a.server["w"].shape == (6,) and bool((a.server["w"] == 0).all())


def test_lpproj_refuses_more_orthonormal_rows_than_parameters():
    prob = mlp_problem(personal=None)
    d = prob.layout.dim
    with pytest.raises(ValueError, match=f"proj_dim: {d + 1}; allowed with orthogonalize: 1 to {d}"):
        LpProj(dict(proj_dim=d + 1, orthogonalize=True), prob)
