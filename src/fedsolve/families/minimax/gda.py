"""GDA baselines of the FedMM paper (Algorithms 1 and 2), sharing the local loop of ``common.py``.

FedAvgGDA (Algorithm 2)::

    omega_hat^{m+1} = omega_hat^m - eta_1 grad_omega f_i(omega_hat^m, psi_hat^m)
    psi_hat^{m+1}   = psi_hat^m   + eta_2 grad_psi   f_i(omega_hat^m, psi_hat^m)      m = 0..M-1
    omega_0^{t+1} = (1/N) sum_i omega_i^{t+1};  psi_0^{t+1} = (1/N) sum_i psi_i^{t+1}

FedProxGDA (Algorithm 2 with L_i = f_i + (mu/2)||omega - omega_0^t||^2 - (mu/2)||psi - psi_0^t||^2).
FedSGDA (Algorithm 1, Peng et al. 2019): one stochastic gradient pair per round at (omega_0^t, psi_0^t), averaged
at the server = FedAvgGDA with M = 1 (spec 2.1).

A centralized (pooled-data) upper bound is FedSGDA or FedAvgGDA on ONE client holding all the data
(``num_clients: 1`` in a domain dataset), see experiments/minimax/.
"""

from __future__ import annotations

from pydantic import Field

from fedsolve.engine.algorithm import register
from fedsolve.families.minimax.common import GDAConfig, MinimaxAlgorithm, descent_ascent


@register
class FedAvgGDA(MinimaxAlgorithm):
    name = "fedavggda"
    description = "FedAvgGDA: M local simultaneous descent-ascent steps, plain averaging (FedMM paper, Alg. 2)"

    def local_update(self, state, msg, ctx):
        return descent_ascent(self, msg["w"], upload_model)


class FedSGDAConfig(GDAConfig):
    local_steps: int | None = Field(1, ge=1, le=1, description="one descent-ascent step per round (fixed)")
    local_epochs: float | None = Field(None, description="unused (one step per round)")


@register
class FedSGDA(FedAvgGDA):
    name = "fedsgda"
    description = "FedSGDA: one stochastic descent-ascent gradient pair per round, averaged (Peng et al. 2019)"
    Config = FedSGDAConfig
    cfg: FedSGDAConfig


class FedProxGDAConfig(GDAConfig):
    mu: float = Field(1.0, ge=0, description="proximal coefficient mu (both players; paper's mu_1 = mu_2 = 1)")


@register
class FedProxGDA(FedAvgGDA):
    name = "fedproxgda"
    description = "FedProxGDA: FedAvgGDA with +/-(mu/2)||. - global||^2 proximal terms (FedMM paper, Alg. 2)"
    Config = FedProxGDAConfig
    cfg: FedProxGDAConfig

    def local_update(self, state, msg, ctx):
        """The minimizer form of the +/- prox terms: ``mu (theta - theta_0^t)`` on both players."""
        return descent_ascent(self, msg["w"], upload_model, prox=float(self.cfg.mu))


def upload_model(w, steps):
    """No client state; the upload is the local model ``(omega_i^{t+1}, psi_i^{t+1})``."""
    return {}, {"w": w}
