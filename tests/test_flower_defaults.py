"""The Flower transport gives the simulation's metrics with DEFAULT settings, for one solver of each family.

The experiments below set no executor and no thread count: the simulation picks its executor (``auto``: batched,
vectorized or linear kernels) and its thread count as a user's ``fedsolve run`` does, and the deployment (the
real ServerApp and ClientApps over the in-memory grid of test_flower_adapter.py) runs with its default run config.
The server side is the same round body (engine/loop.py), so sampling, aggregation and checks agree exactly; the
nodes update one client each where the simulation batches clients, which rounds floats differently. The tolerance
is the one docs/deployment.md states: every logged metric within 1e-5 relative (1e-7 absolute) after the runs.
"""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="needs the flower extra: pip install -e '.[flower]'")

from test_flower_adapter import _run  # noqa: E402  (the in-memory grid)

from fedsolve.flower.replay import simulate_with_participation  # noqa: E402

pytestmark = [pytest.mark.flower]

#: the tolerance docs/deployment.md states for default settings
REL, ABS = 1e-5, 1e-7

DIGITS = """\
name: defaults_{family}
seeds: [2]
data: {{dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {{alpha: 0.5, min_size: 20}}}}
model: {{name: mlp, params: {{hidden: [8]}}, personalization: output}}
simulation: {{rounds: 5, eval_every: 5, sampling: {{clients_per_round: 3}}}}
defaults: {{lr: 0.05, local_epochs: 1, batch_size: 32}}
algorithm: {{name: {name}}}
"""

FAMILIES = {
    "classic": DIGITS.format(family="classic", name="fedavg"),
    "personalized": DIGITS.format(family="personalized", name="fedapm"),
    "clustered": DIGITS.format(family="clustered", name="fpfc"),
    "constrained": """\
name: defaults_constrained
seeds: [0]
data: {dataset: breast_cancer, num_clients: 3}
problem: {kind: neyman_pearson, params: {dataset: breast_cancer, limit: 200}}
simulation: {rounds: 30, eval_every: 15, sampling: {fraction: 1.0}, metrics: []}
algorithm: {name: proxal, params: {beta: 10.0, s_bar: 1.0, rho: 1.0, q: 0.5}}
""",
    "bilevel": """\
name: defaults_bilevel
seeds: [1]
data: {dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {alpha: 0.5, min_size: 20}}
model: {name: mlp, params: {hidden: [8]}}
problem: {kind: hyper_representation, params: {upper_fraction: 0.5, lam: 0.1}}
simulation: {rounds: 4, eval_every: 2, sampling: {clients_per_round: 3}}
algorithm: {name: simfbo, params: {batch_size: 16, tau_clients: [1, 3, 2, 1], r: 10.0}}
""",
    "minimax": """\
name: defaults_minimax
seeds: [1]
data: {dataset: toy_domains, num_clients: 3, params: {source_clients: 1, n: 40, n_test: 12}}
problem: {kind: domain_adaptation, params: {loss: dann, features: mlp, feature_dim: 16, hidden: [16], domain_hidden: 16}}
simulation: {rounds: 4, eval_every: 2}
algorithm: {name: fedmm, params: {batch_size: 8, lr: 0.05, lr_psi: 0.05}}
""",
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_deployment_gives_the_simulations_metrics(tmp_path, family):
    exp = tmp_path / "exp.yaml"
    exp.write_text(FAMILIES[family])
    rc = {"experiment": str(exp), "wait-for-nodes": 5.0, "round-timeout": 10.0, "eval-timeout": 10.0}
    task, grid, run, hist = _run(rc)
    res, sim = simulate_with_participation(task, executor=task.simulation.executor)   # the config's: auto
    assert task.simulation.executor == "auto"
    assert [r["round"] for r in hist] == [r["round"] for r in res.history]
    for d, s in zip(hist, res.history):
        keys = (set(d) & set(s)) - {"eval_clients"}
        assert {k for k in keys if k.startswith("test_")}, keys
        assert {k: d[k] for k in keys} == {k: pytest.approx(s[k], rel=REL, abs=ABS) for k in keys}, family
    assert hist[-1] != hist[0]   # the runs moved
