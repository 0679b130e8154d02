"""Executor equivalence, FedAvg = centralized GD identity, FedADMM duals, determinism, resume, divergence."""

import json

import numpy as np
import pytest
import torch

from conftest import make_problem
from fedsolve.families import get_algorithm
from fedsolve.engine.algorithm import shared_mask
from fedsolve.core.executor import Work, build_plans
from fedsolve.core.states import ClientStates
from fedsolve.core.rng import RngStreams
from fedsolve.engine import DivergenceError, Simulation, SimulationConfig
from fedsolve.engine.sampling import SamplingConfig, sample_clients

BASELINES = ["fedavg", "fedprox", "scaffold", "fedadmm", "local"]


def _run(problem, algo_name, executor, rounds=3, seed=0, params=None, sim=None, out_dir=None):
    algo = get_algorithm(algo_name)({"lr": 0.1, "batch_size": 4, **(params or {})}, problem)
    cfg = SimulationConfig(**{"rounds": rounds, "eval_every": 1, "executor": executor,
                              "sampling": {"fraction": 0.5}, **(sim or {})})
    s = Simulation(problem, algo, cfg, seed=seed, out_dir=out_dir)
    res = s.run()
    return s, res


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("name", BASELINES)
def test_sequential_equals_vectorized(name, model):
    problem = make_problem(model)
    s1, r1 = _run(problem, name, "sequential", sim={"work": {"variable": "uniform", "min_fraction": 0.3}})
    s2, r2 = _run(problem, name, "vectorized", sim={"work": {"variable": "uniform", "min_fraction": 0.3}})
    for k in r1.server:
        torch.testing.assert_close(r1.server[k], r2.server[k], rtol=1e-5, atol=1e-6)
    for k in r1.clients:
        torch.testing.assert_close(r1.clients[k], r2.clients[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1.eval_params(), s2.eval_params(), rtol=1e-5, atol=1e-6)
    assert abs(r1.history[-1]["test_accuracy"] - r2.history[-1]["test_accuracy"]) < 1e-6


def test_fedavg_one_full_batch_step_is_centralized_gd():
    """One round of FedAvg, all clients, one full-batch step == one GD step on sum_i (n_i/n) f_i."""
    problem = make_problem("logreg")
    torch.manual_seed(0)
    lr = 0.3
    algo = get_algorithm("fedavg")({"lr": lr, "batch_size": None, "local_steps": 1}, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=1, eval_every=1), seed=3)
    w0 = sim.server["w"].clone()
    res = sim.run()
    d = problem.data
    w = w0.clone().requires_grad_(True)
    out = torch.func.functional_call(problem.model, problem.layout.unflatten(w), (d.train_x,))
    loss = torch.nn.functional.cross_entropy(out, d.train_y)  # mean over all samples = sum_i (n_i/n) f_i
    (g,) = torch.autograd.grad(loss, w)
    torch.testing.assert_close(res.server["w"], w0 - lr * g, rtol=1e-5, atol=1e-6)


