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


#: the key of ``FederatedProblem.extras`` that each structured family's problem kinds set, and the family
STRUCTURES = {"constraints": "constrained", "bilevel": "bilevel", "minimax": "minimax"}


def family_of(cls: type[Algorithm]) -> str | None:
    """The family a solver belongs to: its ``family`` class attribute where it sets one (a solver of one's own,
    registered with ``--import``), else the package under ``fedsolve.families`` that defines it."""
    declared = getattr(cls, "family", None)
    if declared is not None:
        return declared
    parts = cls.__module__.split(".")
    return parts[2] if parts[:2] == ["fedsolve", "families"] and len(parts) > 2 else None


def check_fits(cls: type[Algorithm], problem) -> None:
    """A ValueError naming ``algorithm.name`` when ``problem`` carries a structured family's problem (constraints,
    a bilevel split, a minimax game: :data:`STRUCTURES`) and the solver ``cls`` belongs to another family, which
    would train on the plain data and ignore it; the message lists the solvers of that family."""
    for key, fam in STRUCTURES.items():
        if key in getattr(problem, "extras", {}) and family_of(cls) != fam:
            fits = sorted(n for n, c in ALGORITHMS.items() if family_of(c) == fam)
            raise ValueError(
                f"algorithm.name: {cls.name!r} is not a {fam} solver, it would ignore the problem's "
                f"{fam} structure (problem.kind); allowed: {fits}"
            )


def get_problem_kind(name: str) -> ProblemBuilder:
    """The problem builder registered as ``name`` (every family is imported with this package)."""
    try:
        return PROBLEM_KINDS[name]
    except KeyError:
        raise ValueError(f"problem.kind: unknown {name!r}; allowed: {sorted(PROBLEM_KINDS)}") from None


__all__ = [
    "ALGORITHMS",
    "STRUCTURES",
    "Algorithm",
    "AlgorithmConfig",
    "check_fits",
    "family_of",
    "get_algorithm",
    "get_problem_kind",
    "register",
]
