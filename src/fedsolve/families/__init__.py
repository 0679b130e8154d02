"""The problem families, one folder each: its problem kind, its solvers and baselines, its protocols.

* ``classic``: FedAvg, FedProx, SCAFFOLD, FedADMM, Local;
* ``personalized``: FedAPM and the partial-personalization baselines;
* ``clustered``: FPFC (and its protocols: lambda paths, asyncFPFC, newcomers), IFCA, CFL, PACFL, ...;
* ``constrained``: Prox-AL FL, cProx-AL and the unconstrained baselines;
* ``bilevel``: SimFBO / ShroFBO, FedNest, LFedNest, FBO-AggITD;
* ``minimax``: FedMM and the GDA baselines.

Importing this package registers every solver and every problem kind; :func:`get_algorithm` and
:func:`get_problem_kind` look them up by name.
"""

from fedsolve.engine.algorithm import ALGORITHMS, Algorithm, AlgorithmConfig, lookup_algorithm, register
from fedsolve.families import bilevel, classic, clustered, constrained, minimax, personalized  # noqa: F401
from fedsolve.problems import PROBLEM_KINDS, ProblemBuilder


def get_algorithm(name: str) -> type[Algorithm]:
    """The solver registered as ``name`` (every family is imported with this package)."""
    return lookup_algorithm(name)


def get_problem_kind(name: str) -> ProblemBuilder:
    """The problem builder registered as ``name`` (every family is imported with this package)."""
    try:
        return PROBLEM_KINDS[name]
    except KeyError:
        raise ValueError(f"problem.kind: unknown {name!r}; allowed: {sorted(PROBLEM_KINDS)}") from None


__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "get_algorithm", "get_problem_kind", "register"]
