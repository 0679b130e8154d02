"""The engine: the algorithm interface, THE round loop, sampling, evaluation, checkpoints and callbacks.

Families (``fedsolve.families``) build on its public pieces; it imports nothing above ``core``, ``problems``,
``data`` and ``models``.
"""

from fedsolve.engine import server as _server  # noqa: F401  (registers the server_opt and dp wrappers)
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, register, weighted_mean
from fedsolve.engine.io import atomic_torch_save, atomic_write_text
from fedsolve.engine.loop import (
    Callback,
    DivergenceError,
    JsonlLogger,
    ProgressBar,
    RunResult,
    Simulation,
    SimulationConfig,
    WorkConfig,
)
from fedsolve.engine.sampling import SamplingConfig, sample_clients
from fedsolve.engine.tracking import CsvWriter, MlflowWriter, TensorBoardWriter, WandbWriter

__all__ = [
    "Algorithm",
    "AlgorithmConfig",
    "register",
    "weighted_mean",
    "Callback",
    "DivergenceError",
    "JsonlLogger",
    "ProgressBar",
    "RunResult",
    "Simulation",
    "SimulationConfig",
    "WorkConfig",
    "atomic_torch_save",
    "atomic_write_text",
    "SamplingConfig",
    "sample_clients",
    "CsvWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "MlflowWriter",
]
