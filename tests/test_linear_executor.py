"""The engine's ``linear`` executor (core/linear.py) against the sequential executor, per algorithm."""

from __future__ import annotations

import pytest
import torch

from fedsolve.families import get_algorithm
from fedsolve.core.selection import linear_gd_applies
from fedsolve.core.linear import LinearGDExecutor
from fedsolve.data.synthetic import clustered_regression, fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.wrappers import wrap


def s1_small(seed=0):
    return FederatedProblem(fpfc_synthetic("S1", seed=seed, size_scale=0.03), build_model_fn("logreg", (60,), 10))


def regression(seed=0):
    data = clustered_regression(seed=seed, cluster_sizes=(4, 4), dim=3, samples_per_client=60, noise_std=0.1,
                                center_scale=3.0)
    return FederatedProblem(data, build_model_fn("logreg", (3,), 1), loss="squared_error")


CASES = {   # name: full-batch configuration
    "local": dict(lr=0.1, batch_size=None, local_epochs=3, weight_decay=0.01),
    "fedavg": dict(lr=0.1, batch_size=None, local_epochs=3),
    "fedprox": dict(lr=0.1, batch_size=None, local_epochs=3, mu=0.5),
    "cfl": dict(lr=0.1, local_epochs=3, warmup_rounds=2, eps1=10.0, eps2=0.0),
    "pacfl": dict(lr=0.1, local_epochs=3),
    "perfedavg": dict(lr=0.1, local_epochs=3, variant="code", alpha=0.05),
    "lg_code": dict(lr=0.1, batch_size=None, local_epochs=3),
    "fpfc": dict(lam=0.4, local_epochs=3),
    # IFCA scores every cluster model on the client's full batch (ctx.loss: the kernels' losses of all clients)
    "ifca": dict(lr=0.1, num_clusters=3, init="normal", local_epochs=3),
    "fedavg+attack": dict(lr=0.1, batch_size=None, local_epochs=3),
}
#: wrappers around a case's solver (the name before '+')
WRAPS = {"fedavg+attack": [{"kind": "attack", "attack": "sign_flip", "malicious_fraction": 0.25,
                            "attacker_view": "own"}]}


def make(name, prob):
    return wrap(get_algorithm(name.split("+")[0])(CASES[name], prob), WRAPS.get(name))


def _run(prob, name, executor, rounds=6, work=None, kernel="auto"):
    algo = make(name, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=rounds, eval_every=rounds, executor=executor, metrics=[],
                                                  sampling={"fraction": 0.5}, work=work or {},
                                                  linear_kernel=kernel), seed=3)
    res = sim.run()
    return algo, sim, res


def _state(sim):
    out = {k: v for k, v in sim.server.items() if v.is_floating_point()}
    out.update({f"client.{k}": v for k, v in sim.clients.items()})
    return out


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("make,kernel", [(s1_small, "native"), (s1_small, "torch"), (regression, "torch")])
def test_linear_executor_matches_sequential(name, make, kernel):
    prob = make()
    runs = {ex: _run(prob, name, ex, work={"variable": "uniform", "min_fraction": 0.3}, kernel=kernel) for ex in
            ("sequential", "linear")}
    algo_l, sim_l, res_l = runs["linear"]
    assert isinstance(sim_l.executor, LinearGDExecutor) and sim_l.executor.kernel == kernel
    a, b = _state(runs["sequential"][1]), _state(sim_l)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=2e-5, rtol=1e-4), k
    ha, hb = runs["sequential"][2].history[-1], res_l.history[-1]
    assert ha["train_loss"] == pytest.approx(hb["train_loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["local", "fedavg", "cfl", "pacfl", "perfedavg", "fpfc"])
def test_auto_picks_linear_for_full_batch_one_layer_models(name):
    prob = s1_small()
    algo = make(name, prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, metrics=[]), seed=0)
    assert isinstance(sim.executor, LinearGDExecutor)


def test_auto_falls_back_and_explicit_linear_is_refused_with_a_reason():
    prob = s1_small()
    # minibatches: not full-batch GD
    algo = get_algorithm("fedavg")(dict(batch_size=16), prob)
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, metrics=[]), seed=0)
    assert not isinstance(sim.executor, LinearGDExecutor)
    with pytest.raises(ValueError, match="executor: 'linear'.*batch_size null"):
        Simulation(prob, algo, SimulationConfig(rounds=1, metrics=[], executor="linear"), seed=0)
    # Ditto subclasses FedAvg but changes local_update: the inherited GD form must not be used
    ditto = get_algorithm("ditto")(dict(batch_size=None), prob)
    assert not linear_gd_applies(ditto, prob)
    # an algorithm without a GD form (Per-FedAvg's first-order MAML steps)
    per = get_algorithm("perfedavg")(dict(variant="fo"), prob)
    with pytest.raises(ValueError, match="executor: 'linear' does not run perfedavg"):
        Simulation(prob, per, SimulationConfig(rounds=1, metrics=[], executor="linear"), seed=0)
    # IFCA with minibatches: its cluster scores are full-batch losses (the kernels' own), its steps are not full
    # batch, so auto runs it on a generic executor (tests/test_clustering_baselines.py) and linear refuses it
    ifca = get_algorithm("ifca")(dict(lr=0.1, num_clusters=3, init="normal", local_epochs=3, batch_size=16), prob)
    assert not isinstance(Simulation(prob, ifca, SimulationConfig(rounds=1, metrics=[]), seed=0).executor,
                          LinearGDExecutor)
    with pytest.raises(ValueError, match="executor: 'linear' does not run ifca"):
        Simulation(prob, ifca, SimulationConfig(rounds=1, metrics=[], executor="linear"), seed=0)
    # a model that is not one nn.Linear
    mlp = FederatedProblem(prob.data, build_model_fn("mlp", (60,), 10))
    with pytest.raises(ValueError, match="one nn.Linear"):
        Simulation(mlp, get_algorithm("local")(dict(batch_size=None), mlp),
                   SimulationConfig(rounds=1, metrics=[], executor="linear"), seed=0)


def test_full_losses_and_grads_are_the_mean_training_loss_and_its_gradient():
    prob = s1_small()
    ex = LinearGDExecutor(prob, chunk=7)
    ids = torch.tensor([0, 5, 2])
    w = torch.randn(3, prob.layout.dim) * 0.1
    full = ex.full_batch(ids)
    got, grads = full.loss(w), full.grad(w)
    for j, i in enumerate(ids.tolist()):
        x, y = prob.data.client_train(i)
        wj = w[j].clone().requires_grad_(True)
        out = torch.func.functional_call(prob.model, prob.layout.unflatten(wj), (x,))
        loss = torch.nn.functional.cross_entropy(out, y)
        (g,) = torch.autograd.grad(loss, wj)
        loss = loss.detach()
        assert float(got[j]) == pytest.approx(loss.item(), rel=1e-5)
        assert torch.allclose(grads[j], g, atol=1e-6)


def test_linear_baselines_benchmark_smoke():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "linear_baselines.py"
    spec = importlib.util.spec_from_file_location("bench_linear_baselines", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--rounds", "2", "--size-scale", "0.02", "--algorithms", "local", "cfl"])
    assert set(out) == {"local", "cfl"} and all(v > 0 for v in out.values())
