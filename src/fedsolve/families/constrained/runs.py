"""The per-cell protocol of paper 002's Tables 1, 2 and 4 (He, Peng & Sun, TMLR 2024: Neyman-Pearson Eq. 30,
fairness Eq. 32, the linear-equality-constrained QP of Eq. 86), run by
``fedsolve suite experiments/constrained/table{1,2,4}_suite.yaml``.

One cell is one run of the experiment: a method (Prox-AL FL, cProx-AL, FedAvg without constraints), a seed
and the sweep's values (dataset, n). Its row is the run's certificate, ``extras.constrained`` of the
algorithm's ``report(final=True)`` (objective, Definition-1 residuals ``kkt_eps1/2``, per-party constraint values, the
Eq. 11 flag ``converged``, outer iterations K and ADMM rounds), plus the constrained loss of the worst
client (class-1 loss, Table 1; loss disparity, Table 2), the run's wall time and where the row came from.

A cell that a ``fedsolve compare`` run has already finished is read instead of run again: ``args.adopt``
names folders of such runs (e.g. ``runs/constrained``, one ``fedsolve compare --only LABEL`` run per method and
seed); a run serves the cell when its ``summary.json`` has the same problem kind, dataset, n, data limits, round
budget, method and seed (:func:`run_key`, :func:`method_label`; the newest summary when a seed was run twice,
:func:`recorded_runs`). Then ``adopted`` is 1 and ``source`` names the run's folder; ``adopt_only`` reports a cell
with no finished run as missing instead of running it (and ``--resume`` looks for it again); ``copy_to`` copies
each adopted run's small files (summary.json, metrics.jsonl) there, as results/constrained/raw keeps them.

A QP cell (problem kind ``constrained_qp``, Table 4) runs Prox-AL FL only until Eq. 11 passes (or ``max_outer``
is reached; ``simulation.rounds`` is the budget): its phase table is then ``done``, where the engine's loop
stops. Its row adds the distance to the exact optimum (w*, f*) of one KKT solve (:func:`qp_errors`), the
rounds to Eq. 11 and the process CPU seconds; it has no constrained loss (the constraints are equalities).
"""

from __future__ import annotations

import json
import shutil
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsolve.engine.loop import DivergenceError

#: algorithm options that make a separate method (another table row) when not the paper's choice, with the
#: paper's value (the authors' code's choices: Eq. 23 / Eq. 22 tests, the ADMM restart at w^0, looser client solves)
PAPER_CHOICES = {"inner_stop": "paper", "eps_tilde": "paper", "admm_start": "wk", "client_tol_factor": 1.0}
#: the constraint level r of each problem kind when a config does not give it (Eq. 30: 0.2; Eq. 32: 0.1)
DEFAULT_R = {"neyman_pearson": 0.2, "fairness": 0.1}
#: the App. E.2 QP (Eq. 86): equality constraints, no level r; the errors are against its exact optimum
QP_KIND = "constrained_qp"
KINDS = (*DEFAULT_R, QP_KIND)


class SetWhen(BaseModel):
    """Experiment settings for the cells whose sweep values match ``when`` (e.g. Adult's row limit)."""

    model_config = ConfigDict(extra="forbid")
    when: dict[str, Any] = Field(
        ..., min_length=1, description="sweep axis -> value, e.g. {problem.params.dataset: adult}"
    )
    set: dict[str, Any] = Field(
        ..., min_length=1, description="experiment field (dotted) -> value, e.g. {problem.params.limit: 5000}"
    )

    @field_validator("set")
    @classmethod
    def _dotted(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in v if "." not in k or k.startswith("params.")]
        if bad:
            raise ValueError(
                f"set: {bad} are not experiment fields; allowed: dotted experiment fields such as "
                f"problem.params.limit or simulation.rounds"
            )
        return v


class ConstrainedRunsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adopt: list[str] = Field(
        default_factory=list,
        description="folders of finished `fedsolve compare` runs "
        "(relative to the working directory) that serve "
        "their cells instead of a new run",
    )
    adopt_only: bool = Field(
        False, description="report a cell with no finished run under `adopt` as missing instead of running it"
    )
    set_when: list[SetWhen] = Field(default_factory=list, description="experiment settings for some cells only")
    copy_to: str | None = Field(
        None,
        description="copy each adopted run's summary.json and metrics.jsonl to "
        "COPY_TO/<run folder>/<method>/seed<k>/ (e.g. results/constrained/raw)",
    )


