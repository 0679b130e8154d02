"""FedMM (Shen et al., Algorithm 3; spec fedmm.md sec. 2.3): local augmented-Lagrangian descent-ascent with
per-client duals.

    client i, round t (omega_0^t, psi_0^t, lambda_i^t, beta_i^t frozen during the local loop):
      omega_hat^{m+1} = omega_hat^m - eta_1 [ grad_omega f_i + mu_1 (omega_hat^m - omega_0^t) + lambda_i^t ]  (eq. 11)
      psi_hat^{m+1}   = psi_hat^m   + eta_2 [ grad_psi f_i   - mu_2 (psi_hat^m - psi_0^t)   - beta_i^t ]    (eq. 12)
      lambda_i^{t+1} = lambda_i^t + mu_1 (omega_i^{t+1} - omega_0^t)                                         (eq. 13)
      beta_i^{t+1}   = beta_i^t   + mu_2 (psi_i^{t+1}   - psi_0^t)                                           (eq. 14)
      upload omega_i^{t+1} + (eta_3^t / mu_1) lambda_i^{t+1},  psi_i^{t+1} + (eta_3^t / mu_2) beta_i^{t+1}   (eq. 15)
    server: plain 1/N mean of the uploads                                                                    (eq. 16)

eta_3^t is eta_3 to the power of the round index t. In minimizer form (psi descends -f_i) both blocks share one
rule with ``dual = (lambda_i, beta_i)`` and ``mu = (mu_1, mu_2)``; the duals start at 0, stay on the client
(``ClientStates`` row ``dual``) across rounds and are never sent.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.families.minimax.common import GDAConfig, MinimaxAlgorithm, block_vector, descent_ascent


class FedMMConfig(GDAConfig):
    mu1: float = Field(1.0, gt=0, description="mu_1: penalty of omega (paper 1.0; the authors' code 2.0)")
    mu2: float = Field(1.0, gt=0, description="mu_2: penalty of psi (paper 1.0; the authors' code 2.0)")
    eta3: float = Field(
        1 / 1.0005,
        ge=0,
        le=1,
        description="eta_3: upload factor eta_3^t of the duals (DANN "
        "1/1.0005, CDAN 1/1.0002, MDD 1/1.0001; theory: 1; 0 = no dual correction)",
    )


@register
class FedMM(MinimaxAlgorithm):
    name = "fedmm"
    description = "FedMM: augmented-Lagrangian local descent-ascent with client duals (Shen et al., Alg. 3)"
    Config = FedMMConfig
    cfg: FedMMConfig

    def setup(self) -> None:
        super().setup()
        self.mu = block_vector(self.layout, self.cfg.mu1, self.cfg.mu2)

    def init(self, x0, rngs):
        return {"w": x0.clone()}, ClientStates(
            self.num_clients, {"dual": torch.zeros(self.num_clients, x0.numel(), dtype=x0.dtype)}
        )

    def local_update(self, state, msg, ctx):
        w0, dual = msg["w"], state["dual"]  # round-start global and duals: frozen in the loop
        mu = self.mu.to(dtype=w0.dtype, device=w0.device)
        upload = self.cfg.eta3**ctx.round  # eta_3^t

        def then(w, steps):
            new = dual + mu * (w - w0)  # eqs. 13-14
            return {"dual": new}, {"w": w + upload * new / mu}  # eq. 15

        return descent_ascent(self, w0, then, prox=mu, linear=dual)  # eqs. 11-12
