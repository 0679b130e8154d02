"""FedProx (Li et al., 2020): FedAvg whose local objective adds (mu/2)||w - w^t||^2.

min_w f_i(w) + (mu/2) ||w - w^t||^2      (solved inexactly by local SGD)
"""

from __future__ import annotations

from pydantic import Field

from fedsolve.engine.algorithm import register
from fedsolve.families.classic.fedavg import FedAvg, FedAvgConfig


class FedProxConfig(FedAvgConfig):
    mu: float = Field(0.01, ge=0, description="proximal coefficient mu")


@register
class FedProx(FedAvg):
    name = "fedprox"
    description = "FedProx: FedAvg + proximal term (mu/2)||w - w_global||^2 (Li et al. 2020)"
    Config = FedProxConfig
    cfg: FedProxConfig

    def prox_mu(self) -> float:
        return self.cfg.mu
