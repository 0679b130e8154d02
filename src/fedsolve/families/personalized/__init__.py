"""Partially personalized models (paper 000): FedAPM and the baselines it is compared with (FedAlt, FedSim,
FedPer, FedRep, LG-FedAvg in ``baselines``; Ditto, pFedMe in ``full``); ``partial`` holds what they share,
``blocks`` names the personal part of a model and ``clients`` states a problem by a function per client
(:func:`client_partial_problem`)."""

from fedsolve.families.personalized import baselines, fedapm, full  # noqa: F401  (register)
from fedsolve.families.personalized.clients import client_partial_problem

__all__ = ["client_partial_problem"]
