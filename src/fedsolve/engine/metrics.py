"""Evaluation: each client's test split scored with the model the algorithm says it uses.

Per-client metrics: loss, accuracy, weighted F1 and macro one-vs-rest AUC (scikit-learn) for
classification (fast numpy versions, checked against scikit-learn in
tests/test_metrics.py); loss and RMSE for regression. They are averaged uniformly over clients, with
the spread across clients (std, mean of the worst 10%).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, vmap


def _outputs(
    problem,
    params: Tensor,
    x_all: Tensor,
    offsets: Tensor,
    ids: list[int],
    vectorized: bool,
    chunk: int = 64,
    buffers: dict[str, Tensor] | None = None,
) -> list[Tensor]:
    """Model outputs (evaluation mode) of each client on its own rows of ``x_all`` (on the device of ``x_all`` and
    ``params``); ``buffers``: each client's BatchNorm running statistics ``{name: [m, ...]}`` (None: the model's)."""
    if x_all.shape[0] == 0:  # no rows at all (e.g. a problem of coefficient rows has no test split): nothing
        return [x_all[:0] for _ in ids]
    model, layout = problem.model, problem.layout
    bufs = buffers or {}
    outs: list[Tensor] = []
    with torch.no_grad(), _eval_mode(model):
        if vectorized:
            f = vmap(lambda p, b, x: functional_call(model, {**layout.unflatten(p), **b}, (x,)))
            for a in range(0, len(ids), chunk):
                cs = ids[a : a + chunk]
                sizes = [int(offsets[i + 1] - offsets[i]) for i in cs]
                T = max(max(sizes), 1)
                idx = torch.zeros(len(cs), T, dtype=torch.long, device="cpu")  # built on the CPU, moved once
                for k, i in enumerate(cs):
                    s = int(offsets[i])
                    idx[k, : sizes[k]] = torch.arange(s, s + sizes[k], device="cpu")
                    idx[k, sizes[k] :] = min(s, max(x_all.shape[0] - 1, 0))  # padding (a client may have none)
                o = f(params[cs], {n: v[cs] for n, v in bufs.items()}, x_all[idx.to(x_all.device)])
                outs.extend(o[k, : sizes[k]] for k in range(len(cs)))
        else:
            for i in ids:
                a, b = int(offsets[i]), int(offsets[i + 1])
                state = {**layout.unflatten(params[i]), **{n: v[i] for n, v in bufs.items()}}
                outs.append(functional_call(model, state, (x_all[a:b],)))
    return outs


@contextlib.contextmanager
def _eval_mode(model):
    """``model`` in evaluation mode inside the block (BatchNorm layers read their running statistics)."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def weighted_f1(y: np.ndarray, pred: np.ndarray, num_classes: int) -> float:
    """Support-weighted F1 from the confusion matrix (equals sklearn ``f1_score(average="weighted")``)."""
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (y, pred), 1)
    tp = np.diag(cm).astype(np.float64)
    support = cm.sum(1).astype(np.float64)
    predicted = cm.sum(0).astype(np.float64)
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    return float((f1 * support).sum() / max(support.sum(), 1.0))


def _binary_auc(score: np.ndarray, pos: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (equals sklearn ``roc_auc_score``)."""
    from scipy.stats import rankdata

    r = rankdata(score)
    n1 = int(pos.sum())
    n0 = pos.size - n1
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def macro_ovr_auc(y: np.ndarray, prob: np.ndarray) -> float | None:
    """Macro one-vs-rest AUC over the classes present in ``y`` (probabilities renormalized over them).

    Equals sklearn ``roc_auc_score(y, prob[:, present] / sum, multi_class="ovr", average="macro")``;
    ``None`` when fewer than two classes are present.
    """
    present = np.unique(y)
    if present.size < 2:
        return None
    sub = prob[:, present]
    sub = sub / sub.sum(1, keepdims=True)
    if present.size == 2:
        return _binary_auc(sub[:, 1], y == present[1])
    return float(np.mean([_binary_auc(sub[:, k], y == c) for k, c in enumerate(present)]))


def client_metrics(problem, out: Tensor, y: Tensor, which: tuple[str, ...]) -> dict[str, float]:
    res: dict[str, float] = {}
    if y.numel() == 0:
        return res
    res["loss"] = float(problem.loss_fn(out, y).mean())
    if problem.data.task == "regression":
        res["rmse"] = math.sqrt(float((out.reshape(y.shape[0], -1) - y.reshape(y.shape[0], -1)).pow(2).mean()))
        return res
    pred = out.argmax(-1)
    yt = y.cpu().numpy()
    res["accuracy"] = float((pred == y).float().mean())
    if "f1" in which:
        res["f1"] = weighted_f1(yt, pred.cpu().numpy(), out.shape[-1])
    if "auc" in which:
        auc = macro_ovr_auc(yt, torch.softmax(out.double(), -1).cpu().numpy())
        if auc is not None:
            res["auc"] = auc
    return res


def summarize(per_client: list[dict[str, float]], prefix: str = "test_") -> dict[str, float]:
    """Uniform mean over clients, plus std and worst-10% mean of accuracy / rmse."""
    keys = sorted({k for d in per_client for k in d})
    out: dict[str, float] = {}
    for k in keys:
        vals = np.array([d[k] for d in per_client if k in d and np.isfinite(d[k])], dtype=np.float64)
        if vals.size == 0:
            continue
        out[prefix + k] = float(vals.mean())
        if k in ("accuracy", "rmse", "f1"):
            out[prefix + k + "_std"] = float(vals.std())
            n10 = max(1, math.ceil(0.1 * vals.size))
            worst = np.sort(vals)[:n10] if k != "rmse" else np.sort(vals)[-n10:]
            out[prefix + k + "_worst10"] = float(worst.mean())
    return out


def evaluate(
    problem,
    params: Tensor,
    vectorized: bool | None = None,
    which: tuple[str, ...] = ("f1", "auc"),
    split: str = "test",
    ids: list[int] | None = None,
    buffers: dict[str, Tensor] | None = None,
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Score every client ``i`` with ``params[i]`` on its ``split``; returns (summary, per-client). ``ids``: only
    these clients (``params`` still has a row per client of the problem), per-client metrics in their order.
    ``vectorized``: all clients' outputs in one ``vmap`` call (None: where the problem's model allows it).
    ``buffers``: the BatchNorm running statistics client ``i`` is scored with, ``{name: [m, ...]}`` (None: the
    model's own)."""
    if vectorized is None:
        vectorized = problem.vmappable
    d = problem.data
    x, y, off = (d.test_x, d.test_y, d.test_offsets) if split == "test" else (d.train_x, d.train_y, d.train_offsets)
    ids = list(range(d.num_clients)) if ids is None else [int(i) for i in ids]
    outs = _outputs(problem, params, x, off, ids, vectorized, buffers=buffers)
    if x.device.type != "cpu":  # scored on the CPU: one transfer, not several per client
        outs = list(torch.cat(outs).cpu().split([o.shape[0] for o in outs])) if outs else outs
        y = y.cpu()
    per = [client_metrics(problem, o, y[int(off[i]) : int(off[i + 1])], which) for i, o in zip(ids, outs)]
    return summarize(per, prefix=split + "_"), per
