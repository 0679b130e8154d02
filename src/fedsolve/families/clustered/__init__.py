"""Clustered models (paper 001): FPFC and its variants, the clustering baselines (IFCA, CFL, PACFL, Per-FedAvg,
LG), the Byzantine attacks of its robustness experiments (the wrapper ``attack``), and its protocols
(``protocols``: the schedules ``warmup_path``, ``lambda_grid``, ``async_fpfc`` and ``virtual_clock``, newcomers, the
suites' per-cell protocols)."""

from fedsolve.families.clustered import baselines, byzantine, fpfc  # noqa: F401  (register)
from fedsolve.families.clustered.protocols import async_fpfc, path  # noqa: F401  (register the schedules)
