"""Reports: markdown tables and matplotlib plots for run and compare folders.

Figures are drawn on ``matplotlib.figure.Figure`` objects and written as PNG without pyplot, so
importing or using this module never selects or changes matplotlib's backend.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fedsolve.engine.io import atomic_write_bytes, atomic_write_text, new_figure, save_figure  # noqa: F401
from fedsolve.experiments.folders import default_run_dir, read_jsonl
from fedsolve.experiments.tables import has_direction, lead_sentence, lower_is_better

# one line style and marker per method, so that curves lying on top of each other stay visible
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


#: the certificate of a constrained run (paper 002, Definition 1): shown and plotted where the runs record it
CERTIFICATE_METRICS = (
    "objective",
    "violation_max",
    "kkt_eps1",
    "kkt_eps2",
    "outer_iterations",
    "admm_rounds",
    "converged",
)
PLOT_METRICS = (
    "test_accuracy",
    "test_f1",
    "test_auc",
    "test_loss",
    "train_loss",
    "test_rmse",
    "test_accuracy_worst10",
    "num_clusters",
    "ari",
    "model_deviation",
    "objective",
    "violation_max",
    "kkt_eps1",
)
LOG_SCALE = frozenset({"kkt_eps1", "kkt_eps2"})
COUNTS = frozenset({"outer_iterations", "admm_rounds"})  # shown without decimals
TABLE_METRICS = (
    "test_accuracy",
    "test_f1",
    "test_auc",
    "test_loss",
    "test_rmse",
    "test_accuracy_std",
    "test_accuracy_worst10",
    "train_loss",
    "num_clusters",
    "ari",
    *CERTIFICATE_METRICS,
)
NICE = {
    "test_accuracy": "accuracy",
    "test_f1": "weighted F1",
    "test_auc": "macro AUC",
    "test_loss": "test loss",
    "train_loss": "train loss",
    "test_rmse": "RMSE",
    "test_accuracy_std": "acc. std (clients)",
    "test_accuracy_worst10": "acc. worst 10%",
    "num_clusters": "clusters",
    "ari": "ARI",
    "model_deviation": "model deviation",
    "objective": "objective",
    "violation_max": "violation (max)",
    "kkt_eps1": "KKT eps1",
    "kkt_eps2": "KKT eps2",
    "outer_iterations": "outer it.",
    "admm_rounds": "ADMM rounds",
    "converged": "Eq. 11 passed (share)",
}


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000 or (abs(v) < 1e-3 and v != 0):
        return f"{v:.3g}"
    return f"{v:.4f}"


def _sd_name(agg: dict[str, Any]) -> str:
    """The spread a compare summary reports: ``sample SD`` (n - 1 in the denominator, ``agg["spread"]``); a
    summary written before fedsolve recorded it holds population SDs."""
    return agg.get("spread", "population SD")


def _pm(st: dict[str, Any], n: int, counts: bool = False) -> str:
    """``mean ± sd`` of one summary entry, with its ``n`` where it is not the ``n`` of the table."""
    txt = f"{st['mean']:.0f} ± {st['std']:.0f}" if counts else f"{_fmt(st['mean'])} ± {_fmt(st['std'])}"
    return txt if st.get("n", n) == n else f"{txt} (n = {st['n']})"


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


# ------------------------------------------------------------------ single run
def write_run_report(run_dir: Path, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
    run_dir = Path(run_dir)
    plots = []
    for m in PLOT_METRICS:
        pts = [(r["round"], r[m]) for r in history if m in r and r[m] == r[m]]
        if len(pts) < 2:
            continue
        fig, ax = new_figure(figsize=(5, 3.2))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
        ax.set_xlabel("round")
        ax.set_ylabel(NICE.get(m, m))
        if m in LOG_SCALE and all(p[1] > 0 for p in pts):
            ax.set_yscale("log")
        ax.set_title(f"{summary['label']} (seed {summary['seed']})")
        ax.grid(alpha=0.3)
        save_figure(fig, run_dir / "plots" / f"{m}.png")
        plots.append(m)
    lines = [f"# {summary['experiment']}: {summary['label']} on {summary['dataset']} (seed {summary['seed']})", ""]
    if summary.get("status") != "completed" or summary.get("message"):  # a solver's own verdict too
        lines += [f"**Run {summary.get('status')}:** {summary.get('message', '')}", ""]
    lines += ["| metric | final | best |", "|---|---|---|"]
    fin, best = summary["metrics"]["final"], summary["metrics"]["best"]
    for k in sorted(fin):
        if k.endswith("_bytes"):
            continue
        lines.append(f"| {NICE.get(k, k)} | {_fmt(fin[k])} | {_fmt(best.get(k, float('nan')))} |")
    c = summary["communication"]
    lines += [
        "",
        f"Rounds: {summary['rounds']}. Communication: {_mb(c['uplink_bytes'])} MB up, "
        f"{_mb(c['downlink_bytes'])} MB down. Wall time {summary['wall_time_s']:.1f} s, median round "
        f"{(summary.get('round_time_s_median') or 0) * 1000:.1f} ms.",
        "",
    ]
    lines += [f"![{m}](plots/{m}.png)" for m in plots]
    lines += _outer_run_figure(run_dir, history)
    atomic_write_text(run_dir / "report.md", "\n".join(lines) + "\n")


def _outer_run_figure(run_dir: Path, history: list[dict[str, Any]]) -> list[str]:
    """Figure 1/2 of paper 002 for one constrained run (``fedsolve.families.constrained.figures.run_figure``)."""
    if not (run_dir / "config.yaml").exists():
        return []
    from fedsolve.experiments.records import read_yaml
    from fedsolve.families.constrained.figures import run_figure

    fig = run_figure(read_yaml(run_dir / "config.yaml"), history)
    if fig is None:
        return []
    save_figure(fig, run_dir / "plots" / "outer.png")
    return [
        "",
        "Objective and feasibility per outer iteration (paper 002's Figure 1/2; the first record after outer "
        "step k stands for w^k):",
        "",
        "![outer](plots/outer.png)",
    ]


# ------------------------------------------------------------------ compare
#: the metric plotted against communication and wall time: the first of these the runs record
MAIN_METRICS = ("test_accuracy", "test_rmse", "test_loss", "train_loss")
#: the cost axes of those plots: (key in a history record, axis label, file-name suffix)
COSTS = (
    ("comm_mb", "communicated MB (uplink + downlink)", "bytes"),
    ("time_s", "wall time (s)", "time"),
    ("virtual_time", "virtual time (s)", "virtual_time"),
)
#: cost axes that are a schedule's clock (asyncFPFC's virtual time): the runs evaluate at different rounds, so
#: the curves are aligned on the clock (:func:`_clock_curve`), not on the round
CLOCKS = ("virtual_time",)


def run_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run folder's ``metrics.jsonl`` records, each with its wall-clock ``time_s`` from ``timings.jsonl`` where
    that round was timed: the histories the compare report plots (against rounds, bytes and wall time)."""
    run_dir = Path(run_dir)
    times = {t["round"]: t["time_s"] for t in read_jsonl(run_dir / "timings.jsonl")}
    return [
        {**r, "time_s": times[r["round"]]} if r["round"] in times else r for r in read_jsonl(run_dir / "metrics.jsonl")
    ]


