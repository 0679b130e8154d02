"""Started by tests/test_distributed.py under torchrun (not a test module): every rank joins one gloo group and runs
the jobs of a JSON file one after another, then writes ``rank<r>.json`` beside it ({job name: None, or the one-line
error the job stopped with}).

A job ``{"name", "config", "set", "out", "resume"}`` is ``fedsolve run CONFIG --distributed`` through
:func:`~fedsolve.experiments.distributed.run_distributed`; a job with ``copy_at: k`` runs the simulation through
the Python API (rank 0 with the run folder, the others without) and copies rank 0's ``checkpoint.pt`` as it is
after round ``k`` to ``copy.pt`` in the folder (and writes metrics.jsonl there).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


class CopyCheckpoint:
    """Callback: the checkpoint written after round ``k`` copied to ``dst`` (at ``on_round`` of round ``k``, the
    checkpoint on disk is the one written when round ``k - 1`` ended)."""

    def __init__(self, k: int, dst: Path):
        self.k, self.dst = k, dst

    def on_start(self, sim):
        pass

    def on_round(self, sim, round_, info):
        if round_ == self.k:
            shutil.copyfile(sim.checkpoint_path, self.dst)

    def on_eval(self, sim, record):
        pass

    def on_end(self, sim):
        pass


def api_run(cfg, out: Path, copy_at: int, rank: int) -> None:
    from fedsolve.engine.distributed import DistributedTransport
    from fedsolve.engine.loop import JsonlLogger, Simulation
    from fedsolve.experiments.runner import build_algorithm, build_problem

    seed = cfg.seeds[0]
    problem = build_problem(cfg, seed)
    algo = build_algorithm(cfg, cfg.algorithm, problem)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    sim = Simulation(problem, algo, cfg.simulation, seed, out_dir=out if rank == 0 else None,
                     callbacks=[CopyCheckpoint(copy_at, out / "copy.pt"), JsonlLogger(out / "metrics.jsonl")]
                     if rank == 0 else [],
                     transport=DistributedTransport())
    sim.run()


def main(jobs_file: str) -> None:
    from fedsolve.engine.distributed import launch
    from fedsolve.experiments.config import ConfigError, load_config
    from fedsolve.experiments.distributed import run_distributed

    where = launch("cpu")
    log: dict[str, str | None] = {}
    for job in json.loads(Path(jobs_file).read_text()):
        cfg = load_config(job["config"], job.get("set", []))
        try:
            if "copy_at" in job:
                api_run(cfg, Path(job["out"]), job["copy_at"], where.rank)
            else:
                run_distributed(cfg, cfg.algorithm, cfg.seeds[0], job["out"], resume=job.get("resume", False),
                                progress=False)
            log[job["name"]] = None
        except ConfigError as e:
            log[job["name"]] = str(e)
    Path(jobs_file).with_name(f"rank{where.rank}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main(sys.argv[1])
