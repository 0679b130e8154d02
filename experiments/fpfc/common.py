"""Shared helpers of the FPFC driver scripts (robustness.py, table2_tuning.py, table3_newcomers.py)."""
from __future__ import annotations

import argparse
import functools
import importlib.util
import inspect
import json
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch

from fedsolve.algorithms import get_algorithm
from fedsolve.data.federated import FederatedData
from fedsolve.data.synthetic import fpfc_synthetic
from fedsolve.models import build_model_fn
from fedsolve.problems import FederatedProblem
from fedsolve.simulation import Simulation, SimulationConfig
from fedsolve.simulation.loop import atomic_write_text

#: the synthetic protocol of the paper (Sec. 6.1): 10 full-batch GD steps, lr 0.1, w0 ~ N(0, 0.1^2) for FPFC (the code: N(0, 1))
SYN_DEFAULTS = {"lr": 0.1, "local_epochs": 10, "batch_size": None}
FPFC_DEFAULTS = {"lam": 0.6, "rho": 1.0, "a": 3.7, "xi": 1e-4, "nu": 0.1, "init_std": 0.1}

FPFC_PAPER = {  # spec 4.4: Table 1 (S1) and Table E.2 (S3), FPFC row; Table 2 selected lambda
    "S1": {"acc": 0.8946, "num": 4.0, "ari": 1.0, "lam_separate": 0.5, "lam_warmup": 3.0},
    "S2": {"acc": 0.9022, "num": 11.67, "ari": 0.97},
    "S3": {"acc": 0.9006, "num": 2.0, "ari": 1.0},
    "S4": {"acc": 0.9099, "num": 1.0, "ari": 1.0},
    "S5": {"acc": 0.8027, "num": 50.0, "ari": 1.0},
}


def synthetic_problem(scenario="S1", seed=0, features="uniform", size_scale=1.0, max_size=None, clients=None):
    data = fpfc_synthetic(scenario, seed=seed, features=features, size_scale=size_scale, max_size=max_size)
    if clients is not None:
        data = data.subset(list(clients))
    return FederatedProblem(data, build_model_fn("logreg", (60,), 10), name=str(scenario))


def split_validation(data: FederatedData, seed: int, frac: float = 0.2):
    """(train/test problem data, train/validation data): each device's train split cut 80/20 at random
    (``FederatedData.split_validation``; the first keeps the original test split)."""
    va = data.split_validation(frac, seed)
    tr = [va.client_train(i) for i in range(data.num_clients)]
    te = [data.client_test(i) for i in range(data.num_clients)]
    kw = dict(task=data.task, num_classes=data.num_classes, name=data.name, meta=dict(data.meta),
              clusters=data.clusters.tolist() if data.clusters is not None else None)
    return FederatedData.from_client_arrays(tr, te, **kw), va


def params_for(name: str, extra: dict | None = None) -> dict:
    """The paper's synthetic hyper-parameters for ``name`` (only the fields its config has)."""
    cls = get_algorithm(name)
    fields = cls.Config.model_fields
    p = {k: v for k, v in SYN_DEFAULTS.items() if k in fields}
    if "fpfc" in name:
        p.update(FPFC_DEFAULTS)
        if "l1" in name:
            p.update(lam=0.2)
    if "ifca" in name:
        p.update(num_clusters=4)
    if "cfl" in name:
        p.update(eps1=0.5, eps2=1.0)
    if "perfedavg" in name:
        p.update(variant="code", train_from="adapted")   # the reference code's Per-FedAvg, as in the synthetic suites
    p.update(extra or {})
    return {k: v for k, v in p.items() if k in fields}


def run(problem, name: str, params: dict, rounds: int, seed: int, fraction: float = 0.3, eval_every: int = 100):
    """``rounds`` of ``name`` on ``problem``; ``executor: auto`` runs the full-batch linear-model methods
    (FPFC and the baselines with a ``linear_gd`` form) through the batched ``linear`` executor."""
    algo = get_algorithm(name)(params, problem)
    sim = Simulation(problem, algo, SimulationConfig(rounds=rounds, eval_every=eval_every, executor="auto",
                                                     sampling={"fraction": fraction}, metrics=[]), seed=seed)
    res = sim.run()
    return sim, algo, res


