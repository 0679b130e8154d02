"""Federated minimax solvers (FedMM paper, spec fedmm.md): FedMM and the GDA baselines."""

from fedsolve.families.minimax import fedmm  # noqa: F401
from fedsolve.families.minimax import gda  # noqa: F401
from fedsolve.families.minimax import kind  # noqa: F401,E402  (the problem kind)