# ------------------------------------------------------------------ finished runs
def run_key(cfg: dict) -> tuple:
    """What makes two runs the same table cell, from a resolved run config (a run folder's ``config.yaml``):
    problem kind and dataset (``dataset:scale`` when its features are re-scaled), n (``data.num_clients``), the
    data limits and the round budget. Everything else (``eval_every``, names, the output folder) does not change
    the certificate."""
    p = cfg["problem"]["params"]
    dataset = p["dataset"] + (f":{p['scale']}" if p.get("scale") else "")
    return (
        cfg["problem"]["kind"],
        dataset,
        cfg["data"]["num_clients"],
        p.get("limit"),
        p.get("server_limit"),
        cfg["simulation"]["rounds"],
    )


def method_label(label: str, params: dict) -> str:
    """The row label of a method: its label, with the authors'-code choices appended where they are not the
    paper's (``Prox-AL FL [inner_stop: code]`` or ``[admm_start: w0]`` is another method than ``Prox-AL FL``)."""
    variant = {k: v for k, v in params.items() if k in PAPER_CHOICES and v != PAPER_CHOICES[k]}
    if not variant:
        return label
    return label + " [" + ", ".join(f"{k}: {v}" for k, v in sorted(variant.items())) + "]"


@lru_cache(maxsize=4096)
def _read_run(path: str, mtime: float) -> tuple[tuple, str, int, dict]:
    folder = Path(path).parent
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    summ = json.loads(Path(path).read_text())
    label = method_label(summ["label"], cfg["algorithm"]["params"])
    return run_key(cfg), label, int(summ["seed"]), summ


#: seconds a listing of a root's summaries is reused (a suite asks once per cell; a run folder holds thousands
#: of files): a run that finishes within this window is seen by the next listing
LISTING_TTL_S = 10.0
_LISTINGS: dict[str, tuple[float, list[Path]]] = {}


def _summaries(root: str | Path, fresh: bool) -> list[Path]:
    key = str(Path(root).resolve())
    now = time.monotonic()
    hit = _LISTINGS.get(key)
    if fresh or hit is None or now - hit[0] > LISTING_TTL_S:
        hit = _LISTINGS[key] = (now, sorted(Path(root).glob("**/seed*/summary.json")))
    return hit[1]


def recorded_runs(roots: list[str | Path], fresh: bool = True) -> dict[tuple, dict[str, dict[int, tuple[Path, dict]]]]:
    """cell (:func:`run_key`) -> method label -> seed -> (seed folder, summary) of every
    ``ROOT/**/seed*/summary.json`` with a ``config.yaml`` beside it; when a seed was run twice, the newest
    summary. Files are parsed once per process (and again when they change); ``fresh=False`` reuses a listing
    of a root made in the last :data:`LISTING_TTL_S` seconds."""
    cells: dict = {}
    for root in roots:
        for path in _summaries(root, fresh):
            if not path.exists():  # removed since the listing
                continue
            if not (path.parent / "config.yaml").exists():
                continue
            mtime = path.stat().st_mtime
            key, label, seed, summ = _read_run(str(path), mtime)
            seeds = cells.setdefault(key, {}).setdefault(label, {})
            old = seeds.get(seed)
            if old is None or mtime > old[2]:
                seeds[seed] = (path.parent, summ, mtime)
    return {k: {lab: {s: v[:2] for s, v in by.items()} for lab, by in labels.items()} for k, labels in cells.items()}


# ------------------------------------------------------------------ a certificate as a table row
def constraint_loss(cert: dict, kind: str, r: float) -> tuple[float, float]:
    """(client mean, client max) of the constrained loss: the class-1 loss (Eq. 30) or the loss disparity
    |L_female - L_male| (Eq. 32: two constraints +-(L_f - L_m) - r <= 0, the larger one + r)."""
    means = [v for k, v in cert.items() if k.startswith("c_client_mean[")]
    maxes = [v for k, v in cert.items() if k.startswith("c_client_max[")]
    if kind == "fairness":
        return max(means) + r, max(maxes) + r
    return means[0] + r, maxes[0] + r


def server_disparity(cert: dict, r: float) -> float | None:
    """The server's loss disparity on Z_0 (Eq. 32, i = 0), None without a server constraint."""
    vals = [v for k, v in cert.items() if k.startswith("c_server[")]
    return max(vals) + r if vals else None


CERT_FIELDS = (
    "objective",
    "kkt_eps1",
    "kkt_eps2",
    "violation_max",
    "violation_mean",
    "converged",
    "outer_iterations",
    "admm_rounds",
    "inner_cap_hits",
)


