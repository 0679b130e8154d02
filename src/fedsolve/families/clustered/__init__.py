"""Clustered models (paper 001): FPFC and its variants, the clustering baselines (IFCA, CFL, PACFL, Per-FedAvg,
LG), the Byzantine attacks of its robustness experiments (the wrapper ``attack``), and its protocols
(``protocols``: the schedules ``warmup_path``, ``lambda_grid``, ``async_fpfc``, ``virtual_clock`` and
``local_budget``, newcomers, the suites' per-cell protocols)."""

from fedsolve.families.clustered import baselines, byzantine, fpfc  # noqa: F401  (register)
from fedsolve.families.clustered.protocols import async_fpfc, budget, path  # noqa: F401  (register the schedules)
