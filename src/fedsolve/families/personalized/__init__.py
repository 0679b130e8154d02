"""Partially personalized models (paper 000): FedAPM and the baselines it is compared with (FedAlt, FedSim,
FedPer, FedRep, LG-FedAvg, Ditto, pFedMe); ``blocks`` names the personal part of a model."""

from fedsolve.families.personalized import baselines, fedapm  # noqa: F401  (register)