def test_fedadmm_keeps_distinct_duals_and_invariance():
    problem = make_problem("logreg", m=8)
    algo = get_algorithm("fedadmm")({"lr": 0.1, "batch_size": 4, "rho": 0.5}, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=1, eval_every=1, sampling={"clients_per_round": 4}),
                     seed=1)
    before = sim.clients.clone()
    ids = sample_clients(sim.cfg.sampling, 8, problem.data.weights, sim.rngs.numpy("sampling", 0))
    sim.run()
    lam = sim.clients["lam"]
    sel = set(ids.tolist())
    for i in range(8):
        if i in sel:
            assert lam[i].abs().sum() > 0
            # dual identity: lam_i = rho (w_i - z^0) after one round from lam = 0
            torch.testing.assert_close(lam[i], 0.5 * (sim.clients["w"][i] - before["w"][i]))
        else:
            assert torch.equal(lam[i], before["lam"][i]) and torch.equal(sim.clients["w"][i], before["w"][i])
    sel_rows = lam[list(sel)]
    assert torch.cdist(sel_rows, sel_rows)[~torch.eye(len(sel), dtype=torch.bool)].min() > 0
    # server: z = mean over all m of the latest u_i = w_i + lam_i / rho (stale for non-selected), which the server
    # keeps as a running sum, not as an [m, d] table
    u = sim.clients["w"] + sim.clients["lam"] / 0.5
    torch.testing.assert_close(sim.server["z"], u.mean(0))
    assert set(sim.server) == {"z", "usum"} and sim.server["usum"].shape == sim.server["z"].shape


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_fedadmm_running_sum_is_the_mean_of_every_clients_latest_upload(weighting):
    """After several partial rounds z = sum_i w_i u_i / sum_i w_i over ALL m clients' latest u_i = w_i + lam_i/rho
    (the running sum is float64; the states float32)."""
    problem = make_problem("logreg", m=8)
    algo = get_algorithm("fedadmm")({"lr": 0.1, "batch_size": 4, "rho": 0.5, "weighting": weighting}, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=5, eval_every=5, sampling={"clients_per_round": 3}),
                     seed=2)
    sim.run()
    u = (sim.clients["w"] + sim.clients["lam"] / 0.5).double()
    w = torch.ones(8, dtype=torch.float64) if weighting == "uniform" else algo.client_weights.double()
    torch.testing.assert_close(sim.server["z"].double(), (w @ u) / w.sum(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_determinism_same_seed_same_metrics(executor):
    a = _run(make_problem("mlp"), "scaffold", executor, rounds=3, seed=5)[1].history
    b = _run(make_problem("mlp"), "scaffold", executor, rounds=3, seed=5)[1].history
    c = _run(make_problem("mlp"), "scaffold", executor, rounds=3, seed=6)[1].history
    strip = lambda h: [{k: v for k, v in r.items() if k != "time_s"} for r in h]
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_resume_gives_same_metrics(tmp_path):
    problem = make_problem("mlp")
    full = _run(problem, "fedadmm", "auto", rounds=6, seed=2, sim={"eval_every": 2})[1]
    # interrupted run: 4 rounds with checkpoints, then resume to 6
    algo = get_algorithm("fedadmm")({"lr": 0.1, "batch_size": 4}, problem)
    cfg = SimulationConfig(rounds=4, eval_every=2, sampling={"fraction": 0.5})
    Simulation(problem, algo, cfg, seed=2, out_dir=tmp_path).run()
    cfg6 = SimulationConfig(rounds=6, eval_every=2, sampling={"fraction": 0.5})
    algo2 = get_algorithm("fedadmm")({"lr": 0.1, "batch_size": 4}, problem)
    resumed = Simulation(problem, algo2, cfg6, seed=2, out_dir=tmp_path).run(resume=True)
    strip = lambda h: [{k: v for k, v in r.items() if k != "time_s"} for r in h]
    assert strip(resumed.history) == strip(full.history)
    for k in full.server:
        assert torch.equal(full.server[k], resumed.server[k])


def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path):
    problem = make_problem("mlp")
    algo = get_algorithm("fedavg")({"lr": 1e6, "batch_size": 4}, problem)
    cfg = SimulationConfig(rounds=30, eval_every=1, checkpoint_every=1)
    sim = Simulation(problem, algo, cfg, seed=0, out_dir=tmp_path)
    with pytest.raises(DivergenceError, match="learning rate"):
        sim.run()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in ck["server"].values())
    assert ck["round"] < 30
    assert not list(tmp_path.glob(".checkpoint.pt.*"))  # no half-written temp files


