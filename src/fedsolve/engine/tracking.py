"""Tracking: callbacks that send a run's evaluations to a CSV file, TensorBoard, Weights & Biases or MLflow.

Each writer is a :class:`~fedsolve.engine.loop.Callback` (``on_start``, ``on_round``, ``on_eval``,
``on_end``): pass it to ``fedsolve.run(..., callbacks=[...])`` or to :class:`~fedsolve.engine.loop.Simulation`,
or name it on the command line (``fedsolve run/compare ... --track csv,tensorboard``; :func:`make_trackers`).
Every evaluated record (the lines of ``metrics.jsonl``: the round and its metrics) is written with the round as
the step; wall-clock time stays in ``timings.jsonl``.

- :class:`CsvWriter`: ``metrics.csv``, one row per evaluation; the columns are ``round`` and then every metric
  in the order it first appears; a metric a row lacks is an empty cell. The file is rewritten (atomically)
  from the run's history at every evaluation, so after ``--resume`` it holds exactly the history's rows.
- :class:`TensorBoardWriter`: event files (``torch.utils.tensorboard``; needs the ``tensorboard`` package, the
  ``tensorboard`` extra), one scalar per metric. A resumed run drops the events after its checkpoint's round
  (``purge_step``), so TensorBoard shows no round twice.
- :class:`WandbWriter` and :class:`MlflowWriter`: one W&B or MLflow run per fedsolve run (extras ``wandb`` and
  ``mlflow``). Their packages are imported when the writer is made, not when this module is; a missing one
  raises :class:`MissingPackage`, whose message is one line naming the package and how to install it.
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsolve.engine.io import atomic_write_text

#: the packages behind the optional writers, and the extra that installs each
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


class MissingPackage(ImportError):
    """An optional writer whose package is not installed (the message is one line: what to install)."""


def require(writer: str, module: str | None = None):
    """Import and return ``module`` (default: the package behind ``writer``), or raise :class:`MissingPackage`
    naming the package and the extra that installs it."""
    package, extra = EXTRAS[writer]
    try:
        return importlib.import_module(module or package)
    except ImportError:
        raise MissingPackage(
            f"--track {writer}: the {package!r} package is not installed; install it with "
            f"`pip install {package}` (or fedsolve's extra: `pip install '.[{extra}]'` in the "
            f"checkout)"
        ) from None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of an evaluated record, ``round`` excluded (booleans as 0/1)."""
    return {k: float(v) for k, v in record.items() if k != "round" and isinstance(v, (int, float))}


class _Writer:
    """The callback methods a writer does not need, and ``on_interrupt`` (Ctrl-C) closing it as ``on_end`` does."""

    def on_start(self, sim) -> None:
        pass

    def on_round(self, sim, round_: int, info: dict[str, Any]) -> None:
        pass

    def on_eval(self, sim, record: dict[str, Any]) -> None:
        pass

    def on_end(self, sim) -> None:
        self.close()

    def on_interrupt(self, sim) -> None:
        self.close()

    def close(self) -> None:
        """Finish the writer's output; safe to call more than once (a failed run is closed by its runner)."""


