"""SimFBO / ShroFBO under the Flower adapter (in-process grid of test_flower_adapter.py): same numbers as the
simulation, and each node keeps its persistent tau_i in its own context.state."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="needs the flower extra: pip install -e '.[flower]' (flwr==1.42.0)")

from fedsolve.flower.replay import simulate_with_participation  # noqa: E402
from tests.test_flower_adapter import _compare, _run  # noqa: E402

pytestmark = [pytest.mark.flower]

EXPERIMENT = """\
name: bilevel_flower
seeds: [1]
data: {dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {alpha: 0.5, min_size: 20}}
model: {name: mlp, params: {hidden: [8]}}
problem: {kind: hyper_representation, params: {upper_fraction: 0.5, lam: 0.1}}
simulation: {rounds: 3, eval_every: 2, sampling: {clients_per_round: 3}, executor: sequential}
algorithm: {name: simfbo, params: {batch_size: 16, tau_clients: [1, 3, 2, 1], r: 10.0}}
"""


@pytest.mark.parametrize("name", ["simfbo", "shrofbo"])
def test_bilevel_same_numbers_on_flower(tmp_path, name):
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    rc = {"experiment": str(exp), "overrides": f"algorithm.name={name}", "wait-for-nodes": 5.0,
          "round-timeout": 5.0, "eval-timeout": 5.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    _compare(hist, res.history)
    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record

    for node, ctx in grid.ctx.items():
        rows = from_array_record(ctx.state[STATE]) if STATE in ctx.state else {}
        assert float(rows["tau"]) == [1, 3, 2, 1][node - 100]


@pytest.mark.parametrize("name,rounds", [("fednest", 10), ("lfednest", 4)])
def test_nested_baselines_same_numbers_on_flower(tmp_path, name, rounds):
    """The phase of an outer iteration lives in the server state: the Flower server runs the same phase table."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    rc = {"experiment": str(exp), "wait-for-nodes": 5.0, "round-timeout": 5.0, "eval-timeout": 5.0,
          "overrides": f'algorithm.name={name} algorithm.params={{"batch_size":16,"local_ep":1}} '
                       f'simulation.rounds={rounds} simulation.eval_every=5'}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    _compare(hist, res.history)
    assert int(sim.server["iteration"]) == (1 if name == "fednest" else 2)
    assert sim.algo.phases.current(sim.server) == sim.algo.phases.start


def test_aggitd_same_numbers_on_flower(tmp_path):
    """FBO-AggITD (reconstruction): the sub-loop position lives in the server state, tau_i in each node's state."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT)
    rc = {"experiment": str(exp), "wait-for-nodes": 5.0, "round-timeout": 5.0, "eval-timeout": 5.0,
          "overrides": 'algorithm.name=aggitd algorithm.params={"batch_size":16,"tau_clients":[1,3,2,1],'
                       '"inner_lr":0.05,"outer_lr":0.1} simulation.rounds=4'}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task)
    _compare(hist, res.history)
    assert int(sim.server["iteration"]) == 2 and sim.algo.phases.current(sim.server) == "inner"
    from fedsolve.flower.client import STATE
    from fedsolve.flower.records import from_array_record

    for node, ctx in grid.ctx.items():
        assert float(from_array_record(ctx.state[STATE])["tau"]) == [1, 3, 2, 1][node - 100]
