"""Our vectorized F1 / AUC equal scikit-learn's on random cases (ties included)."""

import numpy as np
import pytest
from sklearn.metrics import f1_score, roc_auc_score

from fedsolve.engine.metrics import macro_ovr_auc, summarize, weighted_f1


@pytest.mark.parametrize("seed", range(8))
def test_weighted_f1_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 5, 60)
    p = np.where(rng.random(60) < 0.5, y, rng.integers(0, 5, 60))
    assert weighted_f1(y, p, 10) == pytest.approx(f1_score(y, p, average="weighted", zero_division=0))


@pytest.mark.parametrize("seed", range(8))
def test_macro_auc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    k = 2 + seed % 4
    y = rng.choice([0, 2, 3, 5, 7][:k], 50)
    prob = rng.random((50, 10)).round(1)  # rounding creates ties
    prob /= prob.sum(1, keepdims=True)
    present = np.unique(y)
    sub = prob[:, present] / prob[:, present].sum(1, keepdims=True)
    ref = roc_auc_score(y, sub[:, 1]) if present.size == 2 else roc_auc_score(y, sub, multi_class="ovr",
                                                                              average="macro", labels=present)
    assert macro_ovr_auc(y, prob) == pytest.approx(ref)
    assert macro_ovr_auc(np.zeros(5, dtype=int), prob[:5]) is None


def test_summarize_spread():
    per = [{"accuracy": a} for a in np.linspace(0, 0.9, 10)]
    s = summarize(per)
    assert s["test_accuracy"] == pytest.approx(0.45)
    assert s["test_accuracy_worst10"] == pytest.approx(0.0)
    assert s["test_accuracy_std"] == pytest.approx(np.std(np.linspace(0, 0.9, 10)))