def _curves(histories: list[list[dict]], metric: str):
    """(rounds, [seeds, rounds] values of ``metric``; NaN where a seed lacks it), or None under two rounds."""
    rounds = sorted({r["round"] for h in histories for r in h if metric in r})
    if len(rounds) < 2:
        return None
    mat = np.full((len(histories), len(rounds)), np.nan)
    pos = {r: i for i, r in enumerate(rounds)}
    for s, h in enumerate(histories):
        for r in h:
            if metric in r and r[metric] is not None:
                mat[s, pos[r["round"]]] = r[metric]
    return np.array(rounds), mat


def _cost_curve(histories: list[list[dict]], metric: str, cost: str):
    """``metric`` against ``cost`` (``comm_mb`` or ``time_s``) over the rounds that record both: (the cost per
    round, mean over seeds; [seeds, rounds] values of ``metric``), or None."""
    mb = [
        [
            {**r, "comm_mb": (r["uplink_bytes"] + r.get("downlink_bytes", 0)) / 1e6} if "uplink_bytes" in r else r
            for r in h
        ]
        for h in histories
    ]
    both = [[r for r in h if metric in r and cost in r] for h in mb]
    y, x = _curves(both, metric), _curves(both, cost)
    if y is None or x is None:
        return None
    with np.errstate(all="ignore"):
        return np.nanmean(x[1], 0), y[1]