def certificate_row(summary: dict, kind: str, r: float) -> dict[str, Any]:
    """A table row from a run summary (``summary.json`` or the same fields of a run done here): the
    certificate's :data:`CERT_FIELDS`, the constrained loss (``class1_loss_mean/max`` for Eq. 30,
    ``disparity_mean/max`` and ``disparity_server`` for Eq. 32; none for the QP of Eq. 86), ``wall_time_s``,
    ``status``; a diverged run is a row with ``diverged`` (its message)."""
    if summary.get("status") == "diverged":
        return {"diverged": (summary.get("message") or "diverged").split(":")[0]}
    cert = (summary.get("extras") or {}).get("constrained")
    if cert is None:
        raise ValueError(
            f"run {summary.get('label')!r} seed {summary.get('seed')}: its summary has no "
            f"extras.constrained certificate (not a constrained problem's run)"
        )
    row: dict[str, Any] = {k: cert[k] for k in CERT_FIELDS if k in cert}
    if "objective_clients" in cert:  # f_i(w) of every client: the paper's per-client relative difference
        row["objective_clients"] = list(cert["objective_clients"])
    if kind in DEFAULT_R:  # the QP's equality constraints have no constrained loss
        mean, worst = constraint_loss(cert, kind, r)
        if kind == "fairness":
            row.update(disparity_mean=mean, disparity_max=worst)
            srv = server_disparity(cert, r)
            if srv is not None:
                row["disparity_server"] = srv
        else:
            row.update(class1_loss_mean=mean, class1_loss_max=worst)
    row.update(wall_time_s=float(summary.get("wall_time_s") or 0.0), status=str(cert.get("status", "")))
    return row


# ------------------------------------------------------------------ the QP of Eq. 86 (Table 4)
def qp_errors(inst: dict[str, np.ndarray], w, objective: float) -> dict[str, float]:
    """The distance of ``w`` (objective value ``objective``) to the exact optimum (w*, f*) of Eq. 86
    (:func:`~fedsolve.families.constrained.kind.qp_exact_solution`): ``rel_objective_error`` |f - f*| / |f*|,
    ``rel_solution_error`` ||w - w*||_2 / ||w*||_2, and ``objective_exact`` f*."""
    from fedsolve.families.constrained.kind import qp_exact_solution

    w_star, f_star = qp_exact_solution(inst)
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    return {
        "objective_exact": f_star,
        "rel_objective_error": abs(objective - f_star) / abs(f_star),
        "rel_solution_error": float(np.linalg.norm(w - w_star) / np.linalg.norm(w_star)),
    }


def qp_run(ctx, base: dict[str, Any]) -> dict[str, Any]:
    """One Table-4 cell (Eq. 86, (d, m~) from ``problem.params``): Prox-AL FL until its phase table reaches
    ``done`` (Eq. 11 passed, or ``max_outer``; at most ``simulation.rounds``): the row of :func:`certificate_row`
    (KKT eps1/eps2, ``violation_max`` over all n + 1 parties, K, converged) with ``rounds`` (to Eq. 11),
    ``cpu_time_s``, the errors of :func:`qp_errors` and ``instance`` (d, m~)."""
    from fedsolve.families.constrained.kind import QPParams

    if ctx.args.adopt or ctx.args.adopt_only:
        raise ValueError(
            f"args.adopt: finished `fedsolve compare` runs serve cells of the problem kinds "
            f"{sorted(DEFAULT_R)} only; allowed for {QP_KIND}: adopt: [] and adopt_only: false"
        )
    if ctx.spec.name != "proxal":
        raise ValueError(
            f"algorithms: a {QP_KIND} cell runs Prox-AL FL (name: proxal) to Eq. 11, got "
            f"{ctx.spec.display!r} (name: {ctx.spec.name}); allowed: proxal"
        )
    qp = QPParams(**dict(ctx.experiment().problem.params))
    base = {**base, "instance": f"d={qp.d}, m~={qp.m}", "d": qp.d, "m": qp.m, "adopted": 0, "source": "run"}
    problem = ctx.problem()
    cpu = time.process_time()
    try:
        sim, res = ctx.run(problem, ctx.algorithm(problem))
    except DivergenceError as e:  # a finding, not a crash
        return {**base, "diverged": str(e).split(":")[0]}
    summary = {
        "label": ctx.spec.display,
        "seed": ctx.seed,
        "status": "completed",
        "wall_time_s": res.wall_time_s,
        "extras": res.extras,
    }
    row = certificate_row(summary, QP_KIND, 0.0)
    errors = qp_errors(problem.extras["qp_instance"], res.server["w"].detach().cpu().numpy(), row["objective"])
    return {**base, **row, **errors, "rounds": sim.round, "cpu_time_s": time.process_time() - cpu}


# ------------------------------------------------------------------ the protocol
def cell_context(ctx):
    """The cell's context with the ``set_when`` settings that match its sweep values."""
    extra: dict[str, Any] = {}
    for i, rule in enumerate(ctx.args.set_when):
        unknown = sorted(set(rule.when) - set(ctx.cell))
        if unknown:
            raise ValueError(
                f"args.set_when.{i}.when: {unknown} are not axes of the suite; allowed: "
                f"{sorted(k for k in ctx.cell if k != 'missing')}"
            )
        if all(str(ctx.cell.get(k)) == str(v) for k, v in rule.when.items()):
            extra.update(rule.set)
    return ctx.for_cell({**ctx.cell, **extra}) if extra else ctx


