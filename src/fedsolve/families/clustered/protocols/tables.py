"""The per-cell protocols of the FPFC paper's tables and figures (run by ``fedsolve suite``).

Each function runs ONE cell of a suite (an algorithm, a seed, the sweep's values) as runs of ``Simulation`` (their
protocols as schedules, ``protocols.path`` and ``protocols.async_fpfc``) and returns a row (or rows) of metrics;
``ctx`` is the suite's cell context (``fedsolve.experiments.suite.Context``: the cell, the typed ``args``, the
experiment's data, problem, algorithm parameters and simulation settings). Each ``*Args`` model is the protocol's
typed arguments.

* :func:`lambda_path`  Fig. 1: FPFC along a warm-started lambda grid, fused groups per lambda;
* :func:`attack_grid`  Fig. 7 / E.2 / E.3: benign devices' accuracy under a Byzantine attack;
* :func:`newcomers`    Table 3: train on 80% of the devices, each method's rule for the other 20%;
* :func:`fpfc_tuning`  Table 1 (S1) and Table 2: FPFC with one lambda, the warmup path or one run per lambda;
* :func:`tuning`       a baseline's hyper-parameter chosen on validation, retrained and scored on test;
* :func:`oracle_gap`   Theorem 3: FPFC against the exact oracle estimator over rounds.
"""

from __future__ import annotations

import time
from typing import Any, Literal, cast

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedsolve.data.federated import FederatedData
from fedsolve.engine import Simulation
from fedsolve.engine.metrics import evaluate
from fedsolve.families.clustered.byzantine import Attack, attack_surface, benign_mask
from fedsolve.families.clustered.clusters import adjusted_rand
from fedsolve.families.clustered.protocols.newcomers import newcomer_models, train_losses
from fedsolve.families.clustered.protocols.path import LambdaGrid, val_accuracy, warmup_lambda_path


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _PicksArgs(_Args):
    picks: dict[str, dict[str, dict[int, Any]]] = Field(
        default_factory=dict,
        description="per algorithm label, {parameter: {seed: value}}: each seed's pick of a tuning made on validation "
        "elsewhere (e.g. Table 1's), set on that seed's run; a seed a pick lacks is an error",
    )


def test_accuracy(problem, params) -> float:
    """Mean test accuracy over the clients of ``problem`` with the flat parameters ``params`` ``[m, d]``."""
    return float(evaluate(problem, params, which=())[0]["test_accuracy"])


def train_validation(data: FederatedData, seed: int, fraction: float = 0.2) -> tuple[FederatedData, FederatedData]:
    """(train/test data, train/validation data): each device's training split cut at random into
    (1 - fraction) / fraction (``FederatedData.split_validation``); the first keeps the original test split."""
    va = data.split_validation(fraction, seed)
    tr = [va.client_train(i) for i in range(data.num_clients)]
    te = [data.client_test(i) for i in range(data.num_clients)]
    return FederatedData.from_client_arrays(
        tr,
        te,
        task=data.task,
        num_classes=data.num_classes,
        name=data.name,
        meta=dict(data.meta),
        clusters=data.clusters.tolist() if data.clusters is not None else None,
    ), va


def clusters_found(labels, truth) -> dict[str, float]:
    """Number of clusters and ARI against ``truth`` (where known)."""
    labels = np.asarray(labels)
    out = {"num_clusters": float(labels.max() + 1)}
    if truth is not None:
        out["ari"] = float(adjusted_rand(labels, np.asarray(truth)))
    return out


# ------------------------------------------------------------------ Fig. 1
class LambdaPathArgs(_Args):
    grid: list[float] = Field(..., min_length=1, description="increasing lambda grid, each point warm-started")
    rounds: int = Field(300, ge=1, description="rounds per lambda")


class PathRecord:
    """Callback of :func:`lambda_path`: at the end of every lambda (an evaluation at a multiple of ``rounds``), the
    fused groups, their ARI against the true groups, the slopes w_i and their largest spread inside a true group."""

    def __init__(self, algo, rounds: int):
        problem = algo.problem
        self.algo, self.rounds = algo, rounds
        self.truth = problem.data.clusters.numpy()
        self.start = next(e for e in problem.layout.entries if e.name.endswith("weight")).start
        self.rows: list[dict] = []

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        pass

    def on_eval(self, sim, record):
        if record["round"] == 0 or record["round"] % self.rounds:
            return
        server, truth = sim.state()[0], self.truth
        labels = self.algo.cluster_labels(server)
        w = server["W"][:, self.start].numpy()
        groups = np.unique(truth)
        self.rows.append(
            {
                "lam": record["lam"],
                "groups": int(labels.max() + 1),
                "ari": float(adjusted_rand(labels, truth)),
                "slopes": w.tolist(),
                "spread": float(max(np.ptp(w[truth == g]) for g in groups)),
                "centres": [float(w[truth == g].mean()) for g in groups],
            }
        )

    def on_end(self, sim):
        pass


