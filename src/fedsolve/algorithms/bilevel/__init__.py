"""Federated bilevel solvers: SimFBO / ShroFBO (Algorithm 1), the FedNest baselines and FBO-AggITD (a
reconstruction)."""

from fedsolve.algorithms.bilevel import simfbo  # noqa: F401
from fedsolve.algorithms.bilevel import fednest  # noqa: F401,E402
from fedsolve.algorithms.bilevel import aggitd  # noqa: F401,E402