def copy_run(folder: Path, dest: Path) -> Path:
    """A run's small files (summary.json, metrics.jsonl) copied to ``dest/<run folder>/<method>/seed<k>/``; returns
    that folder."""
    target = dest / folder.parent.parent.name / folder.parent.name / folder.name
    target.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "metrics.jsonl"):
        if (folder / name).exists():
            shutil.copy2(folder / name, target / name)
    return target


def cell_run_key(ctx) -> tuple[tuple, str]:
    """(:func:`run_key`, :func:`method_label`) of the cell as a ``fedsolve compare`` run would record it."""
    cfg = ctx.experiment()
    resolved = {
        "problem": {"kind": cfg.problem.kind, "params": dict(cfg.problem.params)},
        "data": {"num_clients": cfg.data.num_clients},
        "simulation": {"rounds": cfg.simulation.rounds},
    }
    return run_key(resolved), method_label(ctx.spec.display, ctx.params())


def _finished(ctx) -> tuple[Path, dict] | None:
    """The finished run under ``args.adopt`` that serves the cell, or None."""
    if not ctx.args.adopt:
        return None
    key, label = cell_run_key(ctx)
    return recorded_runs(ctx.args.adopt, fresh=False).get(key, {}).get(label, {}).get(ctx.seed)


def constrained_run_key(ctx) -> dict:
    """The suite's record of a cell: the cell; with ``adopt_only`` and no finished run yet, the cell marked
    ``missing``, so that ``--resume`` looks again for a run that has finished since."""
    if ctx.args.adopt_only and _finished(cell_context(ctx)) is None:
        return {**ctx.cell, "missing": 1}
    return ctx.cell


def _client_objectives(ctx, w: list[float]) -> list[float]:
    """f_i(w) of every client of the cell's problem (the same parties as the adopted run's: same run key)."""
    import torch

    from fedsolve.families.constrained.kkt import client_objectives

    problem = ctx.problem()
    return client_objectives(problem.extras["constraints"], problem.data, torch.tensor(w, dtype=torch.float64))


def constrained_run(ctx) -> dict[str, Any]:
    """One (method, dataset, n, seed) cell: the finished run under ``args.adopt`` that matches it, else a run
    of the experiment (the same data, w^0 and numbers as ``fedsolve compare --only LABEL --set seeds=[seed]``);
    the row of :func:`certificate_row` with ``n``, ``adopted`` (0/1) and ``source``. A QP cell: :func:`qp_run`."""
    ctx = cell_context(ctx)
    cfg = ctx.experiment()
    if cfg.problem is None or cfg.problem.kind not in KINDS:
        raise ValueError(
            f"protocol constrained_runs: the experiment's problem.kind must be one of "
            f"{sorted(KINDS)}, got {cfg.problem.kind if cfg.problem else None!r}"
        )
    kind = cfg.problem.kind
    if kind == QP_KIND:
        return qp_run(ctx, {"n": cfg.data.num_clients, "method": method_label(ctx.spec.display, ctx.params())})
    r = float(cfg.problem.params.get("r", DEFAULT_R[kind]))
    base = {"n": cfg.data.num_clients, "method": cell_run_key(ctx)[1]}
    found = _finished(ctx)
    if found is not None:
        folder, summary = found
        if ctx.args.copy_to:
            copy_run(folder, Path(ctx.args.copy_to))
        row = certificate_row(summary, kind, r)
        w = (summary.get("extras") or {}).get("constrained", {}).get("w")
        if "objective_clients" not in row and "diverged" not in row and w is not None:
            row["objective_clients"] = _client_objectives(ctx, w)  # a run made before they were recorded
        return {**base, **row, "adopted": 1, "source": str(folder)}
    if ctx.args.adopt_only:
        return {**base, "adopted": 0, "missing": f"no finished run under {ctx.args.adopt}"}
    problem = ctx.problem()
    try:
        _, res = ctx.run(problem, ctx.algorithm(problem))
    except DivergenceError as e:  # a finding, not a crash: the row says so (and keeps n for the tables)
        return {**base, "diverged": str(e).split(":")[0], "adopted": 0, "source": "run"}
    summary = {
        "label": ctx.spec.display,
        "seed": ctx.seed,
        "status": "completed",
        "wall_time_s": res.wall_time_s,
        "extras": res.extras,
    }
    return {**base, **certificate_row(summary, kind, r), "adopted": 0, "source": "run"}