def _clock_curve(histories: list[list[dict]], metric: str, clock: str):
    """``metric`` against a schedule's ``clock`` (the record before the first round at 0): each seed's value held
    from one evaluation to its next, on the union of the seeds' evaluation times up to the earliest last one:
    (times, [seeds, times] values), or None under two times."""
    runs = []
    for h in histories:
        pts = sorted(
            (r.get(clock, 0.0), r[metric])
            for r in h  # the record before round 1 is at time 0
            if r.get(metric) is not None and (clock in r or r["round"] == 0)
        )
        if len(pts) > 1:
            runs.append(pts)
    if not runs:
        return None
    end = min(p[-1][0] for p in runs)
    grid = np.unique([t for p in runs for t, _ in p if t <= end])
    if len(grid) < 2:
        return None
    mat = np.full((len(runs), len(grid)), np.nan)
    for s, p in enumerate(runs):
        t, v = np.array([a for a, _ in p]), np.array([b for _, b in p], dtype=np.float64)
        at = np.searchsorted(t, grid, side="right") - 1
        mat[s] = np.where(at >= 0, v[np.clip(at, 0, None)], np.nan)
    return grid, mat


def _draw(ax, k: int, n: int, label: str, x, mat) -> None:
    """Method ``k`` of ``n``: its mean over seeds (the rows of ``mat``) against ``x``, and a ± sample-SD band."""
    with warnings.catch_warnings():  # a round no seed reached is nan, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(mat, 0)
    # hollow markers at staggered points and a line width that shrinks with the order: two methods with the
    # same curve (FedProx with a small mu on FedAvg) both stay visible
    step = max(1, len(x) // 8)
    (line,) = ax.plot(
        x,
        mean,
        label=label,
        linestyle=LINE_STYLES[k % len(LINE_STYLES)],
        linewidth=1.0 + 0.5 * max(0, n - 1 - k),
        marker=MARKERS[k % len(MARKERS)],
        markersize=6,
        markerfacecolor="none",
        markevery=(k % step, step),
    )
    if mat.shape[0] > 1:  # one seed has no SD
        with warnings.catch_warnings():  # a round one seed reached has none either: nan, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            std = np.nanstd(mat, 0, ddof=1)
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, linewidth=0)


