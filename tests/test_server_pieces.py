"""Server pieces (engine/server.py): FedAvgM, FedAdam, FedYogi and FedAdagrad as a line of config on top of
FedAvg, FedProx and SCAFFOLD, checked against their update rules on a quadratic; DP-FedAvg's clipping and noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsolve.data.federated import FederatedData
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.wrappers import wrap
from fedsolve.families import get_algorithm
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem

SOLVERS = {"fedavg": {}, "fedprox": {"mu": 0.5}, "scaffold": {}}


def quadratic(m: int = 4, d: int = 3, seed: int = 0) -> FederatedProblem:
    """Least squares per client (a quadratic objective), float64, full batches."""
    rng = np.random.default_rng(seed)
    tr, te = [], []
    for i in range(m):
        n = 6 + 2 * i
        x = rng.normal(size=(n, d)) + i * 0.3
        y = x @ rng.normal(size=(d, 1)) + 0.1 * rng.normal(size=(n, 1))
        tr.append((x, y))
        te.append((x[:2], y[:2]))
    data = FederatedData.from_client_arrays(tr, te, task="regression", name="quad", dtype=torch.float64)
    make = build_model_fn("logreg", (d,), 1)
    return FederatedProblem(data, lambda: make().double(), loss="squared_error")


def cfg(rounds: int) -> SimulationConfig:
    return SimulationConfig(rounds=rounds, eval_every=rounds, metrics=[], executor="sequential")


def algo(name: str, prob, wrappers=()):
    params = {"lr": 0.05, "batch_size": None, "local_steps": 3, **SOLVERS[name]}
    return wrap(get_algorithm(name)(params, prob), list(wrappers))


def rule(kind: str, d, s, lr, beta=0.9, b1=0.9, b2=0.99, tau=1e-3):
    """The server step of Hsu et al. 2019 (momentum) and Reddi et al. 2021 Alg. 2 (adam, yogi, adagrad), written
    out here independently of engine/server.py."""
    if kind == "momentum":
        s["v"] = beta * s.get("v", torch.zeros_like(d)) + d
        return lr * s["v"]
    m = b1 * s.get("m", torch.zeros_like(d)) + (1 - b1) * d
    v = s.get("v", torch.full_like(d, tau ** 2))
    if kind == "adam":
        v = b2 * v + (1 - b2) * d * d
    elif kind == "yogi":
        v = v - (1 - b2) * d * d * torch.sign(v - d * d)
    else:
        v = v + d * d
    s["m"], s["v"] = m, v
    return lr * m / (v.sqrt() + tau)


@pytest.mark.parametrize("kind", ["momentum", "adam", "yogi", "adagrad"])
@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_server_optimizer_follows_its_update_rule(name, kind):
    """Each round: the inner solver's average from the current state gives Delta = avg - w; the wrapped run's new
    model is w + (the rule's step from Delta), and everything else is the inner solver's."""
    prob = quadratic()
    lr = 0.7 if kind == "momentum" else 0.05
    wrapped = Simulation(prob, algo(name, prob, [{"kind": "server_opt", "optimizer": kind, "lr": lr}]), cfg(6), 0)
    ref = Simulation(prob, algo(name, prob), cfg(6), 0)
    key = wrapped.algo.averages.key
    state: dict = {}
    for t in range(6):
        before = {k: v.clone() for k, v in ref.server.items()}
        ref.step()
        step = rule(kind, ref.server[key] - before[key], state, lr)
        server = dict(ref.server)
        server[key] = before[key] + step
        ref.set_state(server, ref.clients)
        wrapped.step()
        torch.testing.assert_close(wrapped.server[key], ref.server[key], rtol=1e-12, atol=1e-12)
    assert float((wrapped.server[key] - Simulation(prob, algo(name, prob), cfg(1), 0).server[key]).abs().max()) > 1e-3


def test_momentum_zero_and_unit_lr_is_the_inner_solver():
    prob = quadratic()
    a = Simulation(prob, algo("fedavg", prob, [{"kind": "server_opt", "optimizer": "momentum", "beta": 0.0}]),
                   cfg(5), 0)
    b = Simulation(prob, algo("fedavg", prob), cfg(5), 0)
    for _ in range(5):
        a.step()
        b.step()
    torch.testing.assert_close(a.server["w"], b.server["w"], rtol=1e-13, atol=1e-13)


def test_dp_clips_each_update_and_adds_calibrated_noise():
    prob = quadratic(m=6, d=40)
    clip, z = 0.05, 0.0
    dp = Simulation(prob, algo("fedavg", prob, [{"kind": "dp", "clip": 1e9, "noise_multiplier": 0.0}]), cfg(3), 0)
    plain = Simulation(prob, algo("fedavg", prob), cfg(3), 0)
    for _ in range(3):
        dp.step()
        plain.step()
    torch.testing.assert_close(dp.server["w"], plain.server["w"], rtol=1e-12, atol=1e-12)   # no clip, no noise
    # a small clip: every client's contribution is at most C, so the average moves at most C
    small = Simulation(prob, algo("fedavg", prob, [{"kind": "dp", "clip": clip, "noise_multiplier": z}]), cfg(1), 0)
    w0 = small.server["w"].clone()
    small.step()
    assert float((small.server["w"] - w0).norm()) <= clip * (1 + 1e-9)
    # one client: its update is the raw one scaled to norm C exactly
    one = quadratic(m=1, d=40)
    raw = Simulation(one, algo("fedavg", one), cfg(1), 0)
    cut = Simulation(one, algo("fedavg", one, [{"kind": "dp", "clip": clip, "noise_multiplier": 0.0}]), cfg(1), 0)
    start = raw.server["w"].clone()
    raw.step()
    cut.step()
    d_raw, d_cut = raw.server["w"] - start, cut.server["w"] - start
    assert float(d_raw.norm()) > 2 * clip
    torch.testing.assert_close(d_cut, d_raw * (clip / d_raw.norm()), rtol=1e-10, atol=1e-12)
    # noise: the difference to the noiseless run is Gaussian with std z C (largest sample share)
    noisy = Simulation(prob, algo("fedavg", prob, [{"kind": "dp", "clip": clip, "noise_multiplier": 3.0}]), cfg(1), 0)
    noisy.step()
    n = prob.data.weights.double()
    expected = 3.0 * clip * float(n.max() / n.sum())
    resid = (noisy.server["w"] - small.server["w"]).double()
    assert resid.std().item() == pytest.approx(expected, rel=0.35)
    again = Simulation(prob, algo("fedavg", prob, [{"kind": "dp", "clip": clip, "noise_multiplier": 3.0}]), cfg(1), 0)
    again.step()
    assert torch.equal(again.server["w"], noisy.server["w"])   # the noise is keyed by seed and round


def test_wrappers_refuse_a_solver_without_one_average_and_unknown_fields():
    prob = quadratic()
    local = get_algorithm("local")({"lr": 0.05}, prob)
    with pytest.raises(ValueError, match="local declares none"):
        wrap(local, [{"kind": "server_opt"}])
    with pytest.raises(ValueError, match=r"wrap\.server_opt\.optimizer"):
        wrap(get_algorithm("fedavg")({}, prob), [{"kind": "server_opt", "optimizer": "rmsprop"}])
    with pytest.raises(ValueError, match=r"wrap\[0\]\.kind: unknown 'nope'"):
        wrap(get_algorithm("fedavg")({}, prob), [{"kind": "nope"}])
