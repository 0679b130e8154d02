"""Federated bilevel solvers: SimFBO / ShroFBO (Algorithm 1) and the FedNest baselines."""

from fedsolve.algorithms.bilevel import simfbo  # noqa: F401
from fedsolve.algorithms.bilevel import fednest  # noqa: F401,E402
