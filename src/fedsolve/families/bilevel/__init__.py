"""Federated bilevel solvers: SimFBO / ShroFBO (Algorithm 1), the FedNest baselines and FBO-AggITD (a
reconstruction)."""

from fedsolve.families.bilevel import (
    aggitd,  # noqa: F401
    fednest,  # noqa: F401
    kind,  # noqa: F401  (the problem kind)
    quadratic,  # noqa: F401  (the problem kind bilevel_quadratic)
    simfbo,  # noqa: F401
)
from fedsolve.families.bilevel.functions import client_problem

__all__ = ["client_problem"]