# ------------------------------------------------------------------ suite mode (label swap)
def load_suite(path, sets=()):
    """A ``fedsolve compare`` YAML (e.g. ``label_swap_mnist.yaml``) with ``--set`` overrides: the drivers'
    ``--suite`` mode takes its data, model, simulation settings and per-algorithm parameters from it."""
    from fedsolve.experiments.config import load_config

    return load_config(path, list(sets))


def suite_data(cfg, seed: int):
    from fedsolve.experiments.runner import build_data

    return build_data(cfg, seed)


@functools.lru_cache(maxsize=None)
def cached_suite(path: str, sets: tuple[str, ...]):
    """:func:`load_suite`, once per process (a driver's runs, in one process or in :func:`run_cells` workers)."""
    return load_suite(path, list(sets))


@functools.lru_cache(maxsize=4)
def cached_suite_data(path: str, sets: tuple[str, ...], seed: int):
    """:func:`suite_data` of ``cached_suite(path, sets)``, kept for the next runs of the same seed."""
    return suite_data(cached_suite(path, sets), seed)


def suite_problem(cfg, data, clients=None, name: str | None = None):
    """The suite's problem (model, blocks, loss) on ``data``, restricted to ``clients`` if given."""
    from fedsolve.experiments.runner import build_problem

    sub = data.subset(list(clients)) if clients is not None else data
    prob = build_problem(cfg, 0, data=sub)
    if name:
        prob.name = name
    return prob


def suite_params(cfg, name: str, extra: dict | None = None) -> dict:
    """``name``'s parameters as the suite runs it: ``defaults`` merged with the first spec of that algorithm
    (a ``byz_<name>`` takes ``<name>``'s spec). A ``tune`` block is ignored: the spec's own value is used."""
    from fedsolve.experiments.config import merged_params

    base = name[4:] if name.startswith("byz_") else name
    specs = [s for s in cfg.all_algorithms() if s.name == base]
    if not specs:
        raise SystemExit(f"--algorithms: {base!r} is not in the suite {cfg.name!r}; allowed: "
                         f"{sorted({s.name for s in cfg.all_algorithms()})}")
    cls = get_algorithm(name)
    return merged_params(cls, cfg.defaults, {**specs[0].params, **(extra or {})})


def run_suite(cfg, problem, name: str, params: dict, seed: int, rounds: int | None = None):
    """``name`` on ``problem`` with the suite's simulation settings (sampling, executor, rounds unless
    ``rounds`` is given), scored once at the end; returns (simulation, algorithm, result)."""
    sc = cfg.simulation
    rounds = sc.rounds if rounds is None else rounds
    algo = get_algorithm(name)(params, problem)
    sim = Simulation(problem, algo, sc.model_copy(update={"rounds": rounds, "eval_every": rounds, "metrics": []}),
                     seed=seed)
    return sim, algo, sim.run()


def suite_participation(cfg) -> str:
    """The suite's sampling in words (for the reports)."""
    s = cfg.simulation.sampling
    if s.clients_per_round:
        return f"{s.clients_per_round} devices per round"
    return f"{s.fraction or 1.0:.0%} participation"


def per_client_accuracy(res) -> np.ndarray:
    return np.array([d.get("accuracy", np.nan) for d in res.per_client], dtype=np.float64)


def mean_std(v) -> tuple[float, float]:
    v = [float(x) for x in v]
    return (statistics.mean(v), statistics.pstdev(v) if len(v) > 1 else 0.0)


def fmt_pct(v) -> str:
    m, s = mean_std(v)
    return f"{100 * m:.2f}% +- {100 * s:.2f}"


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