def lambda_path(ctx) -> list[dict]:
    """FPFC (the cell's penalty) with every device active along ``grid`` (the schedule ``lambda_grid``); per
    lambda the fused groups, their ARI against the true groups, the slopes w_i and their largest spread inside a
    true group."""
    a = ctx.args
    problem = ctx.problem()
    algo = ctx.algorithm(problem)
    rec = PathRecord(algo, a.rounds)
    sim = Simulation(
        problem,
        algo,
        ctx.sim_config(a.rounds * len(a.grid), eval_every=a.rounds),
        seed=ctx.seed,
        callbacks=[rec],
        schedule=LambdaGrid(grid=a.grid, rounds=a.rounds),
    )
    sim.run()
    return rec.rows


def _check_field(ctx, param: str, where: str) -> None:
    """``param`` is a field of the cell's method's config (else a ValueError naming ``where`` and the fields)."""
    from fedsolve.families import get_algorithm

    fields = get_algorithm(ctx.spec.name).Config.model_fields
    if param not in fields:
        raise ValueError(f"{where}: {ctx.spec.name} has no field {param!r}; allowed: {sorted(fields)}")


def _seed_picks(ctx, picks: dict[str, dict[str, dict[int, Any]]]) -> dict[str, Any]:
    """The cell's method's picks for the cell's seed (``args.picks`` of newcomers and attack_grid), every label and
    field checked."""
    labels = [s.display for s in ctx.experiment().all_algorithms()]
    unknown = sorted(set(picks) - set(labels))
    if unknown:
        raise ValueError(f"args.picks: {unknown} not in the experiment; allowed: {labels}")
    label, out = ctx.spec.display, {}
    for param, by_seed in picks.get(label, {}).items():
        _check_field(ctx, param, f"args.picks.{label}")
        if ctx.seed not in by_seed:
            raise ValueError(f"args.picks.{label}.{param}: no pick for seed {ctx.seed}; given seeds {sorted(by_seed)}")
        out[param] = by_seed[ctx.seed]
    return out


def picks_check(ctx) -> None:
    """The cell's picks can be applied (``args.picks``: known labels and fields, a pick for the cell's seed)."""
    _seed_picks(ctx, ctx.args.picks)


# ------------------------------------------------------------------ Fig. 7 / E.2 / E.3
class AttackGridArgs(_PicksArgs):
    attacker_view: Literal["own", "server"] = Field("own", description="what a malicious device trains from")
    attack_block: str | None = Field(None, description="corrupt only this block of each upload (null: all)")


def attack_grid_key(ctx) -> dict:
    """No malicious device (fraction 0) or no upload (LOCAL): the attack never acts, one run serves all."""
    c = ctx.cell
    if c["fraction"] == 0 or attack_surface_of(ctx) is None:
        return {**c, "attack": "none"}
    return c


def attack_surface_of(ctx):
    """The upload key of the cell's solver's model (None: it uploads none)."""
    from fedsolve.families import get_algorithm

    surface = attack_surface(get_algorithm(ctx.spec.name))
    return None if surface is None else surface.model


def attack_grid(ctx) -> dict:
    """The cell's algorithm with a share ``fraction`` of malicious devices running ``attack`` (the wrapper
    ``attack``); the benign devices' mean test accuracy at the end. An algorithm without an own view (CFL uploads
    updates) follows the server."""
    from fedsolve.families import get_algorithm

    c, a = ctx.cell, ctx.args
    problem = ctx.problem()
    surface = attack_surface(get_algorithm(ctx.spec.name))
    assert surface is not None, "the attack grid runs solvers that declare an attack surface (Attack needs one)"
    view = a.attacker_view if surface.view is not None or surface.model is None else "server"
    picks = _seed_picks(ctx, a.picks)
    algo = Attack(
        ctx.algorithm(problem, picks or None),
        attack=c["attack"],
        malicious_fraction=c["fraction"],
        attack_seed=ctx.seed,
        attacker_view=view,
        attack_block=a.attack_block,
    )
    _, res = ctx.run(problem, algo)
    acc = np.array([d.get("accuracy", np.nan) for d in res.per_client], dtype=np.float64)
    row: dict[str, Any] = {"benign_accuracy": float(np.nanmean(acc[benign_mask(algo).numpy()]))}
    row.update({f"pick_{k}": v for k, v in picks.items()})  # the value each run used, in its row
    return row


