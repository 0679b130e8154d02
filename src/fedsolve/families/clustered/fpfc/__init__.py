"""FPFC: clustered federated learning by nonconvex pairwise fusion (Yu, Liu, Wang, Sun; arXiv:2211.04218v3).

Objective (eq. 1/4), f_i a per-device *mean* loss, g~ the smoothed SCAD penalty (eq. 2-3):

    min_w  sum_i f_i(w_i) + (1/(2m)) sum_i sum_j g~(||w_i - w_j||, lam)

solved by inexact ADMM on the split w_i - w_j = theta_ij (eq. 7-8), Algorithm 2 of the paper:

* device i in A_k (local GD, eq. 5):   w <- w - alpha [grad f_i(w) + rho (w - zeta_i)]   (T_i steps)
* server, every unordered pair with i in A_k OR j in A_k (eq. 6):
      delta_ij = w_i - w_j + v_ij/rho;  theta_ij = prox(delta_ij);  v_ij += rho (w_i - w_j - theta_ij)
* server:  zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij/rho)    (row sums kept incrementally)

The prox of the smoothed SCAD penalty (4 branches, spec 2.4) and of the group-lasso penalty (FPFC-l1)
are *radial*: theta = s(||delta||) * delta with a scalar s. Hence v_new/rho = delta - theta =
(1 - s) delta, and the server stores, per pair, only ``delta_ij`` (d floats) and ``s_ij`` (1 float):

    theta_ij = s_ij * delta_ij,   v_ij = rho (1 - s_ij) delta_ij,   theta_ij - v_ij/rho = (2 s_ij - 1) delta_ij

(theta = v = 0 at start <=> delta = 0). Antisymmetry: delta_ji = -delta_ij, s_ji = s_ij.

Server state (a dict of tensors, checkpointable):
    ``W``  [m, d]   latest uploaded model of every device (all blocks)
    ``R``  [m, d_f] row sums  sum_j (theta_ij - v_ij/rho)   (zeta_i = mean_j W_j + R_i / m)
  dense layout (``pair_layout='dense'``):
    ``delta`` [m, m, d_f] (antisymmetric), ``scale`` [m, m]
  sparse layout (``pair_layout='sparse'``): only pairs touched so far, a growing pool
    ``pair_key`` [P] (p*m + q, p < q, in pool order), ``delta`` [P, d_f], ``scale`` [P]

Memory estimate (float32, d_f = fused dimension): dense 4 * m^2 * (d_f + 1) bytes, e.g. m = 100,
d_f = 610: 24.4 MB (the paper's theta + v upper triangle would be 2 * m(m-1)/2 * d_f = 6.0e6 floats,
24.2 MB); m = 1000: 2.4 GB. Sparse: (4 (d_f + 1) + 8) bytes per touched pair: with P touched pairs
that is 4 * P * d_f; P <= m(m-1)/2 (half the dense size once every pair is touched), and
P = k(m - k) + k(k-1)/2 after one round of k participants (useful for large m / few rounds /
newcomers). Both: + 4 * m * (d + d_f) for ``W`` and ``R``.
Server compute per round: O(|A_k| * m * d_f), in tensor operations (no Python loop over pairs).

Options: FPFC-l1 (``penalty='l1'`` or the registered ``fpfc_l1``), last-layer-only fusion (problem
block ``fused``: the rest is averaged FedAvg-style over the participants, spec 2.13), per-device
work (``SimulationConfig.work``), a growing number of local steps (``local_schedule``, Sec. 6.4.4),
all-pairs server updates (``update_pairs='all'``, the proof's convention). The protocols that drive FPFC runs
are schedules in ``fedsolve.families.clustered.protocols``: the warmup lambda path (Sec. 4.3), asyncFPFC
(Algorithm 3); newcomers (Sec. 6.4.2) are a run of their own server. The server rules are here
(``async_server.py``, ``newcomers.py``).

Evaluation (spec 1.7 / 3.1, the reference code's choice): ||theta_ij|| <= nu -> graph -> connected
components; each device is scored with its cluster's n_i-weighted average model
(``eval_with='cluster'``; ``'local'`` uses w_i itself).

Communication: down zeta_i (+ the shared block), up w_i: 2 d per participant and round; the paper's
Cost adds the initial broadcast m * d (``paper_cost``).

Files: ``algorithm.py`` (Algorithm 2), ``penalties.py`` (eq. 2-3 and the prox), ``pairs.py`` (the pair update and
its stores), ``async_server.py`` (asyncFPFC's server), ``newcomers.py`` (the newcomers' server).
The oracle of Theorem 3 and the augmented Lagrangian of Lemma 2 are in ``fedsolve.families.clustered.oracle``.
"""

from fedsolve.families.clustered.clusters import (
    adjusted_rand,
    cluster_average,
    clusters_from_norms,
    connected_components,
)
from fedsolve.families.clustered.fpfc.algorithm import FPFC, FPFCL1, FPFCConfig, FPFCL1Config, paper_cost
from fedsolve.families.clustered.fpfc.async_server import AsyncFPFC
from fedsolve.families.clustered.fpfc.newcomers import FPFCNewcomers
from fedsolve.families.clustered.fpfc.pairs import PAIR_STORES, DensePairs, SparsePairs, pair_step
from fedsolve.families.clustered.fpfc.penalties import penalty_value, prox, prox_scale, scad, smoothed_scad

__all__ = [
    "FPFC",
    "FPFCL1",
    "FPFCConfig",
    "FPFCL1Config",
    "AsyncFPFC",
    "FPFCNewcomers",
    "paper_cost",
    "DensePairs",
    "SparsePairs",
    "PAIR_STORES",
    "pair_step",
    "penalty_value",
    "prox",
    "prox_scale",
    "scad",
    "smoothed_scad",
    "adjusted_rand",
    "cluster_average",
    "clusters_from_norms",
    "connected_components",
]
