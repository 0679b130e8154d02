"""Where a tuning grid's pick lies, and how a grid is widened beyond a pick at its edge.

A pick at the smallest or largest value of a numeric grid is not bracketed: a value beyond the grid may be better.
The fair-reporting rule ("the pick is never at the grid's edge") is then met by tuning again on new values beyond
that edge, the same number of values as the grid has (the same budget again), continuing the grid's spacing:
:func:`widen_grid`. ``tune: {widen: k}`` of an algorithm does this up to k times
(:func:`fedsolve.experiments.runner.tune_spec`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any


def is_numeric(grid: Sequence[Any]) -> bool:
    """Every value a number (an int or a float, not a bool)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in grid)


def grid_edge(grid: Sequence[Any], pick: int) -> str | None:
    """``lowest`` or ``highest`` when ``grid[pick]`` is the smallest or largest number of a numeric grid (the grid
    may not bracket the best value: widen it on that side), ``first``/``last`` for the ends of a grid of other
    values, else None."""
    if is_numeric(grid):
        v = grid[pick]
        return "lowest" if v == min(grid) else "highest" if v == max(grid) else None
    return "first" if pick == 0 else "last" if pick == len(grid) - 1 else None


def _spread(xs: list[float]) -> float:
    """How far a list of positive numbers is from constant: its largest over its smallest."""
    return max(xs) / min(xs)


def widen_grid(grid: Sequence[float], side: str, count: int | None = None) -> list[float]:
    """``count`` (default: as many as the grid has) new values beyond the grid's ``side`` (``lowest`` or
    ``highest``), continuing its spacing at that end, nearest first.

    The spacing is geometric (the ratio of the two outermost values on that side) when no value is negative and
    the ratios of the positive values' neighbours vary less than their differences (as much: geometric for a float
    grid, arithmetic for an integer one), else arithmetic (the outermost difference). New values
    never cross zero (zero itself, e.g. lambda = 0, is the edge of a domain of non-negative values: nothing lies
    beyond it); an all-integer grid stays integer (values rounded, repeats dropped). Fewer values come back where
    zero stops the extension; none beyond a zero edge.
    """
    if side not in ("lowest", "highest"):
        raise ValueError(f"side: {side!r}; allowed: 'lowest' or 'highest'")
    g = sorted(float(v) for v in grid)
    if len(g) < 2 or len(set(g)) != len(g):
        raise ValueError(f"grid: {list(grid)}; allowed: at least two distinct numbers")
    integer = all(isinstance(v, int) and not isinstance(v, bool) for v in grid)
    count = len(g) if count is None else count
    edge, inner = (g[0], g[1]) if side == "lowest" else (g[-1], g[-2])
    direction = -1.0 if side == "lowest" else 1.0
    pos = [v for v in g if v > 0]  # a grid that starts at zero (lambda = 0, no fusion) is spaced by the rest
    ratios, diffs = [b / a for a, b in pairwise(pos)], [b - a for a, b in pairwise(pos)]
    geometric = (
        g[0] >= 0
        and len(pos) >= 2
        and (_spread(ratios) < _spread(diffs) or (_spread(ratios) == _spread(diffs) and not integer))
    )
    out: list[float] = []
    k = 0
    while len(out) < count and k < 4 * count:  # integer rounding may repeat a value: a few more steps
        k += 1
        if geometric:
            v = edge * (edge / inner) ** k
        else:
            v = edge + direction * k * abs(edge - inner)
        v = float(round(v)) if integer else float(f"{v:.12g}")
        if edge == 0.0 or (edge > 0 and v <= 0) or (edge < 0 and v >= 0):
            break  # zero is a domain's edge: nothing beyond it
        if v not in out and (v - edge) * direction > 0 and math.isfinite(v):
            out.append(v)
    return [int(v) for v in out] if integer else out
