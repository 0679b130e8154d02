"""BatchNorm running statistics as federated state (issue 46): kept per client (``buffers: local``, FedBN) or averaged
by the server (``buffers: average``, the default), the same numbers under the sequential and the vectorized
executor, carried by checkpoints and scored with.

The reference model normalizes its raw input first (``bn0``), so the running statistics a client's round must leave
are computed here from that client's own planned minibatches alone (PyTorch's rule: ``r <- 0.9 r + 0.1 stat``, the
unbiased variance); a second BatchNorm layer after a convolution is checked across executors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsolve.core.plans import build_plans
from fedsolve.data.federated import FederatedData
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.buffers import KEY
from fedsolve.families import get_algorithm
from fedsolve.problems import FederatedProblem

SIZES = [10, 13, 7]


class BNNet(nn.Module):
    """BatchNorm on the raw 1x6x6 input, a convolution, BatchNorm, a linear head."""

    GROUPS = {"body": ["bn0.*", "conv.*", "bn1.*"], "head": ["fc.*"]}

    def __init__(self):
        super().__init__()
        self.bn0 = nn.BatchNorm2d(1)
        self.conv = nn.Conv2d(1, 3, 3)
        self.bn1 = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn1(self.conv(self.bn0(x)))).flatten(1))


def bn_data():
    """Three clients whose inputs differ in scale and offset (so their statistics differ), unequal sizes."""
    g = np.random.default_rng(0)
    tr, te = [], []
    for i, n in enumerate(SIZES):
        x = (g.normal(size=(n + 4, 1, 6, 6)) * (1 + i) + 2 * i).astype(np.float32)
        y = g.integers(0, 2, size=n + 4)
        tr.append((x[:n], y[:n]))
        te.append((x[n:], y[n:]))
    return FederatedData.from_client_arrays(tr, te, num_classes=2)


def bn_problem(buffers="local", personal=None):
    return FederatedProblem(bn_data(), BNNet, buffers=buffers, blocks={"personal": [personal]} if personal else {})


def simulate(problem, name="fedavg", executor="sequential", rounds=1, **params):
    algo = get_algorithm(name)({"lr": 0.1, "batch_size": 4, **params}, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds, eval_every=1, executor=executor), seed=0)
    return sim, sim.run()


def expected_stats(problem, algo, sim, start_mean, start_var, start_count):
    """Each client's ``bn0`` statistics after round 0 by PyTorch's rule over its own planned minibatches (the
    engine's plans, drawn again from the run's random streams), from the given start."""
    data = problem.data
    ids = torch.arange(problem.num_clients)
    plans = build_plans(algo.work(0), data.train_offsets, ids, sim.rngs, 0)
    out = []
    for k in range(problem.num_clients):
        mean, var, count = start_mean.clone(), start_var.clone(), int(start_count)
        for phase in plans.values():
            pl = phase.row(k)
            for s in range(pl.active.shape[0]):
                if not bool(pl.active[s]):
                    continue
                rows = pl.idx[s][pl.w[s] > 0]
                x = data.train_x[rows].double()
                mean = 0.9 * mean + 0.1 * x.mean((0, 2, 3))
                var = 0.9 * var + 0.1 * x.var((0, 2, 3), unbiased=True)
                count += 1
        out.append((mean, var, count))
    return out


# ------------------------------------------------------------------ local: each client its own statistics
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_local_buffers_are_each_clients_own_data(executor):
    problem = bn_problem("local")
    sim, _ = simulate(problem, executor=executor)
    exp = expected_stats(problem, sim.algo, sim, torch.zeros(1), torch.ones(1), 0)
    mean, var, count = (sim.clients[KEY + f"bn0.{b}"] for b in ("running_mean", "running_var", "num_batches_tracked"))
    for k, (m, v, c) in enumerate(exp):
        torch.testing.assert_close(mean[k].double(), m, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var[k].double(), v, rtol=1e-5, atol=1e-6)
        assert int(count[k]) == c == -(-SIZES[k] // 4)   # one count per step: an epoch of batches of 4
    assert len({round(float(m), 4) for m in mean}) == 3   # three clients, three different statistics
    assert "buffer:bn0.running_mean" not in sim.server   # nothing of them reaches the server
    # the module's own buffers are never touched: every client starts from them
    assert torch.equal(problem.model.bn0.running_mean, torch.zeros(1))
    assert int(problem.model.bn0.num_batches_tracked) == 0


def test_local_buffers_are_not_communicated():
    problem = bn_problem("local")
    sim, _ = simulate(problem)
    d = problem.layout.dim
    assert sim.ledger.per_round[-1]["up_floats"] == 3 * d and sim.ledger.per_round[-1]["down_floats"] == 3 * d


# ------------------------------------------------------------------ average: the server's weighted mean
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_average_buffers_are_the_weighted_mean_of_the_clients(executor):
    problem = bn_problem("average")
    sim, _ = simulate(problem, executor=executor)
    exp = expected_stats(problem, sim.algo, sim, torch.zeros(1), torch.ones(1), 0)
    w = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
    mean = sum(wk * m for wk, (m, _, _) in zip(w, exp))
    var = sum(wk * v for wk, (_, v, _) in zip(w, exp))
    count = round(float(sum(wk * c for wk, (_, _, c) in zip(w, exp))))
    torch.testing.assert_close(sim.server[KEY + "bn0.running_mean"].double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sim.server[KEY + "bn0.running_var"].double(), var, rtol=1e-5, atol=1e-6)
    assert int(sim.server[KEY + "bn0.num_batches_tracked"]) == count
    assert not any(k.startswith(KEY) for k in sim.clients)   # no client keeps a set of its own
    # every client is scored with the server's statistics
    bufs = sim.eval_buffers()
    assert torch.equal(bufs["bn0.running_mean"], sim.server[KEY + "bn0.running_mean"].expand(3, 1))


def test_average_is_the_default_and_is_counted_in_the_ledger():
    problem = FederatedProblem(bn_data(), BNNet)
    assert problem.buffers == "average"
    sim, _ = simulate(problem)
    d, b = problem.layout.dim, 1 + 1 + 1 + 3 + 3 + 1   # bn0 and bn1: mean, var, count
    assert sim.ledger.per_round[-1]["up_floats"] == 3 * (d + b)


# ------------------------------------------------------------------ both executors, several solvers
@pytest.mark.parametrize("buffers", ["local", "average"])
@pytest.mark.parametrize("name,params,personal", [
    ("fedavg", {}, None),
    ("fedapm", {"local_epochs": 1.0, "rho": 0.1}, "fc.*"),
    ("ditto", {"lam": 0.5}, None),
    ("pfedme", {"inner_steps": 2, "lr": 0.05}, None),
], ids=["fedavg", "fedapm", "ditto", "pfedme"])
def test_sequential_equals_vectorized(buffers, name, params, personal):
    problem = bn_problem(buffers, personal)
    runs = [simulate(problem, name, ex, rounds=2, **params) for ex in ("sequential", "vectorized")]
    (a, ra), (b, rb) = runs
    for k in a.server:
        torch.testing.assert_close(a.server[k], b.server[k], rtol=1e-5, atol=1e-6)
    for k in a.clients:
        torch.testing.assert_close(a.clients[k], b.clients[k], rtol=1e-5, atol=1e-6)
    for x, y in zip(ra.history, rb.history):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), k
    counts = a.eval_buffers()["bn1.num_batches_tracked"]
    assert int(counts.max()) > 0   # the statistics moved


# ------------------------------------------------------------------ scoring and checkpoints
def test_clients_are_scored_with_their_own_buffers():
    """The logged test loss is each client's model in evaluation mode with its own running statistics."""
    problem = bn_problem("local")
    sim, res = simulate(problem)
    params, bufs = sim.eval_params(), sim.eval_buffers()
    model = BNNet()
    losses = []
    for i in range(3):
        model.load_state_dict({**problem.layout.unflatten(params[i]), **{n: v[i] for n, v in bufs.items()}})
        model.eval()
        x, y = problem.data.client_test(i)
        with torch.no_grad():
            losses.append(float(nn.functional.cross_entropy(model(x), y)))
    assert res.history[-1]["test_loss"] == pytest.approx(np.mean(losses), rel=1e-6)


