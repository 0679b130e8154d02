"""FPFC lambda paths driven through ``Simulation``'s public API.

* :func:`warmup_lambda_path`: the warmup path of Sec. 4.3 (spec 2.11), lambda chosen on validation data;
* :func:`lambda_grid`: every lambda of a grid for a fixed number of rounds, each warm-started from the
  previous one's (w, theta, v) (Fig. 1's solution paths).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from fedsolve.families import get_algorithm
from fedsolve.engine.loop import Simulation
from fedsolve.engine.metrics import evaluate


def val_accuracy(sim: Simulation, val_problem) -> float:
    """Mean accuracy of the current models on ``val_problem``'s test split (negative RMSE for regression)."""
    s, _ = evaluate(val_problem, sim.eval_params(), sim.vectorized_eval, ())
    return s.get("test_accuracy", -s.get("test_rmse", float("nan")))


def warmup_lambda_path(problem, lams: Sequence[float], algo_cfg, sim_cfg, seed: int = 0,
                       val_problem=None, tol: float = 1e-4, check_every: int = 1, min_rounds: int = 1,
                       max_rounds_per_lambda: int | None = None, total_rounds: int | None = None,
                       algorithm: str = "fpfc", stop_at_selection: bool = False) -> dict[str, Any]:
    """Warmup lambda path (Sec. 4.3, spec 2.11).

    Train with lams[0] from the initial state; every ``check_every`` rounds compute the validation
    accuracy (``val_problem``: same clients, the validation split as its *test* split; negative RMSE
    for regression). Switch to the next lambda, warm-starting from the current (w, theta, v), when the
    change since the last check is below ``tol`` (after ``min_rounds``) or after
    ``max_rounds_per_lambda``. The validation accuracy at the switch is that lambda's score. As soon
    as a lambda scores below the previous one, go back to the best lambda's saved state and train it
    until ``total_rounds`` (default ``sim_cfg.rounds``) is used up. ``stop_at_selection`` returns as
    soon as the lambda is chosen (state = the best lambda's saved state; ``rounds_used`` says how many
    rounds were spent), e.g. to continue training on train + validation data. Returns the best lambda,
    the switch rounds, per-lambda scores, the final Simulation and its validation history.
    """
    val_problem = problem if val_problem is None else val_problem
    cfg = dict(algo_cfg) if isinstance(algo_cfg, dict) else algo_cfg.model_dump()
    algo = get_algorithm(algorithm)({**cfg, "lam": lams[0]}, problem)
    sim = Simulation(problem, algo, sim_cfg, seed=seed)
    total = sim_cfg.rounds if total_rounds is None else total_rounds
    s, start, stopped = 0, 0, False
    scores: list[tuple[float, float]] = []
    switches: list[tuple[int, float]] = [(0, lams[0])]
    history: list[dict[str, float]] = []
    best = None  # (score, lam, server, clients)
    prev_acc = val_accuracy(sim, val_problem)
    while sim.round < total:
        sim.step()
        t = sim.round
        if (t - start) % check_every and t < total:
            continue
        acc = val_accuracy(sim, val_problem)
        history.append({"round": t, "lam": algo.cfg.lam, "val_accuracy": acc})
        converged = (t - start) >= min_rounds and abs(acc - prev_acc) < tol
        budget = max_rounds_per_lambda is not None and (t - start) >= max_rounds_per_lambda
        prev_acc = acc
        if stopped or not (converged or budget):
            continue
        lam = algo.cfg.lam
        scores.append((lam, acc))
        if best is not None and acc < best[0]:
            # worse than the previous lambda: return to the best model and train it to the end
            _, lam_b, srv, cl = best
            sim.set_state(copy.deepcopy(srv), cl.clone())
            sim.set_hparams(lam=lam_b)
            switches.append((t, lam_b))
            stopped = True
            if stop_at_selection:
                break
            continue
        server, clients = sim.state()
        best = (acc, lam, copy.deepcopy(server), clients.clone())
        if s + 1 < len(lams):
            s += 1
            sim.set_hparams(lam=lams[s])
            switches.append((t, lams[s]))
            start = t
        else:
            stopped = True
            if stop_at_selection:
                break
    return {"best_lambda": algo.cfg.lam, "switches": switches, "scores": scores, "history": history,
            "rounds_used": sim.round, "simulation": sim, "algorithm": algo, "wall_time_s": sim.elapsed}


def lambda_grid(sim: Simulation, lams: Sequence[float], rounds: int,
                record: Callable[[Simulation, float], dict[str, Any]]) -> list[dict[str, Any]]:
    """``rounds`` rounds at every lambda of ``lams`` in turn, each warm-started from the state the previous
    lambda left; ``record(sim, lam)`` after each lambda gives one entry of the returned list."""
    out = []
    for lam in lams:
        sim.set_hparams(lam=lam)
        for _ in range(rounds):
            sim.step()
        out.append(record(sim, lam))
    return out