def _figure(
    base: Path,
    cfg,
    algos: list[str],
    histories: dict[str, list[list[dict]]],
    m: str,
    cost: tuple[str, str, str] | None = None,
) -> str | None:
    """Plot ``m`` of every method against rounds, or against ``cost`` (:data:`COSTS`); the file name, or None
    when no method has two points."""
    fig, ax = new_figure(figsize=(6, 3.8))
    drawn, positive = 0, True
    for k, label in enumerate(algos):
        runs = histories.get(label, [])
        if cost is None:
            cur = _curves(runs, m)
        else:
            cur = (_clock_curve if cost[0] in CLOCKS else _cost_curve)(runs, m, cost[0])
        if cur is None:
            continue
        x, mat = cur
        positive = positive and bool(np.nanmin(mat) > 0)
        _draw(ax, k, len(algos), label, x, mat)
        drawn += 1
    if drawn == 0:
        return None
    ax.set_xlabel("round" if cost is None else cost[1])
    ax.set_ylabel(NICE.get(m, m))
    if m in LOG_SCALE and positive:
        ax.set_yscale("log")
    against = "" if cost is None else f" against {cost[2]}"
    ax.set_title(f"{cfg.name}: {NICE.get(m, m)}{against} (mean ± sample SD over {len(cfg.seeds)} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    name = m if cost is None else f"{m}_vs_{cost[2]}"
    save_figure(fig, base / "plots" / f"{name}.png")
    return name


def write_compare_report(base: Path, cfg, agg: dict[str, Any], histories: dict[str, list[list[dict]]]) -> None:
    """``report.md`` and ``plots/`` of a compare folder: a sentence naming the best method on the main metric's final
    value and its margin (:func:`~fedsolve.experiments.tables.lead_sentence`), the table, and each metric against
    rounds; the main metric (:data:`MAIN_METRICS`) also against communicated bytes and, where the histories hold
    ``time_s`` (:func:`run_history`), against wall time."""
    base = Path(base)
    algos = list(agg["algorithms"])
    plots = [name for m in PLOT_METRICS if (name := _figure(base, cfg, algos, histories, m)) is not None]
    main = next((m for m in MAIN_METRICS if any(m in r for lst in histories.values() for h in lst for r in h)), None)
    cost_plots = [
        name for c in COSTS if main is not None and (name := _figure(base, cfg, algos, histories, main, c)) is not None
    ]
    # on a schedule's clock also the clusters found (asyncFPFC against synchronous FPFC, Fig. 8)
    cost_plots += [
        name
        for c in COSTS
        if c[0] in CLOCKS
        for m in ("num_clusters", "ari")
        if (name := _figure(base, cfg, algos, histories, m, c)) is not None
    ]

    cols = [m for m in TABLE_METRICS if any(m in agg["algorithms"][a]["final"] for a in algos)]
    best_of = {}
    for m in filter(has_direction, cols):  # a cluster count is never "best"
        vals = {a: agg["algorithms"][a]["final"].get(m, {}).get("mean") for a in algos}
        vals = {a: v for a, v in vals.items() if v is not None}
        if vals:
            best_of[m] = (min if lower_is_better(m) else max)(vals, key=lambda a: vals[a])
    lines = [f"# {cfg.name}", ""]
    lead = main and lead_sentence(
        {a: agg["algorithms"][a]["final"].get(main) for a in algos},
        f"final {NICE.get(main, main)}",
        lower_is_better(main),
        _fmt,
    )
    if lead:
        lines += [lead, ""]
    if cfg.description:
        lines += [cfg.description.strip(), ""]
    clients = cfg.data.num_clients if cfg.data.num_clients is not None else "the dataset's own number of"
    dataset = agg.get("dataset", cfg.data.label)
    split = (
        f"built by problem kind `{cfg.problem.kind}`"
        if dataset != cfg.data.label
        else f"partition `{cfg.data.partition}` {json.dumps(cfg.data.partition_params)}"
    )
    lines += [
        f"Dataset **{dataset}**, {clients} clients, {split}, model `{cfg.model.label}`, "
        f"{cfg.simulation.rounds} rounds, seeds {cfg.seeds}.",
        "",
        f"Final-round metrics, mean ± {_sd_name(agg)} over seeds (n = {len(cfg.seeds)} unless a cell says "
        f"otherwise; best in bold; never clusters, objectives or counts; clients weighted uniformly):",
        "",
    ]
    head = "| algorithm | " + " | ".join(NICE.get(m, m) for m in cols) + " | up MB | wall s |"
    lines += [head, "|" + "---|" * (len(cols) + 3)]
    for a in algos:
        e = agg["algorithms"][a]
        cells = []
        for m in cols:
            st = e["final"].get(m)
            if st is None:
                cells.append("–")
                continue
            txt = _pm(st, len(cfg.seeds), counts=m in COUNTS)
            cells.append(f"**{txt}**" if best_of.get(m) == a else txt)
        flag = f" ({e['diverged']} diverged)" if e.get("diverged") else ""
        lines.append(
            f"| {a}{flag} | " + " | ".join(cells) + f" | {_mb(e['uplink_bytes'])} | {(e.get('wall_time_s') or 0):.1f} |"
        )
    if "test_accuracy" in cols:
        lines += [
            "",
            f"Best-over-rounds accuracy (as the papers report), mean ± {_sd_name(agg)}:",
            "",
            "| algorithm | best accuracy |",
            "|---|---|",
        ]
        for a in algos:
            st = agg["algorithms"][a]["best"].get("test_accuracy")
            if st:
                lines.append(f"| {a} | {_pm(st, len(cfg.seeds))} |")
    lines += _tuned_section(agg)
    paper = cfg.paper or {}
    if paper.get("values"):
        lines += ["", f"## Paper's numbers: {paper.get('source', '')}", ""]
        if paper.get("note"):
            lines += [paper["note"].strip(), ""]
        # values: {label: number} for `metric`, or {label: {metric: number}} for several metrics
        which = paper.get("ours", "best")
        metrics = paper.get("metrics") or [paper.get("metric", "test_accuracy")]
        head = " | ".join(f"paper {NICE.get(m, m)} | ours ({which})" for m in metrics)
        lines += [f"| algorithm | {head} |", "|---|" + "---|---|" * len(metrics)]
        for a, v in paper["values"].items():
            cells = []
            missing = "–" if a in agg["algorithms"] else "not run"  # ran without this metric, or did not run
            for m in metrics:
                pv = v.get(m, "–") if isinstance(v, dict) else v
                ours = agg["algorithms"].get(a, {}).get(which, {}).get(m)
                cells += [str(pv), _pm(ours, len(cfg.seeds)) if ours else missing]
            lines.append(f"| {a} | " + " | ".join(cells) + " |")
    total = agg.get("run_time_s", agg.get("wall_time_s", 0.0))  # older summaries: the sum was wall_time_s
    lines += ["", f"Total run time of all runs {total:.1f} s.", ""]
    lines += [f"![{m}](plots/{m}.png)" for m in plots]
    if cost_plots:
        clock = (
            " and against the virtual clock of the schedule (each seed's value held between its evaluations)"
            if any(f"{main}_vs_{c[2]}" in cost_plots for c in COSTS if c[0] in CLOCKS)
            else ""
        )
        what = "The metrics" if main is None else NICE.get(main, main)
        lines += [
            "",
            f"{what} against the bytes communicated (uplink + downlink, all clients) "
            f"and against wall time, the mean over seeds of each round's cost{clock}:",
            "",
        ]
        lines += [f"![{m}](plots/{m}.png)" for m in cost_plots]
    lines += _outer_figures(base, cfg, algos, histories)
    atomic_write_text(base / "report.md", "\n".join(lines) + "\n")


def _outer_figures(base: Path, cfg, algos: list[str], histories: dict[str, list[list[dict]]]) -> list[str]:
    """Figures 1/2 of paper 002 (objective and feasibility per outer iteration, bands over clients, the
    threshold) for each method of a Neyman-Pearson or fairness comparison that records outer iterations,
    from its first seed's run."""
    problem = getattr(cfg, "problem", None)
    if problem is None or problem.kind not in ("neyman_pearson", "fairness"):
        return []
    from fedsolve.families.constrained.figures import has_outer_records, outer_figure
    from fedsolve.families.constrained.kind import FairnessParams, NPParams

    params = (NPParams if problem.kind == "neyman_pearson" else FairnessParams)(**dict(problem.params))

    out = []
    for label in algos:
        recs = next((h for h in histories.get(label, []) if has_outer_records(h)), None)
        if recs is None:
            continue
        slug = "".join(ch if ch.isalnum() else "_" for ch in label)
        fig = outer_figure(recs, cfg.data.num_clients, problem.kind, params.r)  # r: the kind's default if unset
        save_figure(fig, base / "plots" / f"outer_{slug}.png")
        out += [
            "",
            f"{label}, seed {cfg.seeds[0]}: objective and feasibility per outer iteration (the paper's "
            f"Figure {1 if problem.kind == 'neyman_pearson' else 2}; the first record after outer step k "
            "stands for w^k)",
            "",
            f"![{label}](plots/outer_{slug}.png)",
        ]
    return out


def _tuned_section(agg: dict[str, Any]) -> list[str]:
    """The hyper-parameters chosen on validation (``tune:``), per algorithm and seed."""
    rows = [(a, t) for a, e in agg["algorithms"].items() for t in e.get("tuned", [])]
    if not rows:
        return []
    out = [
        "",
        "## Tuned on validation",
        "",
        "Each tuned algorithm ran once per grid value on its clients' training data less a held-out "
        "validation share, scored on that share at the last round; the best value was then trained on the "
        "whole training split (the rows above). A pick at the grid's lowest or highest value is marked: the "
        "grid does not bracket it, so a value beyond the grid may be better (`tune: {widen: 1}` tunes again "
        "beyond it).",
        "",
        "| algorithm | seed | chosen | validation metric per grid value | tuning rounds | tuning wall s |",
        "|---|---|---|---|---|---|",
    ]
    for a, t in rows:
        scores = ", ".join(f"{g}: {_fmt(v) if v is not None else 'diverged'}" for g, v in zip(t["grid"], t["scores"]))
        edge = f" (the grid's {t['edge']} value: not bracketed)" if t.get("edge") else ""
        out.append(
            f"| {a} | {t.get('seed')} | {t['param']} = {t['value']}{edge} | "
            f"{NICE.get(t['metric'], t['metric'])} "
            f"(validation, {t['val_fraction']:g} held out): {scores} | {t['rounds']} | "
            f"{t.get('wall_time_s', 0.0):.1f} |"
        )
    return out


def report_dir(path: str | Path) -> Path:
    """Rebuild report.md and plots of a run or compare folder from its files (``fedsolve report``)."""
    from fedsolve.experiments.config import parse_config
    from fedsolve.experiments.records import read_json, read_yaml

    path = Path(path)
    summ = path / "summary.json"
    if not summ.exists():
        raise FileNotFoundError(f"{path}: no summary.json (not a fedsolve run or compare folder)")
    summary = read_json(summ)
    if not isinstance(summary, dict):
        raise ValueError(f"{summ}: holds a {type(summary).__name__}, not the mapping fedsolve writes")
    try:
        if "algorithms" in summary:
            try:
                cfg = parse_config(read_yaml(path / "config.yaml"))
            except ValueError as e:
                msg = str(e).removeprefix("config: ")
                raise ValueError(msg if "config.yaml" in msg else f"{path / 'config.yaml'}: {msg}") from None
            histories: dict[str, list[list[dict]]] = {}
            for spec in cfg.all_algorithms():
                for seed in cfg.seeds:
                    h = run_history(default_run_dir(cfg, spec, seed, path))
                    if h:
                        histories.setdefault(spec.display, []).append(h)
            write_compare_report(path, cfg, summary, histories)
        else:
            write_run_report(path, summary, read_jsonl(path / "metrics.jsonl"))
    except (KeyError, TypeError, AttributeError) as e:  # a field missing, or of another shape than fedsolve's
        raise ValueError(f"{summ}: not a summary fedsolve wrote ({type(e).__name__}: {e})") from None
    return path / "report.md"