# ------------------------------------------------------------------ Table 3
class NewcomersArgs(_PicksArgs):
    newcomer_rounds: int = Field(100, ge=1, description="rounds of newcomer training")
    share: float = Field(0.2, gt=0, lt=1, description="share of each true cluster that joins late")
    lam: float | None = Field(None, description="FPFC's lambda (null: the experiment's)")


def split_old_new(data, seed: int, share: float = 0.2) -> tuple[list[int], list[int]]:
    """A fixed random ``share`` of each true cluster (at least one device) are the newcomers."""
    rng = np.random.default_rng(20_000 + seed)
    cl = data.clusters.numpy()
    new = []
    for c in np.unique(cl):
        members = np.flatnonzero(cl == c)
        new += rng.choice(members, size=max(1, round(share * members.size)), replace=False).tolist()
    new = sorted(new)
    old = [i for i in range(data.num_clients) if i not in set(new)]
    return old, new


def newcomers(ctx) -> dict:
    """Train the cell's method on the old devices, then its own newcomer rule
    (``fedsolve.families.clustered.protocols.newcomers``); the newcomers' mean test accuracy and, for a clustering
    method, the clusters it found on the old devices."""
    a = ctx.args
    data = ctx.data()
    old, new = split_old_new(data, ctx.seed, a.share)
    p_old, p_new = ctx.problem(data, old, "old"), ctx.problem(data, new, "newcomers")
    extra = {"lam": a.lam} if ctx.spec.name == "fpfc" and a.lam is not None else {}
    picks = _seed_picks(ctx, a.picks)
    extra.update(picks)
    algo = ctx.algorithm(p_old, extra or None)
    if ctx.spec.name == "local":  # nothing to train on the old devices
        server, final = {}, {}
    else:
        _, res = ctx.run(p_old, algo)
        server, final = res.server, res.extras
    W = newcomer_models(algo, server, p_new, rounds=a.newcomer_rounds, seed=ctx.seed)
    row: dict[str, Any] = {"newcomer_accuracy": test_accuracy(p_new, W), "old": len(old), "new": len(new)}
    row.update({k: float(final[k]) for k in ("num_clusters", "ari") if k in final and "num_clusters" in final})
    row.update({f"pick_{k}": v for k, v in picks.items()})  # the value each run used, in its row
    return row


# ------------------------------------------------------------------ Table 1 (S1) / Table 2
class FPFCTuningArgs(_Args):
    lam: float = Field(0.6, description="strategy fixed: the lambda")
    grid: list[float] | None = Field(
        None,
        description="warmup / separate: the lambda grid (null: the paper's; "
        "warmup 0, 0.5, ..., 3.5, separate 0.2, ..., 1.0)",
    )
    tol: float = Field(1e-4, description="warmup: switch when validation changes less than this between checks")
    check_every: int = Field(5, ge=1, description="warmup: rounds between validation checks")
    max_per_lambda: int = Field(400, ge=1, description="warmup: at most this many rounds per lambda")
    eval_every: int = Field(100, ge=1, description="evaluation cadence of the runs")
    validation: bool = Field(
        True,
        description="cut each device's training data 80/20 into train/validation "
        "(false: train on all of it, as the authors' code)",
    )
    refit_full: bool = Field(
        False, description="warmup: once lambda is chosen, train the remaining rounds on train + validation"
    )
    data_seed: int | None = Field(None, description="draw the data once with this seed (null: per seed)")


def _measure(data: FederatedData) -> str:
    """What a split is scored by: ``accuracy``, or ``rmse`` for regression."""
    return "accuracy" if data.task == "classification" else "rmse"


