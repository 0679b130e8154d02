"""Clustered models (paper 001): FPFC and its variants, the clustering baselines (IFCA, CFL, PACFL, Per-FedAvg,
LG), the Byzantine attacks of its robustness experiments, and its protocols (``protocols``: lambda paths,
asyncFPFC, newcomers, the suites' per-cell protocols)."""

from fedsolve.families.clustered import baselines, byzantine, fpfc  # noqa: F401  (register)
