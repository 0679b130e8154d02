"""Simulation: the round loop, sampling, evaluation, checkpoints and callbacks."""

from fedsolve.simulation.loop import (DivergenceError, JsonlLogger, ProgressBar, RunResult, Simulation,
                                      SimulationConfig, WorkConfig, atomic_torch_save, atomic_write_text)
from fedsolve.simulation.sampling import SamplingConfig, sample_clients

__all__ = ["DivergenceError", "JsonlLogger", "ProgressBar", "RunResult", "Simulation", "SimulationConfig",
           "WorkConfig", "atomic_torch_save", "atomic_write_text", "SamplingConfig", "sample_clients"]
