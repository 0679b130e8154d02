"""Partial-personalization baselines (FedAlt, FedSim, FedPer, LG-FedAvg, FedRep, Ditto, pFedMe),
personalization presets, and the two-modality HAR model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsolve.engine.algorithm import ALGORITHMS, fitted_problem
from fedsolve.families.personalized.fedapm import FedAPM
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.personalized.baselines import (Ditto, FedAlt, FedPer, FedRep, FedSim, LGFedAvg, PartialAlgorithm,
                                              PFedMe)
from fedsolve.core.executor import SequentialExecutor, build_plans
from fedsolve.core.rng import RngStreams
from fedsolve.data.federated import FederatedData
from fedsolve.models import LeNet, LogisticRegression, MLP
from fedsolve.models.multimodal import ExplicitGRU, HARClassifier
from fedsolve.families.personalized.blocks import personal_mask, personalization_blocks
from fedsolve.problems import FederatedProblem
from fedsolve.engine import Simulation, SimulationConfig

NEW = ["fedapm", "fedalt", "fedsim", "fedper", "lgfedavg", "fedrep", "ditto", "pfedme", "fedala", "fedcp", "fedrod", "lpproj"]


def blobs(m=4, d=10, k=3, seed=0, sizes=None, double=True, shape=None):
    g = np.random.default_rng(seed)
    centers = g.normal(size=(k, d)) * 2
    tr, te = [], []
    for i in range(m):
        n = sizes[i] if sizes else 24
        y = g.choice(k, size=n + 8, p=g.dirichlet(np.ones(k)))
        x = centers[y] + g.normal(size=(n + 8, d)) + g.normal(size=d)  # client shift
        if shape is not None:
            x = x.reshape(n + 8, *shape)
        tr.append((x[:n], y[:n]))
        te.append((x[n:], y[n:]))
    data = FederatedData.from_client_arrays(tr, te, num_classes=k)
    if double:
        data.train_x, data.test_x = data.train_x.double(), data.test_x.double()
    return data


def mlp_problem(personal="out.*", double=True, **kw):
    data = blobs(double=double, **kw)
    fn = (lambda: MLP(10, 3, hidden=(8,)).double()) if double else (lambda: MLP(10, 3, hidden=(8,)))
    return FederatedProblem(data, fn, blocks={"personal": [personal]} if personal else {})


def sim_for(prob, algo, executor="sequential", **sampling):
    sim = Simulation(prob, algo, SimulationConfig(rounds=1, eval_every=1000, executor=executor,
                                                 sampling=sampling or {}), seed=0)
    sim._t0 = 0.0
    return sim


def run(prob, algo, rounds=3, executor="sequential", **sampling):
    sim = sim_for(prob, algo, executor, **sampling)
    for t in range(rounds):
        sim.run_round(t)
    return sim


# ------------------------------------------------------------------ registry
def test_registered_with_descriptions():
    for name in NEW:
        assert name in ALGORITHMS and ALGORITHMS[name].description


# ------------------------------------------------------------------ presets
def test_presets_from_named_groups():
    assert personalization_blocks(MLP(10, 3), "output")["personal"] == ["out.*"]
    assert personalization_blocks(MLP(10, 3), "input")["personal"] == ["hidden.*"]
    lenet = LeNet((1, 8, 8), 10)
    assert personalization_blocks(lenet, "output")["personal"] == ["fc1.*", "fc2.*"]  # FedAPM's CIFAR CNN
    har = HARClassifier()
    assert personalization_blocks(har, "split_input")["personal"] == ["acc_conv.*"]
    assert personalization_blocks(har, "input")["personal"] == ["acc_conv.*", "gyro_conv.*"]
    with pytest.raises(ValueError, match="empty"):
        personalization_blocks(LogisticRegression(4, 2), "input")
    with pytest.raises(ValueError, match="split_input"):
        personalization_blocks(MLP(10, 3), "split_input")
    with pytest.raises(ValueError, match="allowed"):
        personalization_blocks(MLP(10, 3), "middle")


def test_algorithm_preset_mask_matches_problem_block():
    prob_out = mlp_problem(personal="out.*")
    prob_none = mlp_problem(personal=None)
    assert torch.equal(personal_mask(prob_none, "output"), prob_out.layout.mask("personal"))
    assert not personal_mask(prob_none, "problem").any()
    assert torch.equal(FedPer(None, prob_none).pmask, prob_out.layout.mask("personal"))
    assert torch.equal(LGFedAvg(None, prob_none).pmask, personal_mask(prob_none, "input"))


# ------------------------------------------------------------------ executors and invariance
@pytest.mark.parametrize("name", NEW)
def test_sequential_equals_vectorized(name):
    prob = fitted_problem(ALGORITHMS[name], mlp_problem(sizes=[16, 24, 20, 32]))  # FedCP: its network
    out = []
    for ex in ("sequential", "vectorized"):
        algo = ALGORITHMS[name](dict(lr=0.05, batch_size=8), prob)
        sim = run(prob, algo, 3, ex, clients_per_round=3)
        out.append((sim.server, sim.clients.state_dict(), sim.eval_params()))
    for k in out[0][0]:
        torch.testing.assert_close(out[0][0][k], out[1][0][k], rtol=0, atol=1e-12)
    for k in out[0][1]:
        torch.testing.assert_close(out[0][1][k], out[1][1][k], rtol=0, atol=1e-12)
    torch.testing.assert_close(out[0][2], out[1][2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NEW)
def test_non_selected_clients_bit_identical(name):
    prob = fitted_problem(ALGORITHMS[name], mlp_problem())
    algo = ALGORITHMS[name](dict(lr=0.05, batch_size=8), prob)
    sim = sim_for(prob, algo, clients_per_round=2)
    for t in range(3):
        before = sim.clients.clone()
        ids = sim.run_round(t)["ids"].tolist()
        for k in before.keys():
            for i in range(4):
                if i not in ids:
                    assert torch.equal(before[k][i], sim.clients[k][i]), (k, i)


@pytest.mark.parametrize("cls", [FedAlt, FedSim, FedAPM])
def test_personal_block_never_uploaded_or_averaged(cls):
    prob = mlp_problem()
    algo = cls(dict(lr=0.05, batch_size=8), prob)
    sim = run(prob, algo, 2, clients_per_round=2)
    d_u = int((~prob.layout.mask("personal")).sum())
    assert all(v.numel() == d_u for v in sim.server.values() if v.dim() == 1)
    assert sim.ledger.per_round[-1]["up_floats"] == 2 * d_u
    v = sim.clients["v"]
    assert len({tuple(r.tolist()) for r in v}) > 2  # trained personal heads differ across clients


# ------------------------------------------------------------------ mechanics and configurations
def test_fedalt_phases_touch_only_their_block():
    prob = mlp_problem(sizes=[16, 32, 16, 8])  # 1/n exact in the float32 plan weights
    algo = FedAlt(dict(lr=0.1, batch_size=None, local_steps=3), prob)
    ids = torch.arange(4)
    rows = sim_for(prob, algo).clients.gather(ids)
    u_t = rows["u"][0]
    plans = build_plans(algo.work(), prob.data.train_offsets, ids, RngStreams(0), 0)
    # reference: GD on the personal block at u^t, then on the shared block at v^{t+1}, by hand
    x, y = prob.data.client_train(2)
    full = algo.join(rows["v"][2], u_t).clone()
    from torch.func import functional_call, grad

    f = lambda p: torch.nn.functional.cross_entropy(functional_call(prob.model, prob.layout.unflatten(p), (x,)), y)
    for mask in (algo.pmask, algo.smask):
        for _ in range(3):
            full = full - 0.1 * grad(f)(full) * mask
    new, up, _ = SequentialExecutor().run(algo, rows, algo.broadcast({"u": u_t}, ids, 0), ids, plans, prob.data)
    torch.testing.assert_close(algo.join(new["v"][2], new["u"][2]), full, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(up["z"], new["u"])


def test_fedsim_without_personal_block_is_fedavg():
    prob = mlp_problem(personal=None)
    a = run(prob, FedSim(dict(lr=0.1, batch_size=8), prob), 3, clients_per_round=2)
    b = run(prob, FedAvg(dict(lr=0.1, batch_size=8), prob), 3, clients_per_round=2)
    assert torch.equal(a.server["u"], b.server["w"])


@pytest.mark.parametrize("cls,base,kind,extra", [
    (FedPer, FedSim, "output", {}),
    (LGFedAvg, FedSim, "input", {}),
    (FedRep, FedAlt, "output", dict(personal_epochs=10.0, local_epochs=1.0)),
])
def test_named_baselines_are_configurations(cls, base, kind, extra):
    prob_none = mlp_problem(personal=None)
    data = prob_none.data
    fn = lambda: MLP(10, 3, hidden=(8,)).double()
    prob_kind = FederatedProblem(data, fn, blocks=personalization_blocks(fn(), kind))
    a = run(prob_none, cls(dict(lr=0.1, batch_size=8), prob_none), 2, clients_per_round=2)
    b = run(prob_kind, base(dict(lr=0.1, batch_size=8, **extra), prob_kind), 2, clients_per_round=2)
    assert torch.equal(a.server["u"], b.server["u"]) and torch.equal(a.clients["v"], b.clients["v"])


def test_fedrep_head_epochs():
    prob = mlp_problem()
    w = FedRep(None, prob).work()
    assert w["v"].epochs == 10.0 and w["u"].epochs == 1.0


def test_ditto_global_model_is_fedavg_and_personal_is_pulled():
    prob = mlp_problem(personal=None)
    a = run(prob, Ditto(dict(lr=0.1, batch_size=8, lam=0.5), prob), 3, clients_per_round=2)
    b = run(prob, FedAvg(dict(lr=0.1, batch_size=8), prob), 3, clients_per_round=2)
    assert torch.equal(a.server["w"], b.server["w"])
    far = run(prob, Ditto(dict(lr=0.1, batch_size=8, lam=0.0), prob), 3)
    near = run(prob, Ditto(dict(lr=0.1, batch_size=8, lam=5.0), prob), 3)
    dist = lambda s: float((s.clients["v"] - s.server["w"]).norm(dim=-1).mean())
    assert dist(near) < dist(far)


def test_pfedme_matches_reference_loop():
    prob = mlp_problem(personal=None, sizes=[16, 32, 16, 8])
    cfg = dict(lr=0.05, personal_lr=0.02, lam=3.0, inner_steps=3, batch_size=None, local_steps=2, beta=0.7)
    algo = PFedMe(cfg, prob)
    sim = sim_for(prob, algo)
    w0 = sim.server["w"].clone()
    sim.run_round(0)
    from torch.func import functional_call, grad

    ws = []
    for i in range(4):
        x, y = prob.data.client_train(i)
        f = lambda p: torch.nn.functional.cross_entropy(functional_call(prob.model, prob.layout.unflatten(p), (x,)), y)
        w, th = w0.clone(), w0.clone()
        for _ in range(2):
            for _ in range(3):
                th = th - 0.02 * (grad(f)(th) + 3.0 * (th - w))
            w = w - 0.05 * 3.0 * (w - th)
        torch.testing.assert_close(sim.clients["theta"][i], th, rtol=1e-9, atol=1e-10)
        ws.append(w)
    wts = prob.data.weights.double()
    avg = (torch.stack(ws) * (wts / wts.sum())[:, None]).sum(0)
    # float32 client weights in Algorithm.weighted_mean: ~1e-8 relative
    torch.testing.assert_close(sim.server["w"], 0.3 * w0 + 0.7 * avg, rtol=1e-7, atol=1e-8)


def test_fedavg_shared_only_keeps_personal_block_at_init():
    prob = mlp_problem()
    sim = run(prob, FedAvg(dict(lr=0.1, batch_size=8, shared_only=True), prob), 2)
    x0 = prob.init_params(sim.rngs.torch("init"))
    p = prob.layout.mask("personal")
    assert torch.equal(sim.server["w"][p], x0[p]) and not torch.equal(sim.server["w"][~p], x0[~p])


# ------------------------------------------------------------------ the HAR model
def test_explicit_gru_matches_nn_gru():
    torch.manual_seed(0)
    ref = torch.nn.GRU(4, 6, batch_first=True)
    gru = ExplicitGRU(4, 6)
    gru.load_state_dict({k.replace("_l0", ""): v for k, v in ref.state_dict().items()})
    x = torch.randn(3, 7, 4)
    torch.testing.assert_close(gru(x), ref(x)[0], rtol=1e-5, atol=1e-6)


def test_har_model_federated_split_input():
    data = blobs(m=3, d=6 * 16, k=4, sizes=[12, 8, 10], double=False, shape=(6, 16))
    fn = lambda: HARClassifier(6, 4, conv_channels=(4, 8), d_hid=8, d_head=2, d_att=8, fc_hidden=8)
    prob = FederatedProblem(data, fn, blocks=personalization_blocks(fn(), "split_input"))
    assert prob.vmappable
    out = []
    for ex in ("sequential", "vectorized"):
        algo = FedAPM(dict(lr=0.5, batch_size=4, local_epochs=1.0), prob)
        sim = run(prob, algo, 2, ex)
        out.append(sim.eval_params())
    torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-5)
    assert issubclass(FedAPM, PartialAlgorithm)


# ------------------------------------------------------------------ drift wrapper (Fig. 5 for FedAvg / FedProx)
def _grad_at(prob, x, i):
    """Client i's full-batch cross-entropy gradient at the flat parameters ``x``."""
    model = prob.model_fn()
    prob.layout.load_into(model, x)
    x, y = prob.data.client_train(i)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def test_drift_wrapper_reports_the_shared_block_step_of_each_client():
    """One full-batch step from w^0 with every client taking part: client i moves by -lr grad_i(w^0), so the
    reported local_drift is the mean over clients of lr ||grad_i(w^0)|| on the non-personal parameters; the
    wrapped FedAvg's own numbers are unchanged."""
    from fedsolve.engine.wrappers import wrap

    prob = mlp_problem()
    params = dict(lr=0.3, batch_size=None, local_steps=1)
    plain = run(prob, FedAvg(params, prob), 1)
    wrapped = run(prob, wrap(FedAvg(params, prob), [{"kind": "drift"}]), 1)
    assert torch.equal(plain.server["w"], wrapped.server["w"])
    x0 = prob.init_params(wrapped.rngs.torch("init"))
    shared = ~prob.layout.mask("personal")
    want = np.mean([0.3 * float(_grad_at(prob, x0, i)[shared].norm()) for i in range(prob.num_clients)])
    whole = np.mean([0.3 * float(_grad_at(prob, x0, i).norm()) for i in range(prob.num_clients)])
    got = wrapped.algo.report(wrapped.server, wrapped.clients)["local_drift"]
    assert got == pytest.approx(want, rel=1e-6) and abs(whole - want) > 0.01 * want   # float32 sample weights
    # half the clients a round: the others keep 0 until they take part
    half = run(prob, wrap(FedAvg(params, prob), [{"kind": "drift"}]), 1, fraction=0.5)
    assert int((half.server["drift.last"] > 0).sum()) == 2


