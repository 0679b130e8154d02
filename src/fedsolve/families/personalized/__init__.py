"""Partially personalized models (paper 000): FedAPM and the baselines it is compared with (FedAlt, FedSim,
FedPer, FedRep, LG-FedAvg in ``baselines``; Ditto, pFedMe in ``full``; FedALA in ``fedala``; FedCP in ``fedcp``
(its network in ``models/policy.py``); FedRoD in ``fedrod``; lp-proj in ``lpproj``); ``partial`` holds what they share,
``blocks`` names the personal part of a model, ``clients`` states a problem by a function per client
(:func:`client_partial_problem`) and ``drift`` is the wrapper that gives FedAvg and FedProx the personalized
solvers' ``local_drift`` (Fig. 5)."""

from fedsolve.families.personalized import baselines, drift, fedala, fedapm, fedcp, fedrod, full, lpproj  # noqa: F401  (register)
from fedsolve.families.personalized.clients import client_partial_problem

__all__ = ["client_partial_problem"]
