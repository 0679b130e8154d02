"""Partially personalized models (paper 000): FedAPM and the baselines it is compared with (FedAlt, FedSim,
FedPer, FedRep, LG-FedAvg in ``baselines``; Ditto, pFedMe in ``full``); ``partial`` holds what they share and
``blocks`` names the personal part of a model."""

from fedsolve.families.personalized import baselines, fedapm, full  # noqa: F401  (register)
