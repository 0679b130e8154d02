"""FPFC's lambda paths, as schedules of the engine's one loop (``engine/schedules.py``).

* :class:`WarmupPath` (``warmup_path``): the warmup path of Sec. 4.3 (spec 2.11), lambda chosen on validation data;
* :class:`LambdaGrid` (``lambda_grid``): every lambda of a grid for a fixed number of rounds, each warm-started
  from the state the previous one left, (w, theta, v) (Fig. 1's solution paths).

A config selects one under its algorithm::

    algorithm:
      name: fpfc
      schedule: {kind: warmup_path, grid: [0.0, 0.5, 1.0, 1.5], check_every: 5, max_rounds_per_lambda: 100}

Both change ``lam`` through ``Simulation.set_hparams`` and log it (with the validation score, for the warmup path)
in the evaluation records. Their state (the position on the path; the warmup path's scores and the saved state of
its best lambda) is part of every checkpoint, so an interrupted path resumes to the uninterrupted run's numbers.
:func:`warmup_lambda_path` runs the warmup path from Python (the suites' ``fpfc_tuning`` protocol).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import lookup_algorithm
from fedsolve.engine.loop import Simulation
from fedsolve.engine.metrics import evaluate
from fedsolve.engine.schedules import Decision, Schedule, register_schedule


def val_accuracy(sim: Simulation, val_problem) -> float:
    """Mean accuracy of the current models on ``val_problem``'s test split (negative RMSE for regression)."""
    s, _ = evaluate(val_problem, sim.eval_params(), which=())
    return s.get("test_accuracy", -s.get("test_rmse", float("nan")))


def check_lam(kind: str, algo) -> None:
    """``algo`` has the fusion penalty ``lam`` that schedule ``kind`` moves along its path."""
    if "lam" not in type(algo.cfg).model_fields:
        raise ValueError(
            f"schedule.kind: {kind} moves FPFC's fusion penalty lam, which {algo.name} does not have; "
            f"allowed: an algorithm with lam (fpfc, fpfc_l1, async_fpfc)"
        )


class WarmupPathConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grid: list[float] = Field(
        ..., min_length=1, description="the lambdas in the order they are tried (the paper: increasing, from 0)"
    )
    tol: float = Field(
        1e-4, ge=0, description="switch when the validation score changes less than this between two checks"
    )
    check_every: int = Field(1, ge=1, description="rounds between validation checks")
    min_rounds: int = Field(1, ge=0, description="rounds at a lambda before a switch on tol")
    max_rounds_per_lambda: int | None = Field(
        None, ge=1, description="switch after this many rounds at a lambda (null: no limit)"
    )
    stop_at_selection: bool = Field(
        False, description="end the run once lambda is chosen, in the state of the chosen lambda"
    )


@register_schedule
class WarmupPath(Schedule):
    """FPFC's warmup lambda path (Sec. 4.3, spec 2.11).

    Train with ``grid[0]``; every ``check_every`` rounds compute the validation score (``val_problem``: the same
    clients with the validation split as their *test* split; default the run's problem, its test split; accuracy,
    or negative RMSE for regression). Switch to the next lambda, warm-started from the current (w, theta, v), when
    the score changed less than ``tol`` since the last check (after ``min_rounds``) or after
    ``max_rounds_per_lambda``; the score at the switch is that lambda's. As soon as a lambda scores below the
    previous one, go back to the best lambda's saved state and train it until the run's rounds are used up
    (``stop_at_selection``: end the run there). When the rounds run out first, the lambda in force is scored at the
    last round and the better of it and the best before it is the choice (its state restored): the path never ends
    on a lambda it switched to but did not train."""

    name = "warmup_path"
    description = (
        "FPFC's warmup lambda path (Sec. 4.3): the next lambda when the validation score settles, back "
        "to the best when it drops"
    )

    def __init__(self, val_problem=None, /, **params: Any):  # the validation problem: from Python only
        self.cfg = WarmupPathConfig(**params)
        self.val_problem = val_problem
        self.at = 0  # position on the grid
        self.since = 0  # the round the current lambda started at
        self.stopped = False  # lambda chosen
        self.lam = self.cfg.grid[0]  # the lambda in force
        self.prev: float | None = None
        self.scores: list[tuple[float, float]] = []
        self.switches: list[tuple[int, float]] = [(0, self.cfg.grid[0])]
        self.history: list[dict[str, float]] = []
        self.best: tuple[float, float, dict, ClientStates] | None = None  # (score, lam, server, clients)

    def check(self, algo, cfg) -> None:
        check_lam(self.name, algo)

    def score(self, run) -> float:
        return val_accuracy(run, run.problem if self.val_problem is None else self.val_problem)

    def start(self, run) -> None:
        self.check(run.algo, run.cfg)
        if run.algo.cfg.lam != self.cfg.grid[0]:
            run.set_hparams(lam=self.cfg.grid[0])
        self.prev = self.score(run)

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        c, t = self.cfg, round_ + 1
        if (t - self.since) % c.check_every and t < run.cfg.rounds:
            return Decision()
        acc, lam = self.score(run), run.algo.cfg.lam
        assert self.prev is not None, "start (or the restored state) scores the model before the first round"
        self.history.append({"round": t, "lam": lam, "val_accuracy": acc})
        converged = (t - self.since) >= c.min_rounds and abs(acc - self.prev) < c.tol
        budget = c.max_rounds_per_lambda is not None and (t - self.since) >= c.max_rounds_per_lambda
        last = t >= run.cfg.rounds  # the run's rounds are used up: choose among the lambdas scored, never a new one
        self.prev = acc
        stop = False
        if not self.stopped and (converged or budget or last):
            self.scores.append((lam, acc))
            if self.best is not None and acc < self.best[0]:
                # worse than the previous lambda: back to the best one's state, trained to the end
                _, lam_b, server, clients = self.best
                run.set_state(copy.deepcopy(server), clients.clone())
                run.set_hparams(lam=lam_b)
                self.switches.append((t, lam_b))
                self.stopped, stop = True, c.stop_at_selection
            else:
                server, clients = run.state()
                self.best = (acc, lam, copy.deepcopy(server), clients.clone())
                if self.at + 1 < len(c.grid) and not last:
                    self.at += 1
                    run.set_hparams(lam=c.grid[self.at])
                    self.switches.append((t, c.grid[self.at]))
                    self.since = t
                else:
                    self.stopped, stop = True, c.stop_at_selection
        self.lam = run.algo.cfg.lam
        return Decision(log={"lam": self.lam, "val_accuracy": acc}, stop=stop)

    def state_dict(self) -> dict[str, Any]:
        best = None
        if self.best is not None:
            score, lam, server, clients = self.best
            best = {"score": score, "lam": lam, "server": server, "clients": clients.compact_state_dict()}
        return {
            "at": self.at,
            "since": self.since,
            "stopped": self.stopped,
            "lam": self.lam,
            "prev": self.prev,
            "scores": list(self.scores),
            "switches": list(self.switches),
            "history": list(self.history),
            "best": best,
        }

    def load_state_dict(self, run, state: dict[str, Any]) -> None:
        self.at, self.since, self.stopped, self.prev = state["at"], state["since"], state["stopped"], state["prev"]
        self.lam = state["lam"]
        self.scores, self.switches = list(state["scores"]), list(state["switches"])
        self.history = list(state["history"])
        b = state["best"]
        self.best = (
            None
            if b is None
            else (
                b["score"],
                b["lam"],
                copy.deepcopy(b["server"]),
                ClientStates.load(b["clients"], run.problem.num_clients),
            )
        )

    def summary(self) -> dict[str, Any]:
        """The lambda in force at the end (the chosen one once the path has stopped), the switches (round,
        lambda) and each finished lambda's validation score."""
        return {
            "best_lambda": self.lam,
            "lambda_chosen": self.stopped,
            "switches": [list(s) for s in self.switches],
            "scores": [list(s) for s in self.scores],
        }


class LambdaGridConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grid: list[float] = Field(
        ..., min_length=1, description="the lambdas in turn, each warm-started from the previous one's state"
    )
    rounds: int = Field(..., ge=1, description="rounds per lambda")


@register_schedule
class LambdaGrid(Schedule):
    """``rounds`` rounds at every lambda of ``grid`` in turn, each warm-started from the state the previous lambda
    left (Fig. 1's solution paths); evaluated at the end of every lambda (and at the configured cadence). The run
    takes ``len(grid) * rounds`` rounds."""

    name = "lambda_grid"
    description = "FPFC along a lambda grid (Fig. 1): a fixed number of rounds per lambda, each warm-started"

    def __init__(self, **params: Any):
        self.cfg = LambdaGridConfig(**params)

    @property
    def total(self) -> int:
        return len(self.cfg.grid) * self.cfg.rounds

    def check(self, algo, cfg) -> None:
        check_lam(self.name, algo)
        if cfg.rounds != self.total:
            raise ValueError(
                f"simulation.rounds: the lambda grid takes {self.total} rounds ({len(self.cfg.grid)} "
                f"lambdas x {self.cfg.rounds}); got {cfg.rounds}"
            )

    def start(self, run) -> None:
        self.check(run.algo, run.cfg)

    def before_round(self, run, round_: int):
        if round_ % self.cfg.rounds == 0:
            run.set_hparams(lam=self.cfg.grid[round_ // self.cfg.rounds])
        return None

    def after_round(self, run, round_: int, info: dict[str, Any]) -> Decision:
        done = round_ + 1
        return Decision(
            log={"lam": run.algo.cfg.lam},
            evaluate=True if done % self.cfg.rounds == 0 else None,
            stop=done >= self.total,
        )


def warmup_lambda_path(
    problem,
    lams: Sequence[float],
    algo_cfg,
    sim_cfg,
    seed: int = 0,
    val_problem=None,
    tol: float = 1e-4,
    check_every: int = 1,
    min_rounds: int = 1,
    max_rounds_per_lambda: int | None = None,
    algorithm: str = "fpfc",
    stop_at_selection: bool = False,
) -> dict[str, Any]:
    """The warmup path (:class:`WarmupPath`) of ``algorithm`` with the config ``algo_cfg`` on ``problem`` for
    ``sim_cfg.rounds`` rounds. Returns the chosen lambda, the switch rounds, per-lambda scores, every check's
    validation score (``history``), the rounds used, the finished Simulation and its algorithm."""
    cfg = dict(algo_cfg) if isinstance(algo_cfg, dict) else algo_cfg.model_dump()
    algo = lookup_algorithm(algorithm)({**cfg, "lam": lams[0]}, problem)
    path = WarmupPath(
        val_problem,
        grid=list(lams),
        tol=tol,
        check_every=check_every,
        min_rounds=min_rounds,
        max_rounds_per_lambda=max_rounds_per_lambda,
        stop_at_selection=stop_at_selection,
    )
    sim = Simulation(problem, algo, sim_cfg, seed=seed, schedule=path)
    sim.run()
    return {
        "best_lambda": path.lam,
        "switches": path.switches,
        "scores": path.scores,
        "history": path.history,
        "rounds_used": sim.round,
        "simulation": sim,
        "algorithm": algo,
        "wall_time_s": sim.elapsed,
    }
