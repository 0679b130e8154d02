"""Problem kinds: importing this package registers every family's problem builder.

A config selects one with ``problem: {kind: <name>, params: {...}}``; the builder (registered with
``fedsolve.problems.register_problem_kind``) turns the plain problem built from the config's ``data`` and
``model`` sections into the family's problem. One module per family.
"""

from fedsolve.problem_kinds import bilevel  # noqa: F401,E402
from fedsolve.problem_kinds import minimax  # noqa: F401,E402
from fedsolve.problem_kinds import constrained  # noqa: F401,E402

from fedsolve.problems import PROBLEM_KINDS, ProblemBuilder  # noqa: E402


def get_problem_kind(name: str) -> ProblemBuilder:
    """The builder registered as ``name`` (every family's module above is imported with this package)."""
    try:
        return PROBLEM_KINDS[name]
    except KeyError:
        raise ValueError(f"problem.kind: unknown {name!r}; allowed: {sorted(PROBLEM_KINDS)}") from None
