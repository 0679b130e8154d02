"""Algorithm registry: importing this package registers every solver and baseline."""

from fedsolve.algorithms.base import (ALGORITHMS, Algorithm, AlgorithmConfig, get_algorithm, register,  # noqa: F401
                                     weighted_mean)
from fedsolve.algorithms import (fedavg, fedprox, scaffold, fedadmm, local, personalized, fedapm,  # noqa: F401
                                 fpfc, clustering_baselines, byzantine, bilevel)
from fedsolve.algorithms import minimax  # noqa: F401,E402  (FedMM and the GDA baselines)
from fedsolve.algorithms import constrained  # noqa: F401,E402  (Prox-AL FL and its baselines)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "get_algorithm", "register", "weighted_mean"]
