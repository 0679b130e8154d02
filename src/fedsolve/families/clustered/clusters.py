"""Cluster read-out shared by the clustered methods (FPFC, IFCA, CFL, PACFL, ...).

* :func:`clusters_from_norms`: the graph ``||theta_ij|| <= nu`` and its connected components (FPFC spec 1.7);
* :func:`cluster_average`: every row replaced by its cluster's n_i-weighted mean;
* :func:`adjusted_rand`: the adjusted Rand index of found clusters against the true ones.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def connected_components(adj: np.ndarray) -> np.ndarray:
    """Component labels (0..L-1, numbered by first member) of a symmetric boolean adjacency matrix."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components as cc

    _, lab = cc(csr_matrix(adj), directed=False)
    # renumber by order of first appearance (stable, readable)
    _, first = np.unique(lab, return_index=True)
    remap = np.empty(lab.max() + 1, dtype=np.int64)
    remap[np.argsort(first)] = np.arange(first.size)
    return remap[lab]


def clusters_from_norms(norms: Tensor, nu: float) -> np.ndarray:
    adj = (norms <= nu).cpu().numpy()
    np.fill_diagonal(adj, True)
    return connected_components(adj)


def cluster_average(W: Tensor, labels: np.ndarray, n: Tensor) -> Tensor:
    """Replace every row by its cluster's n_i-weighted mean (spec 1.7)."""
    lab = torch.as_tensor(labels, dtype=torch.long)
    L = int(lab.max()) + 1
    n = n.to(W.dtype)
    num = torch.zeros(L, W.shape[1], dtype=W.dtype).index_add_(0, lab, n.unsqueeze(1) * W)
    den = torch.zeros(L, dtype=W.dtype).index_add_(0, lab, n)
    return (num / den.unsqueeze(1))[lab]


def adjusted_rand(labels, truth) -> float:
    """Adjusted Rand index of ``labels`` against ``truth`` (Hubert & Arabie 1985), from the pair counts: with
    ``tp`` the pairs together in both, ``tn`` apart in both, ``fp``/``fn`` together in one only,
    ARI = 2 (tp tn - fn fp) / ((tp + fn)(fn + tn) + (tp + fp)(fp + tn)); 1 when no pair disagrees."""
    _, a = np.unique(np.asarray(truth), return_inverse=True)
    _, b = np.unique(np.asarray(labels), return_inverse=True)
    n = int(a.size)
    cont = np.zeros((a.max(initial=-1) + 1, b.max(initial=-1) + 1), dtype=np.int64)
    np.add.at(cont, (a, b), 1)
    same_both = int((cont * (cont - 1)).sum()) // 2  # pairs together in both
    same_truth = int((cont.sum(1) * (cont.sum(1) - 1)).sum()) // 2
    same_labels = int((cont.sum(0) * (cont.sum(0) - 1)).sum()) // 2
    tp, fn, fp = same_both, same_truth - same_both, same_labels - same_both
    tn = n * (n - 1) // 2 - tp - fn - fp
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))
