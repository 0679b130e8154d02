"""A sweep as one batch (engine/sweep.py): runs that differ in seed and step sizes trained together, clients x runs
as rows of one batched call per round; each run's metrics equal its separate run's on the same executor."""

from __future__ import annotations

import pytest
import torch

from fedsolve.data.federated import FederatedData
from fedsolve.engine import Simulation, SimulationConfig
from fedsolve.engine.sweep import SweepTransport, run_sweep
from fedsolve.families import get_algorithm
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem

SIZES = [37, 50, 23, 61, 12, 40]


def problem(seed: int) -> FederatedProblem:
    """A small MLP problem whose data depend on the seed (as a partition does)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    x = torch.randn(n, 1, 5, 5, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    off = torch.cumsum(torch.tensor([0] + SIZES), 0)
    m = len(SIZES)
    data = FederatedData(x, y, off, x[:3 * m], y[:3 * m], torch.arange(0, 3 * m + 1, 3), num_classes=4, name="t")
    return FederatedProblem(data, build_model_fn("mlp", (1, 5, 5), 4, hidden=(7,)))


CFG = SimulationConfig(rounds=4, eval_every=2, executor="batched", metrics=[], sampling={"clients_per_round": 4},
                       work={"variable": "uniform"})


def runs(name: str, extra: dict, transport=None):
    out = []
    for seed in (0, 1):
        for lr in (0.05, 0.2):
            prob = problem(seed)
            algo = get_algorithm(name)({"lr": lr, "batch_size": 10, "local_epochs": 1, **extra}, prob)
            out.append(Simulation(prob, algo, CFG, seed, transport=transport))
    return out


@pytest.mark.parametrize("name,extra", [("fedavg", {}), ("fedprox", {"mu": 0.3, "weight_decay": 0.01}),
                                        ("scaffold", {}), ("fedadmm", {"rho": 0.2})])
def test_each_run_of_a_sweep_gives_its_separate_runs_metrics(name, extra):
    shared = SweepTransport()
    together = runs(name, extra, shared)
    results = run_sweep(together)
    assert shared.batched_rounds == CFG.rounds   # every round was one call for the four runs
    for sim, res in zip(runs(name, extra), results):
        alone = sim.run()
        assert [r["round"] for r in res.history] == [r["round"] for r in alone.history]
        for a, b in zip(res.history, alone.history):
            assert a.keys() == b.keys()
            for k in a:
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (name, k)
        for k in alone.server:
            torch.testing.assert_close(res.server[k], alone.server[k], rtol=1e-5, atol=1e-6)
    assert results[0].history[-1] != results[1].history[-1]   # the step sizes made different runs


def test_a_run_whose_update_is_not_stated_runs_alone_in_the_same_round():
    """Per-FedAvg writes its update with the context: its rounds run on its own executor, the others batched."""
    shared = SweepTransport()
    sims = runs("fedavg", {}, shared)[:2]
    prob = problem(3)
    pfa = get_algorithm("perfedavg")({"lr": 0.05, "batch_size": 10, "variant": "code"}, prob)
    sims.append(Simulation(prob, pfa, CFG.model_copy(update={"executor": "auto"}), 3, transport=shared))
    results = run_sweep(sims)
    assert shared.batched_rounds == CFG.rounds
    alone = Simulation(problem(3), get_algorithm("perfedavg")({"lr": 0.05, "batch_size": 10, "variant": "code"},
                                                               problem(3)),
                       CFG.model_copy(update={"executor": "auto"}), 3).run()
    assert [r["round"] for r in results[2].history] == [r["round"] for r in alone.history]
    for a, b in zip(results[2].history, alone.history):   # the other runs compute at the same time: round-off only
        assert a == {k: pytest.approx(v, rel=1e-6, abs=1e-7) for k, v in b.items()}


def test_a_failing_run_does_not_hang_the_others():
    shared = SweepTransport()
    sims = runs("fedavg", {}, shared)[:3]
    sims[1].algo.cfg.lr = 1e30   # diverges in its first round
    results = run_sweep(sims)
    assert isinstance(results[1], Exception) and "non-finite" in str(results[1])
    assert all(hasattr(results[i], "history") for i in (0, 2))


def test_run_sweep_refuses_simulations_without_a_shared_transport():
    with pytest.raises(ValueError, match="share one SweepTransport"):
        run_sweep(runs("fedavg", {}))


def test_a_sweep_gives_the_same_numbers_bit_for_bit_when_run_again():
    """The runs' threads take turns (a baton): no two compute at once, so thread interleaving cannot move a bit
    and the runs' rows go to the batched call in the order of the runs, not in the order their threads arrive
    (before, that order moved train and test losses in the 8th digit from one sweep to the next)."""
    first = [r.history for r in run_sweep(runs("fedprox", {"mu": 0.3}, SweepTransport()))]
    for _ in range(2):
        assert [r.history for r in run_sweep(runs("fedprox", {"mu": 0.3}, SweepTransport()))] == first
