"""fedsolve: structured federated optimization with vectorized simulation.

Importing fedsolve changes nothing in the process: no environment variable, thread count, allocator
option or matplotlib backend is touched on import. Those settings happen when a run starts and are
documented where they happen: the ``fedsolve`` command sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set)
before torch loads (:mod:`fedsolve.cli`); a run sets torch's thread count to the config's ``threads``
(default: the machine's physical cores, :func:`fedsolve.experiments.runner.set_threads`); the first round
of the ``vectorized``, ``batched`` or ``linear`` executor turns on glibc's keep-freed-memory option
(:func:`fedsolve.core.allocator.keep_freed_memory`).

Python API in one call::

    import fedsolve
    res = fedsolve.run("experiments/demo.yaml", algorithm="FedAvg", seed=0, overrides=["simulation.rounds=5"])
    res.history          # one record per evaluated round (the trajectory)
    res.eval_params()    # [num_clients, d]: the model each client is scored with (Simulation.eval_params)

Callbacks (:class:`Callback`: ``on_start``, ``on_round``, ``on_eval``, ``on_end``) see the run as it goes; the
tracking writers :class:`CsvWriter`, :class:`TensorBoardWriter`, :class:`WandbWriter` and :class:`MlflowWriter`
are such callbacks (:mod:`fedsolve.engine.tracking`, docs/tracking.md)::

    res = fedsolve.run("experiments/demo.yaml", algorithm="FedAvg", callbacks=[fedsolve.CsvWriter("fedavg.csv")])

These names are loaded on first use, so ``import fedsolve`` stays light (it does not import torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedsolve._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from fedsolve.engine.loop import Callback, RunResult
    from fedsolve.engine.tracking import CsvWriter, MlflowWriter, TensorBoardWriter, WandbWriter

#: names loaded on first use (``fedsolve.Callback``), from the module that defines them
_LAZY = {
    "Callback": "fedsolve.engine.loop",
    "CsvWriter": "fedsolve.engine.tracking",
    "TensorBoardWriter": "fedsolve.engine.tracking",
    "WandbWriter": "fedsolve.engine.tracking",
    "MlflowWriter": "fedsolve.engine.tracking",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedsolve' has no attribute {name!r}")


def run(
    config: Any,
    algorithm: str | None = None,
    seed: int | None = None,
    overrides: Sequence[str] = (),
    out: str | None = None,
    progress: bool = False,
    callbacks: Sequence[Callback] = (),
    overwrite: bool = False,
    **unknown: Any,
) -> RunResult:
    """Run one algorithm of an experiment config and return its :class:`~fedsolve.engine.loop.RunResult`.

    ``config``: a YAML path, a config mapping or an ``ExperimentConfig``; ``algorithm``: label or name (needed
    when the config lists several); ``seed``: default the config's first; ``overrides``: ``--set`` strings;
    ``out``: a folder for ``config.yaml``, ``metrics.jsonl``, ``timings.jsonl`` and checkpoints (default: none
    written; a folder that holds a run is refused unless ``overwrite``); ``callbacks``: more :class:`Callback`
    objects, called after fedsolve's own (e.g. the tracking writers). A bad argument (a misspelled keyword too)
    is a ``ConfigError``, a ValueError naming it. See :func:`fedsolve.experiments.runner.run_config`."""
    from fedsolve.experiments.runner import run_config

    if unknown:
        import difflib

        from fedsolve.experiments.config import ConfigError

        allowed = ["config", "algorithm", "seed", "overrides", "out", "progress", "callbacks", "overwrite"]
        name = sorted(unknown)[0]
        near = difflib.get_close_matches(name, allowed, n=1)
        raise ConfigError(
            f"run(): unknown keyword {name!r}{f' (did you mean {near[0]!r}?)' if near else ''}; allowed: {allowed}"
        )
    return run_config(
        config,
        algorithm=algorithm,
        seed=seed,
        overrides=overrides,
        out=out,
        progress=progress,
        callbacks=callbacks,
        overwrite=overwrite,
    )


__all__ = ["__version__", "run", "Callback", "CsvWriter", "TensorBoardWriter", "WandbWriter", "MlflowWriter"]
