"""Experiments: typed YAML configs, run / compare / suite drivers and reports."""

from fedsolve.experiments.compare import compare
from fedsolve.experiments.config import (
    AlgorithmSpec,
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    load_config,
    parse_config,
)
from fedsolve.experiments.runner import build_algorithm, build_data, build_problem, check_resume, run_config, run_one

__all__ = [
    "AlgorithmSpec",
    "ConfigError",
    "ExperimentConfig",
    "apply_overrides",
    "load_config",
    "parse_config",
    "build_algorithm",
    "build_data",
    "build_problem",
    "check_resume",
    "compare",
    "run_config",
    "run_one",
]
