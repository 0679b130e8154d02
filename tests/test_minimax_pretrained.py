"""The "pretrained" regime of adversarial domain adaptation (FedMM spec 2.5, 6.3): a centralized source-only stage
before round 0, then a 20x smaller step on the feature extractor; and the authors' code's scaling of psi's gradient
(psi_gradient: authors_code, 1 / (nu + 0.01) pretrained). Tiny two-moons data only."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from fedsolve.data.domains import toy_domains
from fedsolve.experiments.config import parse_config
from fedsolve.experiments.runner import build_problem
from fedsolve.families.minimax.problem import Pretrain, adversarial_problem, pretrain_on_source
from fedsolve.families.minimax.saddle import minimax_of
from tests.test_minimax import make, run_rounds

torch.set_num_threads(1)
NET = dict(features="mlp", feature_dim=16, hidden=[16], domain_hidden=8)
LR = 1.0   # a large eta_1 so that the float32 step (x 0.05 on the features) is resolved well above round-off


def _source_accuracy(problem, w):
    src = problem.data.train_y >= 0
    x, y = problem.data.train_x[src], problem.data.train_y[src]
    logits = functional_call(problem.model, problem.layout.unflatten(w), (x,))
    return float((logits.argmax(-1) == y).float().mean())


def test_pretraining_reaches_the_source_accuracy_of_two_moons():
    """Two moons at noise 0.1 are separable by a small MLP up to a few overlapping points: the source-only stage
    takes the label predictor from chance (~50%) to >= 97% on the pooled source rows (both clients' at p = 0.5),
    leaves psi as drawn and is a function of the generator."""
    data = toy_domains(num_clients=2, p=0.5, n=200, n_test=50, seed=0)
    pr = adversarial_problem(data, "dann", **NET, pretrain=Pretrain(steps=600, lr=0.5, batch_size=64))
    scratch = adversarial_problem(data, "dann", **NET)
    g = lambda: torch.Generator().manual_seed(7)                                  # noqa: E731
    w_random, w_pre = scratch.init_params(g()), pr.init_params(g())
    acc0, acc1 = _source_accuracy(pr, w_random), _source_accuracy(pr, w_pre)
    print(f"source accuracy: random init {acc0:.3f}, after pretraining {acc1:.3f}")
    assert acc0 < 0.8 and acc1 >= 0.97
    psi = pr.layout.mask("psi")
    torch.testing.assert_close(w_pre[psi], w_random[psi], rtol=0, atol=0)
    assert not torch.equal(w_pre[~psi], w_random[~psi])
    torch.testing.assert_close(pr.init_params(g()), w_pre, rtol=0, atol=0)
    # the same stage called directly: only the labelled rows matter (the target rows carry y = -1)
    w_direct = pretrain_on_source(pr, w_random, Pretrain(steps=600, lr=0.5), torch.Generator().manual_seed(1))
    assert _source_accuracy(pr, w_direct) >= 0.97


def _one_full_batch_step(problem, **params):
    algo = make("fedsgda", problem, lr=LR, lr_psi=2 * LR, **params)
    w0 = problem.init_params(torch.Generator().manual_seed(3))
    server, _, _ = run_rounds(algo, 1, "sequential", x0=w0)
    return server["w"] - w0, _grad_f(problem)(w0)


def _grad_f(problem):
    """``params -> grad f_i(params)`` on the whole (one-client) training set, rows weighted 1/n."""
    d = problem.data
    n = d.train_y.numel()
    w = torch.full((n,), 1.0 / n)
    return torch.func.grad(lambda p: minimax_of(problem).loss(p, d.train_x, d.train_y, w))


def _regime_problem(regime, **extra):
    raw = {"name": "da", "data": {"dataset": "toy_domains", "num_clients": 1, "params": {"n": 40, "n_test": 10}},
           "problem": {"kind": "domain_adaptation",
                       "params": {"loss": "dann", **NET, "regime": regime, "pretrain": {"steps": 20}, **extra}},
           "algorithm": {"name": "fedsgda"}}
    return build_problem(parse_config(raw), seed=0)


def test_pretrained_regime_steps_the_features_20x_slower():
    """One full-batch FedSGDA step (one client): the step on every block equals -lr * grad f (psi: +lr_psi * grad f)
    with lr = eta_1 on the classifier and eta_1 x 0.05 on the feature extractor in the pretrained regime (the
    paper's 0.01 -> 0.0005), eta_1 on both from scratch; an explicit feature_lr wins; nu defaults to the paper's
    pretrained 0.25."""
    for regime, feat_lr in (("pretrained", 0.05 * LR), ("scratch", LR)):
        pr = _regime_problem(regime)
        step, g = _one_full_batch_step(pr)
        feat, psi = pr.layout.mask("features"), pr.layout.mask("psi")
        clf = ~feat & ~psi
        assert bool(feat.any()) and bool(clf.any()) and g[feat].abs().max() > 1e-4
        torch.testing.assert_close(step[feat], -feat_lr * g[feat], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(step[clf], -LR * g[clf], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(step[psi], 2 * LR * g[psi], rtol=1e-3, atol=1e-6)
        ratio = float((step[clf].norm() / g[clf].norm()) / (step[feat].norm() / g[feat].norm()))
        print(f"{regime}: classifier step / feature step (per unit gradient) = {ratio:.3f}")
        assert ratio == pytest.approx(20.0 if regime == "pretrained" else 1.0, rel=1e-3)
        assert pr.extras["domain_adaptation"]["nu"] == (0.25 if regime == "pretrained" else 1.0)
    step, g = _one_full_batch_step(_regime_problem("pretrained"), feature_lr=0.2)
    feat = _regime_problem("pretrained").layout.mask("features")
    torch.testing.assert_close(step[feat], -0.2 * g[feat], rtol=1e-3, atol=1e-6)


def test_regime_errors_name_the_field():
    with pytest.raises(ValueError, match="regime"):
        _regime_problem("finetune")
    with pytest.raises(ValueError, match="pretrain.steps"):
        _regime_problem("pretrained", pretrain={"steps": 0})
    with pytest.raises(ValueError, match="feature_scale"):
        _regime_problem("pretrained", feature_scale=-1)


# ---------------------------------------------------------------- the authors' scaling of psi's gradient
def test_authors_code_divides_psis_gradient_by_nu_plus_001_pretrained_and_by_nu_from_scratch():
    """One full-batch FedSGDA step: psi moves by lr_psi * grad_psi f * c with c = 1 in the paper (default),
    1 / (nu + 0.01) = 1 / 0.26 pretrained and 1 / nu = 2 from scratch (nu = 0.5) with psi_gradient: authors_code;
    omega's step is unchanged (features x 0.05 pretrained)."""
    cases = (("pretrained", {}, 1.0), ("pretrained", {"psi_gradient": "authors_code"}, 1 / 0.26),
             ("scratch", {"nu": 0.5}, 1.0), ("scratch", {"nu": 0.5, "psi_gradient": "authors_code"}, 2.0))
    for regime, extra, c in cases:
        pr = _regime_problem(regime, **extra)
        step, g = _one_full_batch_step(pr)
        feat, psi = pr.layout.mask("features"), pr.layout.mask("psi")
        clf = ~feat & ~psi
        assert g[psi].abs().max() > 1e-3
        torch.testing.assert_close(step[psi], 2 * LR * c * g[psi], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(step[clf], -LR * g[clf], rtol=1e-4, atol=1e-7)
        f_lr = 0.05 * LR if regime == "pretrained" else LR
        torch.testing.assert_close(step[feat], -f_lr * g[feat], rtol=1e-4, atol=1e-7)
        assert pr.extras["domain_adaptation"]["psi_scale"] == pytest.approx(c, rel=1e-12)
        print(f"{regime} {extra}: psi step / (lr_psi grad_psi f) = "
              f"{float(step[psi].norm() / (2 * LR * g[psi].norm())):.4f} (expected {c:.4f})")


def test_authors_code_scales_only_the_gradient_in_fedmm_not_its_penalty_or_duals():
    """FedMM, one client, M = 2 full-batch steps, 2 rounds, against a hand-written loop of Algorithm 3 in which only
    psi's gradient of f_i is divided by nu + 0.01 (the authors' finetune mode): the penalty mu_2 (psi - psi_0^t)
    and the dual beta enter unscaled, as in their optimizer."""
    pr = _regime_problem("pretrained", psi_gradient="authors_code")
    lr, lr_psi, mu1, mu2, eta3, rounds, m_steps = LR, 2 * LR, 0.7, 3.0, 0.5, 2, 2
    algo = make("fedmm", pr, lr=lr, lr_psi=lr_psi, local_steps=m_steps, mu1=mu1, mu2=mu2, eta3=eta3)
    w_start = pr.init_params(torch.Generator().manual_seed(3))
    server, _, _ = run_rounds(algo, rounds, "sequential", x0=w_start)

    feat, psi = pr.layout.mask("features"), pr.layout.mask("psi")
    step = torch.where(psi, lr_psi, torch.where(feat, 0.05 * lr, lr))
    sign = torch.where(psi, -1.0 / (0.25 + 0.01), 1.0)
    mu = torch.where(psi, mu2, mu1)
    grad = _grad_f(pr)
    w0, dual = w_start.clone(), torch.zeros_like(w_start)
    for t in range(rounds):
        w = w0.clone()
        for _ in range(m_steps):
            w = w - step * (sign * grad(w) + mu * (w - w0) + dual)
        dual = dual + mu * (w - w0)
        w0 = w + eta3 ** t * dual / mu
    moved = (w0 - w_start)[psi].abs().max()
    assert moved > 1e-2
    # float32 rounding: the engine folds mu (w - w0^t) + dual into mu w + (dual - mu w0^t) (one pass a step); with
    # weights up to |14| after these steps, a different order of the same sums moves a weight by up to ~4e-5
    torch.testing.assert_close(server["w"], w0, rtol=1e-4, atol=1e-4)
    # the same loop with the scale also on the penalty and dual (a different algorithm) is far from it
    w0b, dual = w_start.clone(), torch.zeros_like(w_start)
    for t in range(rounds):
        w = w0b.clone()
        for _ in range(m_steps):
            w = w - step * (sign.abs() * (torch.where(psi, -1.0, 1.0) * grad(w) + mu * (w - w0b) + dual))
        dual = dual + mu * (w - w0b)
        w0b = w + eta3 ** t * dual / mu
    gap = float((server["w"] - w0b)[psi].abs().max())
    print(f"psi moved {float(moved):.3e}; scaled-penalty variant differs by {gap:.3e}")
    assert gap > 1e-3


def test_psi_gradient_error_names_the_field():
    with pytest.raises(ValueError, match="psi_gradient"):
        _regime_problem("pretrained", psi_gradient="code")
