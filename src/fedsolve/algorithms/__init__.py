"""Algorithm registry: importing this package registers every solver and baseline."""

from fedsolve.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, get_algorithm, register
from fedsolve.algorithms import (fedavg, fedprox, scaffold, fedadmm, local, personalized, fedapm,  # noqa: F401
                                 fpfc, clustering_baselines, byzantine)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "get_algorithm", "register"]