def test_atomic_write_keeps_the_usual_file_mode(tmp_path):
    """Reports and checkpoints are written through a private temp file; the result must not stay 0600."""
    import os
    import stat

    from fedsolve.engine.loop import atomic_write_text

    mask = os.umask(0o022)
    os.umask(mask)
    atomic_write_text(tmp_path / "report.md", "a")
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o666 & ~mask
    (tmp_path / "report.md").chmod(0o640)                     # a mode the user chose is kept
    atomic_write_text(tmp_path / "report.md", "b")
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o640
    assert (tmp_path / "report.md").read_text() == "b" and not list(tmp_path.glob(".report.md.*"))


def test_sampling_modes():
    w = torch.tensor([0.7, 0.1, 0.1, 0.1])
    g = np.random.default_rng(0)
    assert sample_clients(SamplingConfig(clients_per_round=2), 4, w, g).numel() == 2
    assert sample_clients(SamplingConfig(fraction=0.5), 4, w, g).numel() == 2
    assert sample_clients(SamplingConfig(), 4, w, g).tolist() == [0, 1, 2, 3]
    counts = np.zeros(4)
    for t in range(400):
        for i in sample_clients(SamplingConfig(clients_per_round=1, scheme="weighted"), 4, w,
                                np.random.default_rng(t)).tolist():
            counts[i] += 1
    assert counts[0] > 200
    drops = [sample_clients(SamplingConfig(dropout=0.5), 4, w, np.random.default_rng(t)).numel() for t in range(200)]
    assert 1.5 < np.mean(drops) < 2.5
    with pytest.raises(ValueError, match="exceeds"):
        SamplingConfig(clients_per_round=9).count(4)


def test_plans_variable_work_and_epochs():
    offsets = torch.tensor([0, 10, 13, 30])
    ids = torch.tensor([0, 1, 2])
    plans = build_plans({"train": Work(epochs=1, batch_size=4)}, offsets, ids, RngStreams(0), 0)
    p = plans["train"]
    assert p.active.sum(1).tolist() == [3, 1, 5]
    for k, (a, b) in enumerate([(0, 10), (10, 13), (13, 30)]):
        seen = p.idx[k][p.w[k] > 0]
        assert sorted(seen.tolist()) == list(range(a, b))  # one epoch visits every sample once
        torch.testing.assert_close(p.w[k][p.active[k]].sum(1), torch.ones(int(p.active[k].sum())))
    half = build_plans({"train": Work(steps=10, batch_size=4)}, offsets, ids, RngStreams(0), 0,
                       scale=torch.tensor([0.5, 0.1, 1.0]))["train"]
    assert half.active.sum(1).tolist() == [5, 1, 10]


def test_sequential_runs_each_minibatch_without_its_padding(monkeypatch):
    """The sequential executor computes only the weighted rows of a minibatch (the padding that makes a
    vectorized call rectangular carries weight 0), and gets the numbers of the padded computation."""
    from fedsolve.core.executor import Plan

    offsets = torch.tensor([0, 10, 13, 30])
    p = build_plans({"train": Work(epochs=1, batch_size=4)}, offsets, torch.tensor([0, 1, 2]), RngStreams(0), 0)
    lengths = [[p["train"].row(k).length(s) for s in range(5)] for k in range(3)]
    assert lengths == [[4, 4, 2, 0, 0], [3, 0, 0, 0, 0], [4, 4, 4, 4, 1]]

    problem = make_problem("mlp", n_range=(5, 40))
    seen = []
    problem.model.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    work = {"work": {"variable": "uniform", "min_fraction": 0.3}}
    _, trimmed = _run(problem, "fedprox", "sequential", params={"batch_size": 8}, sim=work)
    trimmed_sizes, seen[:] = list(seen), []
    monkeypatch.setattr(Plan, "length", lambda self, step: self.w.shape[-1])   # the padded computation
    _, padded = _run(problem, "fedprox", "sequential", params={"batch_size": 8}, sim=work)
    assert sum(trimmed_sizes) < sum(seen)
    assert max(trimmed_sizes) == 8 and min(trimmed_sizes) < 8
    torch.testing.assert_close(trimmed.server["w"], padded.server["w"], rtol=1e-5, atol=1e-6)
    assert abs(trimmed.history[-1]["test_accuracy"] - padded.history[-1]["test_accuracy"]) < 1e-6


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedadmm"])
def test_shared_only_leaves_personal_block_at_init(name):
    from fedsolve.problems import FederatedProblem
    from fedsolve.models import build_model_fn

    base = make_problem("mlp")
    problem = FederatedProblem(base.data, base.model_fn, blocks={"personal": ["out.*"]})
    algo = get_algorithm(name)({"lr": 0.1, "batch_size": 4, "shared_only": True}, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=2, eval_every=2), seed=0)
    x0 = sim.eval_params()[0].clone()
    sim.run()
    after = sim.eval_params()[0]
    pm = problem.layout.mask("personal")
    # averaging identical personal rows with weights summing to 1 may round in the last bit
    torch.testing.assert_close(after[pm], x0[pm], rtol=0, atol=1e-6)
    assert (after[~pm] - x0[~pm]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="personal"):
        shared_mask(get_algorithm(name)({"shared_only": True}, make_problem("mlp")))


