"""Clustered / personalized FL baselines of the FPFC paper (spec fpfc.md 4.2, 2.15, 2.16), one module each
(``ifca``, ``cfl``, ``pacfl``, ``perfedavg``: Per-FedAvg and LG as the FPFC code runs it; ``common``: the read-out
CFL and PACFL share).

* **IFCA** (Ghosh et al. 2020): L cluster models (L told); each selected client scores every cluster
  model on its full training set (a ``Work`` phase with ``batch_size=None``), picks the lowest loss,
  trains it locally and uploads it with its one-hot choice; cluster l becomes the mean of the
  uploads of the clients that chose l (``normalize='assigned'``, correct). The FPFC reference code
  divides the sum of updates by the number of *sampled* clients (``normalize='sampled'``, a bug that
  shrinks small clusters' steps); exposed as an option to reproduce the paper's numbers.
* **CFL** (Sattler et al. 2021): FedAvg inside clusters (n_i-weighted updates); a cluster with
  ||mean update|| < eps1 and max ||update_i|| > eps2, more than 2 members and round > warmup is split
  in two by complete-linkage agglomerative clustering of the members' latest updates on cosine
  distance (code: eps1 = 0.5, eps2 = 1 on synthetic; 0.05, 0.1 on MNIST).
* **PACFL** (Vahidian et al. 2023): one shot before training. Each client sends the top ``n_basis``
  left singular vectors of its (per-class) data matrices; proximity(i, j) = min over basis pairs of
  arccos(u_a^T u_b) in degrees (the authors' ``calculating_adjacency``); agglomerative clustering that
  stops when the closest pair is farther than ``threshold`` (alpha: 4 synthetic, 2 MNIST); then FedAvg
  within each cluster. The authors' "average" linkage replaces the two merged rows by their plain mean,
  which is WPGMA (scipy ``weighted``, our default ``linkage``), not UPGMA (scipy ``average``).
* **Per-FedAvg** (Fallah et al. 2020): ``variant='fo'`` first-order MAML local steps
  (w' = w - alpha g(w); w <- w - beta g(w')); ``variant='code'``: FedAvg local steps (what the FPFC
  reference code does). Evaluation: every device adapts the current global model before it is scored
  (``eval_model`` states the adaptation, ``work(None)`` plans it): one full-batch GD step of size ``alpha``, as
  Fallah et al. and the reference code's synthetic scripts do after every aggregation, or ``adapt_epochs`` epochs
  of SGD (its label-swap scripts).

LG-FedAvg lives in ``families/personalized/baselines.py``; on a one-layer model it has no lower layer to keep local,
and the FPFC reference code's "LG" is FedAvg with every device scored before the aggregation
(``lg_code``, :class:`LGCode`). The clustering methods report ``num_clusters`` and ``ari``. Each solver declares
its ``attack_surface`` (the upload key of its model, the message key an attacker ignoring the server fills with its
own model) for the ``attack`` wrapper (``byzantine.py``).

Newcomers (FPFC Sec. 6.4.2 / Table 3: "each method's own procedure"; the rules are in
``fedsolve.families.clustered.protocols.newcomers``):
IFCA, the cluster model with the lowest training loss; CFL, Sattler et al.'s parameter tree (the
newcomer walks the recorded splits from the root, moving to the side whose members' updates its own
update resembles more); PACFL, the PACFL code's unseen-client rule (one-shot clustering of all
signatures, the cluster's model, one round of local training); Per-FedAvg, the global model and its
one-step adaptation; LG (``lg_code``), the global model after one round of local training.
"""

from fedsolve.families.clustered.baselines.cfl import CFL, CFLConfig
from fedsolve.families.clustered.baselines.common import ClusterModels, clustering_report
from fedsolve.families.clustered.baselines.ifca import IFCA, IFCAConfig
from fedsolve.families.clustered.baselines.pacfl import PACFL, PACFLConfig, pacfl_bases, pacfl_clusters, pacfl_proximity
from fedsolve.families.clustered.baselines.perfedavg import LGCode, PerFedAvg, PerFedAvgConfig

__all__ = [
    "CFL",
    "CFLConfig",
    "ClusterModels",
    "IFCA",
    "IFCAConfig",
    "LGCode",
    "PACFL",
    "PACFLConfig",
    "PerFedAvg",
    "PerFedAvgConfig",
    "clustering_report",
    "pacfl_bases",
    "pacfl_clusters",
    "pacfl_proximity",
]
