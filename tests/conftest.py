"""Shared fixtures: tiny synthetic federated problems that run in milliseconds."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# `auto` picks executors by fixed rules in the tests (no per-machine timing): the same choice on every machine;
# the calibration tests set or clear it themselves
os.environ.setdefault("FEDSOLVE_CALIBRATE", "0")

import numpy as np
import pytest
import torch

from fedsolve.data.federated import FederatedData
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem

torch.set_num_threads(1)


def make_data(m: int = 6, d: int = 5, classes: int = 3, seed: int = 0, n_range=(8, 30),
              dtype=np.float32, image: bool = False) -> FederatedData:
    """Heterogeneous multinomial-logistic data: each client has its own sample count and shift."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, classes))
    tr, te = [], []
    for i in range(m):
        n = int(rng.integers(*n_range))
        x = rng.normal(size=(n + 6, d)) + 0.5 * rng.normal(size=d)
        y = (x @ W + 0.3 * rng.normal(size=(n + 6, classes))).argmax(1)
        x = x.astype(dtype)
        if image:
            x = x.reshape(-1, 1, 1, d)
        tr.append((x[:n], y[:n]))
        te.append((x[n:], y[n:]))
    return FederatedData.from_client_arrays(tr, te, num_classes=classes, name="tiny")


def make_problem(model: str = "logreg", m: int = 6, seed: int = 0, **kw) -> FederatedProblem:
    data = make_data(m=m, seed=seed, **kw)
    return FederatedProblem(data, build_model_fn(model, data.input_shape, data.num_classes,
                                                 **({"hidden": (7,)} if model == "mlp" else {})))


@pytest.fixture
def tiny_problem():
    return make_problem()


def suite_dataset(path) -> str:
    """The ``data.dataset`` of an experiment YAML."""
    import yaml

    with open(path) as fh:
        return yaml.safe_load(fh)["data"]["dataset"]


def suite_param(path, real: set[str]):
    """``pytest.param`` for a suite YAML, marked ``realdata`` when its dataset is fetched."""
    marks = [pytest.mark.realdata, pytest.mark.slow] if suite_dataset(path) in real else []
    return pytest.param(path, id=path.stem, marks=marks)


#: the fast lane (``bash scripts/test.sh -m fast``, under 3 minutes on 2 cores): the engine's and the core's unit
#: tests, the structural limits, and every family end to end at smoke size (test_smoke_families.py); their slow
#: cases stay out. The full suite runs in CI.
FAST_MODULES = {"test_architecture", "test_smoke_families", "test_core", "test_engine", "test_plans",
                "test_server_pieces", "test_sweep", "test_states_readonly", "test_metrics", "test_context_blocks", "test_lint"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in FAST_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)
