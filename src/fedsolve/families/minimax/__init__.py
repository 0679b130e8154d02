"""Federated minimax solvers (FedMM paper, spec fedmm.md): FedMM and the GDA baselines, the saddle problems they
solve (a function per client, per-client quadratics, objectives on data rows) and adversarial domain adaptation."""

from fedsolve.families.minimax import (
    fedmm,  # noqa: F401
    gda,  # noqa: F401
    kind,  # noqa: F401  (the problem kind)
)
from fedsolve.families.minimax.clients import client_saddle_problem, quadratic_saddle_problem
from fedsolve.families.minimax.problem import adversarial_problem
from fedsolve.families.minimax.saddle import saddle_problem

__all__ = ["adversarial_problem", "client_saddle_problem", "quadratic_saddle_problem", "saddle_problem"]
