"""The derivative oracles a bilevel solver uses: torch.func's double backward on any model
(:class:`~fedsolve.families.bilevel.problem.BilevelOracles`) or the MLP head's closed forms
(:class:`~fedsolve.families.bilevel.mlp_oracles.MLPHeadOracles`), picked by :func:`make_oracles`."""

from __future__ import annotations

from fedsolve.families.bilevel.mlp_oracles import MLPHeadOracles
from fedsolve.families.bilevel.problem import BilevelOracles, bilevel_spec
from fedsolve.problems import FederatedProblem


def make_oracles(problem: FederatedProblem, kind: str = "auto") -> BilevelOracles:
    """The bilevel oracles of ``problem``: ``autograd`` (torch.func double backward, any model), ``mlp`` (the
    closed forms of :class:`~fedsolve.families.bilevel.mlp_oracles.MLPHeadOracles`) or ``auto`` (``mlp`` where it
    applies, else ``autograd``); the clients' own functions' oracles where the problem states them
    (``BilevelSpec.functions``)."""
    if kind not in ("auto", "autograd", "mlp"):
        raise ValueError(f"oracles: {kind!r} is not one of 'auto', 'autograd', 'mlp'")
    spec = bilevel_spec(problem)
    if spec.functions is not None and kind != "mlp":
        return spec.functions.oracles(problem, spec)
    if kind == "mlp" or (kind == "auto" and MLPHeadOracles.why_not(problem, spec) is None):
        return MLPHeadOracles(problem, spec)
    return BilevelOracles(problem, spec)