def driver_parser(doc: str, out: str, *, rounds: int = 2000, size_scale: float = 1.0, max_size: int = 0,
                  scenario: bool = True, resume: bool = False, jobs: bool = False) -> argparse.ArgumentParser:
    """The arguments every synthetic driver shares; the driver adds its own and calls :func:`driver_args`.
    ``resume``: the driver keeps its finished runs in a :class:`Partial` and takes ``--resume``; ``jobs``: it
    runs them through :func:`run_cells` and takes ``--jobs``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if resume:
        p.add_argument("--resume", action="store_true",
                       help="keep the results already in OUT/partial.json (each run's is written as it ends) "
                            "and run only what is missing")
    if jobs:
        p.add_argument("--jobs", type=int, default=1,
                       help="run the missing runs in this many processes at once, one torch thread each "
                            "(default 1: one after the other in this process, with --threads threads)")
    if scenario:
        p.add_argument("--scenario", default="S1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--size-scale", type=float, default=size_scale)
    p.add_argument("--max-size", type=int, default=max_size, help="cap on n_i; 0: no cap (the paper's sizes)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=out)
    p.add_argument("--smoke", action="store_true", help="a tiny run (the tests)")
    return p


def driver_args(p: argparse.ArgumentParser, argv, smoke: dict) -> argparse.Namespace:
    """Parse; with ``--smoke`` apply the ``smoke`` overrides; ``--max-size 0`` -> no cap; set the threads."""
    a = p.parse_args(argv)
    if getattr(a, "jobs", 1) < 1:
        p.error(f"--jobs: expected a whole number >= 1 (worker processes), got {a.jobs}")
    if a.smoke:
        for k, v in smoke.items():
            setattr(a, k, v)
    a.max_size = a.max_size or None
    set_threads(a.threads)
    return a


def write_report(out, lines: list[str], results=None) -> None:
    """``out/report.md`` (and ``out/results.json``), each written atomically; the report is printed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines)
    atomic_write_text(out / "report.md", text + "\n")
    if results is not None:
        atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=float))
    print(text)


class Partial:
    """``OUT/partial.json``: a driver's finished runs, rewritten atomically after each one, so a long suite
    can be split over processes (one ``--out`` each, the files joined) and picked up after a stop.

    ``sections`` are the dicts kept (the first holds the results); ``settings`` are the arguments that
    decide what a result means: with ``resume`` a file written under other settings is refused, without
    it the file starts empty.
    """

    def __init__(self, out, settings: dict, resume: bool, sections: tuple[str, ...] = ("results",)):
        self.file = Path(out) / "partial.json"
        self.settings = json.loads(json.dumps(settings))      # as it reads back from JSON
        saved = json.loads(self.file.read_text()) if resume and self.file.exists() else {}
        if saved and saved.get("settings") != self.settings:
            raise SystemExit(f"--resume: {self.file} was written with other settings ({saved.get('settings')}); "
                             f"these are {self.settings}: use another --out or drop --resume")
        self.sections = {name: dict(saved.get(name, {})) for name in sections}
        self.kept = len(self.sections[sections[0]])           # results taken from the file

    def __getitem__(self, section: str) -> dict:
        return self.sections[section]

    def save(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.file, json.dumps({"settings": self.settings, **self.sections}, indent=1))

    def kept_note(self) -> str:
        """Appended to a report's wall time: how many results this call did not run."""
        return f" (this call; {self.kept} results kept from {self.file.name} by --resume)" if self.kept else ""


_loaded_drivers: dict[str, object] = {}


def _driver_call(path: str, fn: str, kwargs: dict):
    """In a worker process: ``fn(**kwargs)`` of the driver script at ``path`` (loaded once per process)."""
    if path not in _loaded_drivers:
        spec = importlib.util.spec_from_file_location(f"_fpfc_driver_{Path(path).stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _loaded_drivers[path] = mod
    return getattr(_loaded_drivers[path], fn)(**kwargs)


def run_cells(fn, cells: dict[str, dict], jobs: int, on_done) -> None:
    """``fn(**cells[key])`` for every key, and ``on_done(key, result)`` here as each one ends.

    ``jobs`` 1: one after the other in this process. More: in that many fresh (spawned) processes at once,
    one torch thread each; ``fn`` is a top-level function of a driver script, which each worker loads from
    its file. A run's result is the same either way (the same function on the same settings)."""
    if jobs <= 1 or len(cells) <= 1:
        for key, kwargs in cells.items():
            on_done(key, fn(**kwargs))
        return
    path = inspect.getfile(fn)
    with ProcessPoolExecutor(max_workers=min(jobs, len(cells)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=set_threads, initargs=(1,)) as pool:
        running = {pool.submit(_driver_call, path, fn.__name__, kwargs): key for key, kwargs in cells.items()}
        error = None
        for f in as_completed(running):
            try:
                result = f.result()
            except Exception as e:   # keep what the other workers finish, start nothing new, then raise
                if error is None:
                    error = e
                    for other in running:
                        other.cancel()
                continue
            on_done(running[f], result)
    if error is not None:
        raise error
