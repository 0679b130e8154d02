"""Constrained federated learning (paper 002): Prox-AL FL (Algorithms 1-2) and cProx-AL (Algorithm 3)."""

from fedsolve.families.constrained import baselines, kind, proxal  # noqa: F401  (register)
from fedsolve.families.constrained.config import CProxALConfig, ProxALConfig
from fedsolve.families.constrained.cproxal import CProxAL, CProxALResult, cproxal
from fedsolve.families.constrained.kkt import certificate
from fedsolve.families.constrained.parties import party_problem, quadratic_problem
from fedsolve.families.constrained.problem import PartyData
from fedsolve.families.constrained.proxal import ProxAL

__all__ = [
    "CProxAL",
    "CProxALConfig",
    "CProxALResult",
    "PartyData",
    "ProxAL",
    "ProxALConfig",
    "certificate",
    "cproxal",
    "party_problem",
    "quadratic_problem",
]
