"""Constrained federated learning (paper 002): Prox-AL FL (Algorithms 1-2) and cProx-AL (Algorithm 3)."""

from fedsolve.algorithms.constrained import baselines, proxal  # noqa: F401  (register)
from fedsolve.algorithms.constrained.cproxal import CProxALResult, cproxal
from fedsolve.algorithms.constrained.kkt import certificate
from fedsolve.algorithms.constrained.proxal import ProxAL, ProxALConfig

__all__ = ["ProxAL", "ProxALConfig", "cproxal", "CProxALResult", "certificate"]