def test_vectorized_buckets_unequal_clients_match_sequential():
    """Full-batch clients of very different sizes are bucketed (no padding to the largest)."""
    from fedsolve.core.executor import VectorizedExecutor

    problem = make_problem("logreg", m=8, n_range=(5, 400))
    ids = torch.arange(8)
    plans = build_plans({"train": Work(steps=3, batch_size=None)}, problem.data.train_offsets, ids, RngStreams(0), 0)
    groups = VectorizedExecutor().buckets(plans, 8)
    assert len(groups) > 1 and sorted(torch.cat(groups).tolist()) == list(range(8))
    s1, r1 = _run(problem, "fedprox", "sequential", params={"batch_size": None, "local_steps": 3})
    s2, r2 = _run(problem, "fedprox", "vectorized", params={"batch_size": None, "local_steps": 3})
    torch.testing.assert_close(r1.server["w"], r2.server["w"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sizes", [(20, 21), (5, 400)])
def test_vectorized_sends_a_broadcast_message_in_once(sizes, monkeypatch):
    """A message that is one server tensor for every client (``expand``, stride 0) enters vmap unbatched (in_dims
    None: its products with the clients' data become one matrix product), in one bucket or several, with the
    sequential executor's numbers."""
    from fedsolve.core import executor as ex

    seen = []
    real = ex.vmap

    def spy(fn, in_dims=0, *a, **k):
        seen.append(in_dims[1])
        return real(fn, in_dims, *a, **k)

    problem = make_problem("mlp", m=8, n_range=sizes)
    params = {"batch_size": None, "local_steps": 2}
    _, r1 = _run(problem, "fedavg", "sequential", params=params)
    monkeypatch.setattr(ex, "vmap", spy)
    _, r2 = _run(problem, "fedavg", "vectorized", params=params)
    assert seen and all(d == {"w": None} for d in seen), seen
    torch.testing.assert_close(r1.server["w"], r2.server["w"], rtol=1e-5, atol=1e-6)


def test_vectorized_upload_computed_from_the_message_alone_is_every_clients_own_row():
    """An upload that depends on the (shared, unbatched) message only comes out of vmap expanded (one row seen K
    times); the executor returns every client's own row, as ``sequential`` does, so it can be written in place."""
    from fedsolve.core.executor import SequentialExecutor, VectorizedExecutor

    class Echo(get_algorithm("fedavg")):  # FedAvg's server, clients that upload half the message
        def local_update(self, state, msg, ctx):
            return {}, {"w": 0.5 * msg["w"]}

    problem = make_problem("logreg", n_range=(20, 21))  # clients of one size: one bucket, vmap's output as it is
    algo = Echo({"lr": 0.1}, problem)
    server, clients = algo.init(problem.init_params(RngStreams(0).torch("init")), RngStreams(0))
    ids = torch.tensor([0, 2, 3])
    msgs = algo.broadcast(server, ids, 0)
    plans = build_plans(algo.work(0), problem.data.train_offsets, ids, RngStreams(0), 0)
    ups = [ex.run(algo, clients.gather(ids), msgs, ids, plans, problem.data, 0)[1]["w"]
           for ex in (SequentialExecutor(), VectorizedExecutor())]
    torch.testing.assert_close(ups[0], ups[1])
    assert ups[1].stride(0) != 0
    ups[1][0].add_(1.0)  # one client's row only
    assert torch.equal(ups[1][1:], ups[0][1:]) and not torch.equal(ups[1][0], ups[0][0])


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_full_batch_plans_are_fixed_and_gathered_once_with_same_numbers(executor, monkeypatch):
    offsets = torch.tensor([0, 10, 13, 30])
    ids = torch.tensor([0, 2])
    full = build_plans({"train": Work(steps=3, batch_size=None)}, offsets, ids, RngStreams(0), 0)["train"]
    mini = build_plans({"train": Work(steps=3, batch_size=4)}, offsets, ids, RngStreams(0), 0)["train"]
    assert full.fixed and not mini.fixed
    assert full.idx.shape == (2, 3, 17) and torch.equal(full.idx[1, 2], torch.arange(13, 30))
    # the one-gather path gives the same numbers as gathering every step
    problem = make_problem("logreg")
    variable = {"work": {"variable": "uniform", "min_fraction": 0.3}}
    _, r_fixed = _run(problem, "fedprox", executor, params={"batch_size": None}, sim=variable)
    from fedsolve.core import executor as ex
    orig = ex.build_plans

    def unfixed(*a, **k):
        plans = orig(*a, **k)
        for p in plans.values():
            p.fixed = False
        return plans
    monkeypatch.setattr(ex, "build_plans", unfixed)
    import fedsolve.engine.loop as loop
    if hasattr(loop, "build_plans"):
        monkeypatch.setattr(loop, "build_plans", unfixed)
    _, r_step = _run(problem, "fedprox", executor, params={"batch_size": None}, sim=variable)
    for k in r_fixed.server:
        torch.testing.assert_close(r_fixed.server[k], r_step.server[k], rtol=0, atol=0)
    assert r_fixed.history[-1]["train_loss"] == r_step.history[-1]["train_loss"]


def test_auto_executor_keeps_large_convolutions_sequential():
    """vmap turns a convolution into a grouped one, slow for large feature maps: ``auto`` runs LeNet on 28x28
    images client by client and on 8x8 images vectorized (the crossover measured in benchmarks/round_time.py)."""
    from fedsolve.core.selection import conv_positions, make_executor
    from fedsolve.data.federated import FederatedData
    from fedsolve.models import build_model_fn
    from fedsolve.problems import FederatedProblem

    def lenet_problem(side):
        x = torch.zeros(4, 1, side, side)
        data = FederatedData(x, torch.zeros(4, dtype=torch.long), torch.tensor([0, 2, 4]), x, torch.zeros(4, dtype=torch.long),
                             torch.tensor([0, 2, 4]), num_classes=10, name="img")
        return FederatedProblem(data, build_model_fn("lenet", data.input_shape, 10))

    big, small = lenet_problem(28), lenet_problem(8)
    assert conv_positions(big) == 28 * 28 and conv_positions(small) == 8 * 8
    assert make_executor("auto", big).name == "sequential"
    assert make_executor("auto", small).name == "vectorized"
    assert conv_positions(make_problem("mlp")) == 0 and make_executor("auto", make_problem("mlp")).name == "vectorized"


def test_context_loss_is_the_loss_of_loss_grad_without_the_gradient():
    """``ctx.loss`` (IFCA scores every cluster model with it) is the forward value of ``ctx.loss_grad``."""
    from fedsolve.core.executor import LocalContext

    problem = make_problem("mlp", n_range=(5, 40))
    data = problem.data
    ids = torch.tensor([1])
    plans = build_plans({"train": Work(epochs=1, batch_size=4)}, data.train_offsets, ids, RngStreams(0), 0)
    ctx = LocalContext(problem, {"train": plans["train"].row(0)}, data.train_sizes[1], data.weights[1], ids[0],
                       data.train_x, data.train_y)
    ctx.eager = True
    x0 = problem.init_params(torch.Generator().manual_seed(0))
    for step in range(2):
        v = ctx.loss(x0, "train", step)
        assert not v.requires_grad
        assert torch.equal(v, ctx.loss_grad(x0, "train", step)[0])


# ------------------------------------------------------------------ the public round API protocols use
def _sim(name="fedavg", rounds=4, **params):
    prob = make_problem()
    algo = get_algorithm(name)({"lr": 0.1, "batch_size": 8, **params}, prob)
    cfg = SimulationConfig(rounds=rounds, eval_every=rounds, sampling={"fraction": 0.5}, metrics=[])
    return Simulation(prob, algo, cfg, seed=3)


def test_step_runs_the_rounds_run_runs():
    a, b = _sim(), _sim()
    a.run()
    calls = []

    class Count:
        def on_round(self, sim, t, info):
            calls.append(t)

    b.callbacks.append(Count())
    while b.round < 4:
        info = b.step()
    assert calls == [0, 1, 2, 3] and info["round"] == 3 and len(b.round_times) == 4
    for k in a.server:
        assert torch.equal(a.server[k], b.server[k]), k
    # explicit participants: only they change (the scheduler's use, e.g. asyncFPFC)
    c = _sim("local")
    before = c.state()[1]["w"].clone()
    c.step(torch.tensor([2]))
    after = c.state()[1]["w"]
    assert not torch.equal(after[2], before[2])
    assert torch.equal(after[[0, 1, 3, 4, 5]], before[[0, 1, 3, 4, 5]])


def test_set_state_and_set_hparams():
    sim = _sim("fpfc", lam=0.3, batch_size=None)
    sim.step()
    server, clients = sim.state()
    saved = ({k: v.clone() for k, v in server.items()}, clients.clone())
    labels_then = sim.algo.cluster_labels(server).copy()
    sim.step()
    sim.set_state(*saved)                                # back to the saved point: no stale cluster cache
    assert (sim.algo.cluster_labels(sim.state()[0]) == labels_then).all()
    sim.set_hparams(lam=0.9, nu=0.5)                     # validated as a whole, setup runs again
    assert sim.algo.cfg.lam == 0.9 and sim.algo.cfg.nu == 0.5
    with pytest.raises(ValueError, match="lam"):
        sim.set_hparams(lam=-1.0)
    with pytest.raises(ValueError, match="xi: 0.5 is not below lam 0.4"):   # the config's own checks
        sim.set_hparams(lam=0.4, xi=0.5)
    with pytest.raises(ValueError, match="set_state: 2 client rows"):
        sim.set_state(server, ClientStates(2))
    assert sim.elapsed > 0


def test_check_round_is_the_one_divergence_check():
    from fedsolve.engine.loop import check_round, eval_due

    srv = {"w": torch.ones(3)}
    assert check_round(0, 2.0, srv, {}, None, None, 10.0) == 2.0          # the first loss becomes the reference
    assert check_round(1, 19.0, srv, {}, None, 2.0, 10.0) == 2.0
    with pytest.raises(DivergenceError, match="round 3: train loss 21 exploded"):
        check_round(2, 21.0, srv, {}, None, 2.0, 10.0)
    with pytest.raises(DivergenceError, match=r"upload:g"):
        check_round(0, 1.0, srv, {"g": torch.tensor([float("nan")])}, None, None, 10.0)
    with pytest.raises(DivergenceError, match=r"\['w'\]"):
        check_round(0, 1.0, {"w": torch.tensor([float("inf")]), "n": torch.tensor([1])}, {}, None, None, 10.0)
    assert check_round(0, 1.0, {"w": torch.tensor([float("inf")]), "R": torch.ones(1)}, {}, ("R",), None, 10.0) == 1.0
    big = {"P": torch.zeros(5000), "w": torch.tensor([1.0, float("nan")])}   # one large entry: checked one by one
    with pytest.raises(DivergenceError, match=r"\['w'\]"):
        check_round(0, 1.0, big, {}, None, None, 10.0)
    big["P"][7] = float("inf")
    with pytest.raises(DivergenceError, match=r"\['P', 'w'\]"):
        check_round(0, 1.0, big, {}, None, None, 10.0)
    huge = {"P": torch.full((5000,), 3e38), "w": torch.full((3,), 3e38)}   # finite, but float32 sums overflow
    assert check_round(0, 1.0, huge, {"u": torch.full((2, 3000), -3e38)}, None, None, 10.0) == 1.0
    huge["P"][4999] = float("-inf")
    with pytest.raises(DivergenceError, match=r"\['P'\]"):
        check_round(0, 1.0, huge, {}, None, None, 10.0)
    cfg = SimulationConfig(rounds=7, eval_every=3)
    assert [d for d in range(1, 8) if eval_due(d, cfg)] == [3, 6, 7]


def test_full_participation_makes_no_generator():
    """Every client without dropout: ids 0..m-1 and the round's generator is never made; otherwise it is."""
    def no_draw():
        raise AssertionError("the generator was made")

    w = torch.ones(5) / 5
    assert sample_clients(SamplingConfig(), 5, w, no_draw).tolist() == [0, 1, 2, 3, 4]
    assert sample_clients(SamplingConfig(scheme="weighted"), 5, w, no_draw).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(AssertionError, match="generator was made"):
        sample_clients(SamplingConfig(dropout=0.2), 5, w, no_draw)
    g = lambda: np.random.default_rng(3)   # noqa: E731
    assert sample_clients(SamplingConfig(clients_per_round=2), 5, w, g).tolist() == \
        sample_clients(SamplingConfig(clients_per_round=2), 5, w, g()).tolist()


#: the layers, bottom up: a module may import its own layer and the ones below it, never one above
LAYERS = (("fedsolve._version", "fedsolve.core", "fedsolve.data", "fedsolve.models", "fedsolve.problems"),
          ("fedsolve.engine",),
          ("fedsolve.families",),
          ("fedsolve.experiments", "fedsolve.flower"),
          ("fedsolve.cli", "fedsolve.__main__"))


def _layer(mod: str) -> int:
    """The layer of module ``mod`` (the bare package ``fedsolve``, whose import runs nothing but ``__version__``
    and a lazy ``run``, counts as the bottom)."""
    best = (-1, 0 if mod == "fedsolve" else len(LAYERS) - 1)
    for i, names in enumerate(LAYERS):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best[0]:
                best = (len(n), i)
    return best[1]


def test_no_import_runs_up_a_layer():
    """core/data/models/problems -> engine -> families -> experiments/flower -> cli: no module imports a layer
    above its own (lazy imports inside functions included), and the package root holds no family module."""
    import ast
    from pathlib import Path

    import fedsolve

    root = Path(fedsolve.__file__).parent
    bad = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        mod = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if mod == "fedsolve":
            continue   # the package root: fedsolve.run is a lazy entry point into experiments
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{mod}: {n}" for n in names if n.startswith("fedsolve") and _layer(n) > _layer(mod)]
    assert not bad, bad
    top = sorted(p.name for p in root.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert top == ["__init__.py", "__main__.py", "_version.py", "cli.py", "core", "data", "engine", "experiments",
                   "families", "flower", "models", "problems.py"], top
