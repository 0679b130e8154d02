"""Federated bilevel solvers: SimFBO / ShroFBO (Algorithm 1), the FedNest baselines and FBO-AggITD (a
reconstruction)."""

from fedsolve.families.bilevel import simfbo  # noqa: F401
from fedsolve.families.bilevel import fednest  # noqa: F401,E402
from fedsolve.families.bilevel import aggitd  # noqa: F401,E402
from fedsolve.families.bilevel import kind  # noqa: F401,E402  (the problem kind)
from fedsolve.families.bilevel.functions import client_problem  # noqa: E402  (the clients' own f_i and g_i)

__all__ = ["client_problem"]
