"""The classic baselines: FedAvg, FedProx, SCAFFOLD, FedADMM and Local."""

from fedsolve.families.classic import fedadmm, fedavg, fedprox, local, scaffold  # noqa: F401  (register)
