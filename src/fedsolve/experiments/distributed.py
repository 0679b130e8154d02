"""``fedsolve run CONFIG --distributed``: one run sharded over the processes torchrun starts
(``engine/distributed.py``; docs/distributed.md).

Every rank builds the same problem, algorithm and simulation with a
:class:`~fedsolve.engine.distributed.DistributedTransport`. Rank 0 runs :func:`~fedsolve.experiments.runner.run_one`
as a single-process run does: it alone locks and writes the run folder (config.yaml, metrics.jsonl, checkpoints,
summary, report) and prints. The other ranks write nothing; on ``--resume`` they read rank 0's checkpoint from the
same path (one machine, or a run folder on a filesystem every node shares). A rank that fails before the run
starts tells the others, which stop with one line naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch.distributed as dist

from fedsolve.engine.distributed import DistributedError, DistributedTransport, launch
from fedsolve.engine.loop import Simulation
from fedsolve.experiments.config import AlgorithmSpec, ConfigError, ExperimentConfig


def run_distributed(
    cfg: ExperimentConfig,
    spec: AlgorithmSpec,
    seed: int,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    track: Sequence[str] = (),
    overwrite: bool = False,
    prepare: Callable[[], object] | None = None,
) -> dict | None:
    """This process's part of a distributed run (module docstring): rank 0 returns the run's summary dict, the
    other ranks None. ``prepare``: rank 0's checks of the output folder before the run (the CLI's). Without
    torchrun's environment, or for a spec with ``tune``, a ``ConfigError`` with one line."""
    from fedsolve.experiments.runner import default_threads, run_one

    if spec.tune is not None:
        raise ConfigError(
            "algorithm.tune: not with --distributed (tuning runs many short runs); tune in one process "
            "(fedsolve run without --distributed), then set the chosen value"
        )
    if spec.schedule is not None:
        raise ConfigError(
            "algorithm.schedule: not with --distributed (a schedule may read and restore every "
            "client's state rows between evaluations); run it in one process"
        )
    created = not dist.is_initialized()
    try:
        where = launch(cfg.simulation.device)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.threads is None:  # the machine's cores shared by the ranks on it
        cfg = cfg.model_copy(update={"threads": max(1, default_threads() // where.local_world_size)})
    transport = DistributedTransport()
    try:
        if where.rank == 0:
            if prepare is not None:
                prepare()
            summary = run_one(
                cfg,
                spec,
                seed,
                run_dir,
                resume=resume,
                progress=progress,
                track=track,
                overwrite=overwrite,
                transport=transport,
                extras={"distributed": {"world_size": where.world_size, "backend": where.backend}},
            )
        else:
            summary = None
            _worker(cfg, spec, seed, Path(run_dir), resume, transport)
    except DistributedError as e:
        raise ConfigError(str(e)) from None
    except Exception as e:
        transport.abort(e)  # before the run: the other ranks stop with this error named
        raise
    if created:  # a caller that joined the group itself (several runs in one group) keeps it
        dist.destroy_process_group()
    return summary


def _worker(
    cfg: ExperimentConfig, spec: AlgorithmSpec, seed: int, run_dir: Path, resume: bool, transport: DistributedTransport
) -> None:
    """A rank other than 0: the same simulation, without a run folder or callbacks that write."""
    from fedsolve.experiments.runner import build_algorithm, build_problem, set_threads

    set_threads(cfg.threads)
    problem = build_problem(cfg, seed, spec=spec)
    algo = build_algorithm(cfg, spec, problem)
    try:
        sim = Simulation(problem, algo, cfg.simulation, seed, transport=transport)
    except ValueError as e:  # as run_one words it (rank 0 says the same)
        raise ConfigError(str(e)) from None
    if resume:
        sim.load_checkpoint(run_dir / "checkpoint.pt")
    sim.run()