def test_checkpoint_carries_the_buffers(tmp_path):
    problem = bn_problem("local")
    cfg = {"lr": 0.1, "batch_size": 4}
    whole = Simulation(problem, get_algorithm("fedavg")(cfg, problem),
                       SimulationConfig(rounds=3, eval_every=1, executor="sequential"), seed=0)
    whole.run()
    first = Simulation(problem, get_algorithm("fedavg")(cfg, problem),
                       SimulationConfig(rounds=2, eval_every=1, executor="sequential"), seed=0, out_dir=tmp_path)
    first.run()
    again = Simulation(problem, get_algorithm("fedavg")(cfg, problem),
                       SimulationConfig(rounds=3, eval_every=1, executor="sequential"), seed=0, out_dir=tmp_path)
    res = again.run(resume=True)
    for k in whole.clients:
        assert torch.equal(whole.clients[k], again.clients[k]), k
    assert res.history == whole.history


def test_a_bad_buffers_choice_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^buffers: unknown 'global'; allowed: 'average', 'local'$"):
        FederatedProblem(bn_data(), BNNet, buffers="global")


# ------------------------------------------------------------------ the config: model.buffers, a registry ResNet
RESNET = {"name": "bn_resnet", "seeds": [0],
          "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet",
                   "partition_params": {"alpha": 0.5, "min_size": 20}},
          "model": {"name": "cifar_resnet", "params": {"depth": 8, "width": 4, "norm": "batch"}, "buffers": "local"},
          "simulation": {"rounds": 2, "eval_every": 1, "sampling": {"clients_per_round": 3}},
          "defaults": {"lr": 0.05, "local_steps": 3, "batch_size": 16},
          "algorithm": {"name": "fedavg"}}


