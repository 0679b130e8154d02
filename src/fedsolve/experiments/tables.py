"""The tables of a suite's report: a metric of the suite's rows pivoted to rows x columns, mean +- sample SD over
the seeds (or a count, the worst seed, a relative difference to a reference row), next to the paper's numbers.

:class:`TableSpec` is one table of a suite YAML's ``tables``; :func:`table_lines` renders it as markdown from the
rows a suite's cells returned (``fedsolve.experiments.suite``). :func:`lead_sentence` is the sentence a compare
report opens with: the best method on one metric and its margin over the runner-up, against the seeds' spread.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: metrics where lower is better (a name containing one of these, or a spread ``_std``)
LOWER_IS_BETTER = ("loss", "rmse", "deviation", "residual", "time", "bytes", "violation", "kkt")
# metrics with no better direction: a cluster count is good when it is the true one, which a run does not
# know, so it has no "best" over rounds and is never marked best in a report; a constrained problem's objective
# is only comparable between feasible points (an unconstrained baseline's is lower), and iteration counts and
# the stopping flag describe a run rather than score it
NO_DIRECTION = frozenset({"num_clusters", "objective", "outer_iterations", "admm_rounds", "converged"})


def has_direction(metric: str) -> bool:
    return metric not in NO_DIRECTION


def lower_is_better(metric: str) -> bool:
    """Loss-like metrics, spreads (``_std``), costs: lower is better; accuracy-like: higher."""
    return metric.endswith("_std") or any(k in metric for k in LOWER_IS_BETTER)


class TableSpec(BaseModel):
    """One table of the report: ``metric`` of the rows, pivoted to ``rows`` x ``columns`` (one table per value
    of ``split``), mean +- std over the seeds; ``paper``: the paper's numbers by row label (or
    ``{row: {column: value}}``), shown next to ours."""

    model_config = ConfigDict(extra="forbid")
    metric: str = Field(..., description="the row field the table reports (e.g. test_accuracy)")
    rows: str = Field("algorithm", description="the field whose values are the table's rows")
    columns: str | None = Field(None, description="the field whose values are the columns (null: one column)")
    split: str | None = Field(None, description="one table per value of this field (e.g. attack)")
    title: str | None = Field(None, description="heading (default: the metric)")
    percent: bool = Field(False, description="show values x 100 with a % sign")
    digits: int = Field(2, ge=0, le=8, description="decimals shown")
    paper: dict[str, Any] = Field(default_factory=dict, description="the paper's numbers by row label")
    over: str | None = Field(None, description="reduce each seed's rows over this field first (e.g. round)")
    pick: Literal["best", "last"] = Field(
        "best",
        description="with `over`: the best value (max; min for a loss-like metric) or the one at the largest `over`",
    )
    relative_to: str | None = Field(
        None,
        description="report |value - ref| / |ref| per seed, ref = the row with "
        "this label in the same column, split and seed (e.g. "
        "cProx-AL), then mean +- std over the seeds",
    )
    only: list[str | int | float] | None = Field(None, description="only these rows, in this order (null: all)")
    stat: Literal["mean", "count", "max"] = Field(
        "mean",
        description="mean: mean +- std over the seeds; count: how "
        "many seeds have a nonzero value, as k/N (e.g. "
        "converged); max: the largest (worst seed)",
    )
    notation: Literal["fixed", "sci"] = Field(
        "fixed", description="fixed: `digits` decimals; sci: `digits` decimals of a power of ten (1.2e-03)"
    )

    @model_validator(mode="after")
    def _relative_count(self):
        if self.relative_to is not None and self.stat == "count":
            raise ValueError(
                "relative_to: a relative difference is a number, not a count; allowed with stat: mean only"
            )
        return self


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _fmt(t: TableSpec, vals: list[float], n: int | None = None) -> str:
    """One table cell: k/N, the largest value, or the mean +- the sample SD (n - 1 in the denominator) of
    ``vals``, with ``(n = k)`` where their number is not ``n`` (the table's number of seeds)."""
    if not vals:
        return "-"
    if t.stat == "count":
        return f"{sum(1 for v in vals if v)}/{len(vals)}"
    scale, pct = (100.0, "%") if t.percent else (1.0, "")
    spec = f".{t.digits}{'e' if t.notation == 'sci' else 'f'}"
    if t.stat == "max":
        return f"{max(vals) * scale:{spec}}{pct}"
    m = statistics.mean(vals) * scale
    count = f" (n = {len(vals)})" if n is not None and len(vals) != n else ""
    if len(vals) == 1:
        return f"{m:{spec}}{pct}{count}"
    return f"{m:{spec}}{pct} +- {statistics.stdev(vals) * scale:{spec}}{count}"


def _paper(t: TableSpec, v) -> str:
    if v is None:
        return ""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{100 * v:.{t.digits}f}%" if t.percent else f"{v:g}"
    return str(v)


def _values(t: TableSpec, rows: list[dict]) -> list[float]:
    """The values a table cell averages: ``t.metric`` of each row, or with ``t.over`` one value per seed (the
    best over ``t.over``, or the one at its largest value)."""
    if t.over is None:
        return [x for x in (_num(r.get(t.metric)) for r in rows) if x is not None]

    out = []
    for seed in dict.fromkeys(r.get("seed") for r in rows):
        mine = [r for r in rows if r.get("seed") == seed and _num(r.get(t.metric)) is not None]
        if not mine:
            continue
        if t.pick == "last":
            out.append(float(max(mine, key=lambda r: r[t.over])[t.metric]))
        else:
            vals = [float(r[t.metric]) for r in mine]
            out.append(min(vals) if lower_is_better(t.metric) else max(vals))
    return out


def _per_seed(t: TableSpec, rows: list[dict]) -> dict[Any, float]:
    """seed -> the value a table cell reports for it (:func:`_values` of that seed's rows; their mean if several)."""
    out = {}
    for seed in dict.fromkeys(r.get("seed") for r in rows):
        vals = _values(t, [r for r in rows if r.get("seed") == seed])
        if vals:
            out[seed] = statistics.mean(vals)
    return out


def _per_seed_lists(t: TableSpec, rows: list[dict]) -> dict[Any, list[float]]:
    """seed -> ``t.metric`` where it is a list of per-party values (e.g. ``objective_clients``)."""
    return {r.get("seed"): [float(x) for x in r[t.metric]] for r in rows if isinstance(r.get(t.metric), list)}


def _relative(t: TableSpec, rows: list[dict], ref: list[dict]) -> list[float]:
    """|value - ref| / |ref| per seed found in both ``rows`` and ``ref`` (``t.relative_to``). For a metric that is
    a list of per-party values, one difference per party and seed, pooled over parties x seeds (paper 002's
    "relative difference": per client, mean (std) over clients x trials)."""
    lists = _per_seed_lists(t, rows)
    if lists:
        theirs = _per_seed_lists(t, ref)
        return [
            abs(a - b) / abs(b)
            for s, v in lists.items()
            if s in theirs and len(theirs[s]) == len(v)
            for a, b in zip(v, theirs[s])
            if b != 0
        ]
    mine, ref_means = _per_seed(t, rows), _per_seed(t, ref)
    return [abs(v - ref_means[s]) / abs(ref_means[s]) for s, v in mine.items() if s in ref_means and ref_means[s] != 0]


def table_lines(t: TableSpec, rows: list[dict]) -> list[str]:
    """Markdown lines of one table: mean +- sample SD of ``t.metric`` over the rows of each (row, column) cell (with
    ``relative_to``: of its per-seed relative difference to that row; with ``stat: count``: k/N nonzero; with
    ``stat: max``: the largest value); a cell with diverged runs names them; a ``paper`` column where the suite
    gives the paper's numbers."""
    order = lambda field: list(dict.fromkeys(r.get(field) for r in rows))
    n_seeds = len(order("seed"))
    out = []
    for part in order(t.split) if t.split else [None]:
        sub = [r for r in rows if t.split is None or r.get(t.split) == part]
        cols = order(t.columns) if t.columns else [None]
        head = f"## {t.title or t.metric}" + (f": {part}" if part is not None else "")
        paper = t.paper.get(str(part), t.paper) if part is not None and str(part) in t.paper else t.paper
        has_paper = bool(paper) and not (t.columns and all(isinstance(v, dict) for v in paper.values()))
        col_name = lambda c: "ours" if c is None else f"{t.columns} {c}" if _num(c) is not None else str(c)
        hdr = [t.rows] + (["paper"] if has_paper else []) + [col_name(c) for c in cols]
        paper_cols = bool(t.columns and paper and all(isinstance(v, dict) for v in paper.values()))
        if paper_cols:
            hdr += [f"paper {c}" for c in cols]
        out += [head, "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        row_vals = order(t.rows) if t.only is None else [v for o in t.only for v in order(t.rows) if str(v) == str(o)]
        for rv in row_vals:
            cells_ = []
            for c in cols:
                here = [r for r in sub if r.get(t.rows) == rv and (c is None or r.get(t.columns) == c)]
                if t.relative_to is None:
                    vals = _values(t, here)
                else:
                    vals = _relative(
                        t,
                        here,
                        [
                            r
                            for r in sub
                            if str(r.get(t.rows)) == t.relative_to and (c is None or r.get(t.columns) == c)
                        ],
                    )
                div = [r["diverged"] for r in here if r.get("diverged")]
                text = (
                    _fmt(t, vals, None if t.relative_to and _per_seed_lists(t, here) else n_seeds)
                    if vals or not here
                    else "-"
                )
                if div:
                    text += f"; diverged {len(div)}/{len(here)} ({div[0]})"
                cells_.append(text if here else "")
            pv = paper.get(str(rv)) if paper else None
            line = [str(rv)] + ([_paper(t, pv)] if has_paper else []) + cells_
            if paper_cols:  # a row the paper does not report gets empty paper cells
                line += [_paper(t, pv.get(str(c), pv.get(c)) if isinstance(pv, dict) else None) for c in cols]
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    return out


def lead_sentence(stats: dict[str, dict[str, Any]], metric: str, lower: bool, fmt=lambda v: f"{v:.4f}") -> str | None:
    """One sentence naming the best method of ``stats`` (label -> ``{"mean", "std", "n"}`` of ``metric`` over the
    seeds, ``std`` the sample SD; the lowest mean when ``lower``, else the highest) and its margin over the
    runner-up, and saying whether the margin exceeds the seeds' spread (the larger of the two sample SDs); None
    when no method has a value. ``fmt`` formats a number."""
    have = {a: s for a, s in stats.items() if s and _num(s.get("mean")) is not None}
    if not have:
        return None
    order = sorted(have, key=lambda a: have[a]["mean"], reverse=not lower)
    best, st = order[0], have[order[0]]

    def value(s: dict[str, Any]) -> str:
        return f"{fmt(s['mean'])} ± {fmt(s['std'])}" if s.get("n", 1) > 1 else fmt(s["mean"])

    def seeds(s: dict[str, Any]) -> str:
        return f"n = {s.get('n', 1)} seed{'s' if s.get('n', 1) != 1 else ''}"

    over = f"mean ± sample SD over {seeds(st)}" if st.get("n", 1) > 1 else seeds(st)
    head = f"**{best}** has the best {metric}, {value(st)} ({over})"
    if len(order) == 1:
        return head + "; it is the only method with a value."
    second, st2 = order[1], have[order[1]]
    margin = abs(st["mean"] - st2["mean"])
    if margin == 0:
        return f"{head}, tied with {second} at {value(st2)} ({seeds(st2)})."
    spread = max(st.get("std", 0.0), st2.get("std", 0.0))
    if min(st.get("n", 1), st2.get("n", 1)) < 2:
        verdict = "with one seed there is no spread to compare the margin with"
    elif margin > spread:
        verdict = f"the margin exceeds the seeds' spread (the larger sample SD, {fmt(spread)})"
    else:
        verdict = (
            f"the margin is within the seeds' spread (the larger sample SD, {fmt(spread)}), so these seeds do "
            "not separate the two"
        )
    return (
        f"{head}, {fmt(margin)} {'below' if lower else 'above'} the runner-up {second} at {value(st2)} "
        f"({seeds(st2)}): {verdict}."
    )