def test_drift_wrapper_refuses_parameters_and_solvers_without_a_global_model():
    from fedsolve.engine.wrappers import wrap

    prob = mlp_problem()
    with pytest.raises(ValueError, match=r"wrap\.drift\.clip: not a parameter"):
        wrap(FedAvg({}, prob), [{"kind": "drift", "clip": 1.0}])
    with pytest.raises(ValueError, match="averages one global model"):
        wrap(FedAlt({}, prob), [{"kind": "drift"}])


def test_shared_only_is_honoured_or_refused_by_every_solver_that_takes_it():
    """``shared_only`` (FedAPM's baseline mode: only the shared block trains) is a field of every FedAvg-based config;
    a solver that picks its own trained parts must refuse it (one line), never run as if it were false."""
    import importlib
    import pkgutil

    from pydantic import ValidationError

    import fedsolve.families as fams

    for m in pkgutil.iter_modules(fams.__path__):
        importlib.import_module(f"fedsolve.families.{m.name}")
    checked = []
    for name, cls in sorted(ALGORITHMS.items()):
        if "shared_only" not in cls.Config.model_fields or not cls.__module__.startswith(
                ("fedsolve.families.classic", "fedsolve.families.personalized")):
            continue
        try:
            cls.Config(shared_only=True)
        except ValidationError as e:
            assert "shared_only" in str(e) and "allowed: false" in str(e), name
            checked.append(name)
            continue
        runs = []
        for so in (False, True):
            prob = fitted_problem(cls, mlp_problem())
            runs.append(run(prob, cls(dict(lr=0.05, batch_size=8, shared_only=so), prob), 1).eval_params())
        assert not torch.equal(runs[0], runs[1]), f"{name}: shared_only=true is silently ignored"
        checked.append(name)
    assert {"fedavg", "fedprox", "ditto", "fedala", "fedrod", "fedcp", "pfedme"} <= set(checked), checked