@pytest.mark.parametrize("buffers", ["local", "average"])
def test_cifar_resnet_with_batchnorm_same_under_both_executors(buffers):
    """``model: {name: cifar_resnet, params: {norm: batch}, buffers: ...}`` from a config: every client's statistics
    moved by its own data (local) or the server's average, the same metrics and states under both executors."""
    import fedsolve

    cfg = {**RESNET, "model": {**RESNET["model"], "buffers": buffers}}
    res = {ex: fedsolve.run(cfg, overrides=[f"simulation.executor={ex}"]) for ex in ("sequential", "vectorized")}
    a, b = (res[ex].simulation for ex in ("sequential", "vectorized"))
    for x, y in zip(res["sequential"].history, res["vectorized"].history):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-5), k
    ba, bb = a.eval_buffers(), b.eval_buffers()
    assert ba.keys() == bb.keys() and len(ba) == 3 * 9   # ResNet-8: stem, 3 blocks x 2, 2 projections
    for k in ba:
        torch.testing.assert_close(ba[k].double(), bb[k].double(), rtol=1e-4, atol=1e-5)
    counts = ba["stem.1.num_batches_tracked"].tolist()
    if buffers == "local":   # 3 of 4 clients a round, 3 steps each: each client counts its own steps
        assert sorted(counts) != [counts[0]] * 4 and set(counts) <= {0, 3, 6}
    else:   # the server's set, 3 steps a round
        assert counts == [6] * 4


def test_a_bad_buffers_choice_in_a_config_exits_2(tmp_path, capsys):
    import yaml

    from fedsolve.cli import main

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**RESNET, "model": {**RESNET["model"], "buffers": "shared"}}))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.buffers" in err[0] and "'average'" in err[0] and "'local'" in err[0], err


# ------------------------------------------------------------------ Flower carries them
@pytest.mark.flower
@pytest.mark.parametrize("buffers", ["local", "average"])
def test_flower_gives_the_simulations_numbers_with_buffers(tmp_path, buffers):
    """The in-memory Flower grid (tests/test_flower_adapter.py): the nodes keep their client's statistics (local)
    or receive the server's (average), and the run's metrics and every node's state equal the simulation's."""
    pytest.importorskip("flwr")
    import yaml

    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record
    from fedsolve.flower.replay import simulate_with_participation
    from tests.test_flower_adapter import _compare, _run

    cfg = {**RESNET, "model": {**RESNET["model"], "buffers": buffers},
           "simulation": {**RESNET["simulation"], "executor": "sequential"}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc = {"experiment": str(path), "wait-for-nodes": 5.0, "round-timeout": 30.0, "eval-timeout": 30.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task, run.participation)
    _compare(hist, res.history)
    for node, ctx in grid.ctx.items():
        rows = from_array_record(ctx.state[STATE]) if STATE in ctx.state else {}
        assert any(k.startswith(KEY) for k in rows) == (buffers == "local")
        for k, v in rows.items():
            assert torch.equal(v, sim.clients[k][node - 100]), k
