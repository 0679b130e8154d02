"""The fast lane's smoke runs: every family end to end through the CLI at smoke size (a few rounds, tiny data).

``bash scripts/test.sh -m fast`` runs these with the core unit tests (tests/conftest.py lists the fast modules);
the full suite stays in CI."""

from __future__ import annotations

import json
import math

import pytest

from fedsolve.cli import main

pytestmark = pytest.mark.fast

DIGITS = """\
name: smoke
seeds: [0]
data: {{dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {{alpha: 0.5, min_size: 20}}}}
model: {{name: mlp, params: {{hidden: [8]}}, personalization: output}}
simulation: {{rounds: 2, eval_every: 1, sampling: {{clients_per_round: 3}}}}
defaults: {{lr: 0.05, local_epochs: 1, batch_size: 32}}
algorithm: {{name: {name}}}
"""

SMOKE = {
    "classic": DIGITS.format(name="fedavg"),
    "personalized": DIGITS.format(name="fedapm"),
    "clustered": DIGITS.format(name="fpfc"),
    "constrained": """\
name: smoke
seeds: [0]
data: {dataset: breast_cancer, num_clients: 3}
problem: {kind: constrained_qp, params: {d: 5, m: 1, instance_seed: 3}}
simulation: {rounds: 4, eval_every: 2, sampling: {fraction: 1.0}, metrics: []}
algorithm: {name: proxal, params: {beta: 10.0, s_bar: 1.0, rho: 1.0, q: 0.5}}
""",
    "bilevel": """\
name: smoke
seeds: [0]
data: {dataset: digits, num_clients: 4, partition: dirichlet, partition_params: {alpha: 0.5, min_size: 20}}
model: {name: mlp, params: {hidden: [8]}}
problem: {kind: hyper_representation, params: {upper_fraction: 0.5, lam: 0.1}}
simulation: {rounds: 2, eval_every: 1, sampling: {clients_per_round: 3}}
algorithm: {name: shrofbo, params: {batch_size: 16, r: 10.0}}
""",
    "minimax": """\
name: smoke
seeds: [0]
data: {dataset: toy_domains, num_clients: 3, params: {source_clients: 1, n: 40, n_test: 12}}
problem: {kind: domain_adaptation, params: {loss: dann, features: mlp, feature_dim: 16, hidden: [16], domain_hidden: 16}}
simulation: {rounds: 2, eval_every: 1}
algorithm: {name: fedmm, params: {batch_size: 8, lr: 0.05, lr_psi: 0.05}}
""",
}


@pytest.mark.parametrize("family", sorted(SMOKE))
def test_every_family_runs_end_to_end(tmp_path, family):
    cfg = tmp_path / "smoke.yaml"
    cfg.write_text(SMOKE[family])
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) >= 2 and records[0]["round"] == 0
    numbers = [v for r in records for v in r.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] and "provenance" in json.dumps(summary) or summary.get("commit") is not None
