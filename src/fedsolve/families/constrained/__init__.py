"""Constrained federated learning (paper 002): Prox-AL FL (Algorithms 1-2) and cProx-AL (Algorithm 3)."""

from fedsolve.families.constrained import baselines  # noqa: F401  (register)
from fedsolve.families.constrained import kind, proxal  # noqa: F401  (register)
from fedsolve.families.constrained.cproxal import CProxALResult, cproxal
from fedsolve.families.constrained.kkt import certificate
from fedsolve.families.constrained.proxal import ProxAL, ProxALConfig

__all__ = ["ProxAL", "ProxALConfig", "cproxal", "CProxALResult", "certificate"]