def _fpfc_score(sim, algo, problem) -> dict:
    """Test accuracy (RMSE for regression) of the cluster models and of each device's own w_i, clusters, ARI."""
    metric = f"test_{_measure(problem.data)}"
    s, _ = evaluate(problem, sim.eval_params(), which=())
    own, _ = evaluate(problem, sim.state()[0]["W"], which=())
    lab = algo.cluster_labels(sim.state()[0])
    return {
        metric: s[metric],
        f"{metric}_own_w": own[metric],
        "num_clusters": int(lab.max() + 1),
        "ari": float(adjusted_rand(lab, problem.data.clusters.numpy())),
        "cluster_sizes": np.bincount(lab).tolist(),
    }


def fpfc_tuning(ctx) -> dict:
    """FPFC on one data draw with the cell's ``strategy``: ``fixed`` (one lambda), ``warmup`` (the warmup
    path of Sec. 4.3 over ``grid``, lambda chosen on validation) or ``separate`` (one run per lambda, the best
    validation accuracy, or RMSE for regression); the chosen lambda, test accuracy or RMSE (cluster models and own
    w_i), clusters, ARI and the whole tuning's wall time."""
    a, strategy = ctx.args, ctx.cell["strategy"]
    grid = a.grid or ([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5] if strategy == "warmup" else [0.2, 0.4, 0.6, 0.8, 1.0])
    data = ctx.data(a.data_seed if a.data_seed is not None else ctx.seed)
    full = ctx.problem(data)
    if a.validation:
        tr, va = train_validation(data, ctx.seed)
        problem, val = ctx.problem(tr), ctx.problem(va)
    else:
        problem = val = full
    t0 = time.perf_counter()

    def fixed(lam: float) -> dict:
        algo = ctx.algorithm(problem, {"lam": lam})
        sim, _ = ctx.run(problem, algo, eval_every=a.eval_every)
        out = _fpfc_score(sim, algo, problem)
        score = val_accuracy(sim, val)  # higher is better: accuracy, or minus the RMSE for regression
        out[f"val_{_measure(data)}"] = abs(score)
        return dict(out, lam=lam, val_score=score)

    if strategy == "fixed":
        out = fixed(a.lam)
    elif strategy == "separate":
        runs = [fixed(lam) for lam in grid]
        out = dict(max(runs, key=lambda r: r["val_score"]))  # ties: the first
        keys = ("lam", "val_accuracy", "test_accuracy", "val_rmse", "test_rmse", "num_clusters", "ari")
        out["grid"] = [{k: r[k] for k in keys if k in r} for r in runs]
    elif strategy == "warmup":
        r = warmup_lambda_path(
            problem,
            grid,
            ctx.params(extra={"lam": grid[0]}),
            ctx.sim_config(eval_every=a.eval_every),
            seed=ctx.seed,
            val_problem=val,
            tol=a.tol,
            check_every=a.check_every,
            min_rounds=a.check_every,
            max_rounds_per_lambda=a.max_per_lambda,
            stop_at_selection=a.refit_full,
            algorithm=ctx.spec.name,
        )
        sim, algo = r["simulation"], r["algorithm"]
        if a.refit_full:  # the remaining rounds with the chosen lambda on train + validation data, from its state
            algo = ctx.algorithm(full, {"lam": r["best_lambda"]})
            refit = Simulation(full, algo, ctx.sim_config(eval_every=a.eval_every), seed=ctx.seed)
            refit.set_state(*sim.state())
            refit.start_round = r["rounds_used"]
            refit.run()
            sim = refit
        out = _fpfc_score(sim, algo, full)
        # per-lambda validation scores: accuracy, or the RMSE (the path ranks minus the RMSE) for regression
        scores = [(float(lam), abs(float(v))) for lam, v in r["scores"]]
        out.update(lam=r["best_lambda"], switches=r["switches"], scores=scores)
    else:
        raise ValueError(f"strategy: unknown {strategy!r}; allowed: fixed, warmup, separate")
    out["tuning_wall_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------ baselines tuned on validation
class TuningArgs(_Args):
    param: str = Field(..., description="the hyper-parameter tuned (a field of the method's config)")
    grid: list[Any] = Field(..., min_length=1, description="candidate values (ties: the first)")
    tune_rounds: int | None = Field(None, ge=1, description="rounds of each tuning run (null: the experiment's)")


def tuning_check(ctx) -> None:
    """``args.param`` is a field of the cell's method."""
    _check_field(ctx, ctx.args.param, "args.param")


def tuning(ctx) -> dict:
    """Each grid value trained on 64% of each device's data and scored on the 16% validation part (PACFL:
    grid values that give the same one-shot partition share one run); the best value retrained on the full
    training split and scored on test (accuracy, clusters, ARI)."""
    from fedsolve.families import get_algorithm
    from fedsolve.families.clustered.baselines import PACFLConfig, pacfl_bases, pacfl_clusters, pacfl_proximity

    a = ctx.args
    name = ctx.spec.name
    tuning_check(ctx)
    data = ctx.data()
    tr, va = train_validation(data, ctx.seed)
    p_tr, p_va, full = ctx.problem(tr), ctx.problem(va), ctx.problem(data)

    def scored(problem, eval_problem, value, rounds):
        algo = ctx.algorithm(problem, {a.param: value})
        sim, res = ctx.run(problem, algo, rounds)
        acc = evaluate(eval_problem, sim.eval_params(), which=())[0]["test_accuracy"]
        lab = res.extras.get("clusters")
        truth = problem.data.clusters
        return {
            "acc": float(acc),
            "num_clusters": int(max(lab) + 1) if lab is not None else None,
            "ari": float(adjusted_rand(lab, truth.numpy())) if lab is not None and truth is not None else None,
        }

    if name == "pacfl":
        cfg = cast(PACFLConfig, get_algorithm("pacfl").Config(**ctx.params()))  # the pacfl solver's Config
        prox = pacfl_proximity(pacfl_bases(tr, cfg.n_basis, cfg.per_class))
    keys, runs = {}, []
    for v in a.grid:
        key = tuple(pacfl_clusters(prox, v, cfg.linkage).tolist()) if name == "pacfl" else v
        if key not in keys:
            keys[key] = scored(p_tr, p_va, v, a.tune_rounds)
        runs.append({"value": v, "val_acc": keys[key]["acc"], "val_num_clusters": keys[key]["num_clusters"]})
    best = max(runs, key=lambda r: r["val_acc"])
    final = scored(full, full, best["value"], None)
    return {
        "chosen": best["value"],
        "grid": runs,
        "distinct_runs": len(keys),
        "test_accuracy": final["acc"],
        "num_clusters": final["num_clusters"],
        "ari": final["ari"],
    }


# ------------------------------------------------------------------ Theorem 3
class OracleGapArgs(_Args):
    eval_every: int = Field(500, ge=1, description="rounds between the recorded evaluations")
    algorithm: str = Field("FPFC", description="label of the experiment's FPFC spec")


class OracleGap:
    """Callback: at every evaluation, the training-objective gap of the evaluation models to the oracle's."""

    def __init__(self, problem, oracle: torch.Tensor):
        self.loss = lambda params: train_losses(problem, params)  # [m, d] -> f_i, [m]
        self.oracle_loss = self.loss(oracle)
        self.rows: list[dict] = []

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        pass

    def on_eval(self, sim, record):
        gap = (self.loss(sim.eval_params()) - self.oracle_loss).mean()
        self.rows.append(
            {
                "round": record["round"],
                "test_accuracy": record.get("test_accuracy"),
                "num_clusters": record.get("num_clusters"),
                "ari": record.get("ari"),
                "loss_gap": float(gap),
            }
        )

    def on_end(self, sim):
        pass


def oracle_gap(ctx) -> list[dict]:
    """The oracle estimator (true clusters, per cluster the exact minimizer of sum_i f_i; Newton to a gradient
    below 1e-9) and FPFC's evaluation models at every ``eval_every`` rounds: one row per evaluation with
    FPFC's test accuracy, the objective gap to the oracle, clusters, ARI, and the oracle's accuracy."""
    from fedsolve.families.clustered.oracle import oracle_models

    a = ctx.args
    problem = ctx.problem()
    t0 = time.perf_counter()
    oracle, gmax = oracle_models(problem, problem.data.clusters.numpy())
    oracle_s = time.perf_counter() - t0
    acc_oracle = test_accuracy(problem, oracle)
    cb = OracleGap(problem, oracle)
    ctx = ctx.for_cell({**ctx.cell, "algorithm": a.algorithm})
    _, res = ctx.run(problem, ctx.algorithm(problem), eval_every=a.eval_every, callbacks=[cb])
    return [
        dict(
            t,
            algorithm=a.algorithm,
            oracle_accuracy=acc_oracle,
            oracle_grad_max=gmax,
            oracle_s=oracle_s,
            fpfc_wall_s=res.wall_time_s,
        )
        for t in cb.rows
    ]
