"""Figures 1 and 2 of paper 002 from a constrained run's records (``metrics.jsonl``).

:func:`outer_figure`: per outer iteration k, the clients' local objective (mean, with the min-max band over
clients) and their constraint (mean with the band), the server's constraint (Figure 2, dash-dot) and the
threshold (dashed). The compare report draws it for every Prox-AL-type method of a Neyman-Pearson or fairness
run, and ``fedsolve report RUN_FOLDER`` for one run (:func:`run_figure`: ``plots/outer.png``).

Plotted quantities (the paper's, without the 1/n of f_i = L_i / n): objective = the client's own loss L_i =
n f_i. Neyman-Pearson (Eq. 30): class-1 loss = c_i + r against the threshold r. Fairness (Eq. 32): the signed
disparity D = L_female - L_male of each party, from its two constraints D - r <= 0 and -D - r <= 0 (client
mean = c_mean[first] + r, max = c_max[first] + r, min = -(c_max[second] + r)), against +-r.

The figure is a plain ``matplotlib.figure.Figure`` (no pyplot, no backend); the caller writes it.
"""

from __future__ import annotations

from typing import Any


def per_outer(recs: list[dict]) -> list[dict]:
    """The first record of every outer iteration k (it stands for w^k: the output changes only at outer steps)."""
    seen, out = set(), []
    for r in recs:
        k = r.get("outer_iterations", 0)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def has_outer_records(recs: list[dict]) -> bool:
    """True for the records of a run that reports outer iterations and per-client constraint values."""
    return bool(recs) and "outer_iterations" in recs[-1] and any(k.startswith("c_client_mean[") for k in recs[-1])


def outer_figure(recs: list[dict], n: int, kind: str, r: float, title: str | None = None, x: str = "outer"):
    """The two panels of Figures 1/2 from ``recs`` (the run's records, in order): ``n`` clients, problem
    ``kind`` (``neyman_pearson`` or ``fairness``), threshold ``r``; ``x`` = ``outer`` (one point per outer
    iteration) or ``round``. Returns the figure."""
    from matplotlib.figure import Figure

    final = recs[-1]  # the run's end, for the title (per_outer keeps the first record of the last k)
    if x == "outer":
        recs = per_outer(recs)
        xs, xlabel = [rec.get("outer_iterations", 0) for rec in recs], "outer iteration k"
    else:
        xs, xlabel = [rec["round"] for rec in recs], "communication round"
    last = recs[-1]
    fig = Figure(figsize=(10, 3.8))
    ax0, ax1 = fig.subplots(1, 2)
    ax0.plot(
        xs,
        [n * rec["objective_client_mean"] for rec in recs],
        "o-",
        color="tab:blue",
        ms=3,
        label="local objective L_i (mean)",
    )
    if "objective_client_min" in last:
        lo, hi, band = (
            [n * rec["objective_client_min"] for rec in recs],
            [n * rec["objective_client_max"] for rec in recs],
            "min-max over clients",
        )
    else:  # runs recorded before the min/max read-outs existed
        lo, hi, band = (
            [n * (rec["objective_client_mean"] - rec["objective_client_std"]) for rec in recs],
            [n * (rec["objective_client_mean"] + rec["objective_client_std"]) for rec in recs],
            "mean +- std over clients",
        )
    ax0.fill_between(xs, lo, hi, color="tab:blue", alpha=0.2, label=band)
    ax0.set_xlabel(xlabel)
    ax0.set_ylabel("loss")
    ax0.legend(fontsize=7)
    names = sorted(k[len("c_client_mean[") : -1] for k in last if k.startswith("c_client_mean["))
    if kind == "fairness":
        first, second = names[0], names[1]  # 'L_female - L_male - r', 'L_male - L_female - r'
        label = "L_female - L_male"
        ax1.plot(
            xs,
            [rec[f"c_client_mean[{first}]"] + r for rec in recs],
            "o-",
            color="tab:brown",
            ms=3,
            label=f"clients' {label} (mean)",
        )
        ax1.fill_between(
            xs,
            [-(rec[f"c_client_max[{second}]"] + r) for rec in recs],
            [rec[f"c_client_max[{first}]"] + r for rec in recs],
            color="tab:brown",
            alpha=0.2,
            label="min-max over clients",
        )
        if f"c_server[{first}]" in last:
            ax1.plot(
                xs, [rec[f"c_server[{first}]"] + r for rec in recs], "-.", color="tab:blue", label=f"server's {label}"
            )
        for t in (r, -r):
            ax1.axhline(t, color="black", ls="--", lw=1)
        ax1.set_ylabel(f"loss disparity (threshold +-{r})")
    else:
        for name in names:
            ax1.plot(
                xs,
                [rec[f"c_client_mean[{name}]"] + r for rec in recs],
                "o-",
                color="tab:brown",
                ms=3,
                label=f"{name.replace(' - r', '')} (mean)",
            )
            ax1.fill_between(
                xs,
                [rec[f"c_client_min[{name}]"] + r for rec in recs],
                [rec[f"c_client_max[{name}]"] + r for rec in recs],
                color="tab:brown",
                alpha=0.2,
                label="min-max over clients",
            )
        for key in sorted(k for k in last if k.startswith("c_server[")):
            ax1.plot(xs, [rec[key] + r for rec in recs], "-.", color="tab:blue", label=f"server {key[9:-1]} + r")
        ax1.axhline(r, color="black", ls="--", lw=1, label=f"threshold {r}")
        ax1.set_yscale("log")
        ax1.set_ylabel("constraint loss")
    ax1.set_xlabel(xlabel)
    ax1.legend(fontsize=7)
    fig.suptitle(title or default_title(final, n, kind), fontsize=9)
    fig.tight_layout()
    return fig


def default_title(final: dict[str, Any], n: int, kind: str, dataset: str = "") -> str:
    head = f"{dataset}, " if dataset else ""
    admm = f"{final['admm_rounds']} ADMM rounds, " if "admm_rounds" in final else ""
    return f"{head}{kind}, n = {n}: {final.get('outer_iterations', '?')} outer iterations, {admm}" + (
        "Eq. 11 passed" if final.get("converged") else "Eq. 11 not passed (budget ended)"
    )


#: the constraint level r of each problem kind when a config does not give it (Eq. 30: 0.2; Eq. 32: 0.1)
DEFAULT_R = {"neyman_pearson": 0.2, "fairness": 0.1}


def run_figure(config: dict[str, Any], recs: list[dict], x: str = "outer"):
    """Figure 1/2 of one run from its resolved ``config`` (a run folder's config.yaml) and records, or None where
    the run is not a Neyman-Pearson or fairness run that records outer iterations. Evaluate more often than an
    inner loop lasts (e.g. ``--set simulation.eval_every=10``) so that every outer iteration has a record."""
    problem = config.get("problem") or {}
    kind = problem.get("kind")
    if kind not in DEFAULT_R or not has_outer_records(recs):
        return None
    params = problem.get("params") or {}
    n = config["data"]["num_clients"]
    title = default_title(recs[-1], n, kind, str(params.get("dataset", "")))
    return outer_figure(recs, n, kind, float(params.get("r", DEFAULT_R[kind])), title=title, x=x)
