"""Federated minimax solvers (FedMM paper, spec fedmm.md): FedMM and the GDA baselines."""

from fedsolve.algorithms.minimax import fedmm, gda  # noqa: F401