class CsvWriter(_Writer):
    """``path`` (e.g. ``run_dir/metrics.csv``): one row per evaluated round, rewritten at every evaluation."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def on_eval(self, sim, record: dict[str, Any]) -> None:
        self.write(sim.history)

    def write(self, history: Sequence[dict[str, Any]]) -> None:
        """Write ``history`` (records as in ``metrics.jsonl``) as the CSV file; floats keep every digit."""
        cols = ["round", *dict.fromkeys(k for r in history for k in r if k != "round")]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, restval="", lineterminator="\n")
        w.writeheader()
        w.writerows(history)
        atomic_write_text(self.path, buf.getvalue())


class TensorBoardWriter(_Writer):
    """TensorBoard event files in ``log_dir`` (e.g. ``run_dir/tensorboard``): each metric a scalar, step = round."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = Path(log_dir)
        self._summary = require("tensorboard", "torch.utils.tensorboard")
        self.writer = None

    def on_start(self, sim) -> None:
        # a resumed run re-evaluates the rounds after its checkpoint: the events written for them go
        purge = sim.start_round + 1 if sim.start_round > 0 else None
        self.writer = self._summary.SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    def on_eval(self, sim, record: dict[str, Any]) -> None:
        if self.writer is None:
            raise RuntimeError("TensorBoardWriter: on_eval before on_start")
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, global_step=record["round"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbWriter(_Writer):
    """A Weights & Biases run (``wandb.init(project=, name=, config=, dir=)``); the records go to ``run.log`` with
    the round as the step. ``WANDB_MODE=offline`` and W&B's other variables work as usual."""

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        config: dict | None = None,
        dir: str | Path | None = None,
    ):
        self.wandb = require("wandb")
        self.kwargs: dict[str, Any] = {
            "project": project,
            "name": name,
            "config": config,
            "dir": None if dir is None else str(dir),
        }
        self.run = None

    def on_start(self, sim) -> None:
        if self.kwargs["dir"] is not None:
            Path(self.kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(**self.kwargs)

    def on_eval(self, sim, record: dict[str, Any]) -> None:
        if self.run is None:
            raise RuntimeError("WandbWriter: on_eval before on_start")
        self.run.log(scalars(record), step=record["round"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


_MLFLOW_BAD = re.compile(r"[^0-9A-Za-z_\-. /]")


def mlflow_key(name: str) -> str:
    """``name`` as an MLflow metric or parameter key: characters MLflow refuses (brackets of the constrained
    families' ``c_client_mean[...]``) become ``_``."""
    return _MLFLOW_BAD.sub("_", name)


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and string values (MLflow parameters)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flat_params(v, f"{prefix}{k}."))
        else:
            out[mlflow_key(f"{prefix}{k}")] = str(v)
    return out


class MlflowWriter(_Writer):
    """An MLflow run (``mlflow.start_run(run_name=)``, nested in the caller's active run if there is one) in
    ``experiment`` (default: MLflow's, or ``MLFLOW_EXPERIMENT_NAME``); ``config`` logged as parameters
    (:func:`flat_params`), the records as metrics with the round as the step (:func:`mlflow_key` names)."""

    def __init__(self, experiment: str | None = None, run_name: str | None = None, config: dict | None = None):
        self.mlflow = require("mlflow")
        self.experiment, self.run_name, self.config = experiment, run_name, config
        self.run = None

    def on_start(self, sim) -> None:
        m = self.mlflow
        if self.experiment is not None:
            m.set_experiment(self.experiment)
        self.run = m.start_run(run_name=self.run_name, nested=m.active_run() is not None)
        if self.config:
            m.log_params(flat_params(self.config))

    def on_eval(self, sim, record: dict[str, Any]) -> None:
        values = {mlflow_key(k): v for k, v in scalars(record).items() if math.isfinite(v)}
        self.mlflow.log_metrics(values, step=record["round"])

    def close(self) -> None:
        if self.run is not None:
            self.mlflow.end_run()
            self.run = None


#: the writers ``--track`` names
TRACKERS = ("csv", "tensorboard", "wandb", "mlflow")


def parse_track(text: str | Sequence[str] | None) -> list[str]:
    """``--track`` (``"csv,tensorboard"``, or a list of names) as a list of distinct writer names; an unknown
    name raises ``ValueError`` naming it and the allowed ones."""
    items = text.split(",") if isinstance(text, str) else list(text or [])
    names = list(dict.fromkeys(s.strip() for s in items if s.strip()))
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise ValueError(
            f"--track: {bad[0]!r} is not a tracker; allowed: a comma-separated list of {', '.join(TRACKERS)}"
        )
    for n in names:  # fail before any run starts when an optional package is missing
        if n in EXTRAS:
            require(n, "torch.utils.tensorboard" if n == "tensorboard" else None)
    return names


def make_trackers(
    names: Sequence[str],
    run_dir: str | Path,
    run_name: str,
    config: dict[str, Any] | None = None,
    experiment: str | None = None,
) -> list[_Writer]:
    """The writers ``names`` (:data:`TRACKERS`) for the run in ``run_dir``: ``metrics.csv`` and ``tensorboard/``
    there; a W&B run named ``run_name`` in project ``experiment`` (unless ``WANDB_PROJECT`` is set) with the
    resolved ``config``, its files under ``run_dir/wandb``; an MLflow run named ``run_name`` in experiment
    ``experiment`` (unless ``MLFLOW_EXPERIMENT_NAME`` is set) with ``config`` as parameters."""
    run_dir = Path(run_dir)
    out: list[_Writer] = []
    for n in parse_track(names):
        if n == "csv":
            out.append(CsvWriter(run_dir / "metrics.csv"))
        elif n == "tensorboard":
            out.append(TensorBoardWriter(run_dir / "tensorboard"))
        elif n == "wandb":
            out.append(
                WandbWriter(
                    project=os.environ.get("WANDB_PROJECT") or experiment,
                    name=run_name,
                    config=config,
                    dir=run_dir / "wandb",
                )
            )
        else:
            out.append(
                MlflowWriter(
                    experiment=None if os.environ.get("MLFLOW_EXPERIMENT_NAME") else experiment,
                    run_name=run_name,
                    config=config,
                )
            )
    return out


def close_all(callbacks: Sequence[Any]) -> None:
    """Close every writer among ``callbacks`` (after a run that ended without ``on_end``: it diverged)."""
    for cb in callbacks:
        if isinstance(cb, _Writer):
            cb.close()
