"""Shared mechanics of the federated minimax solvers: local simultaneous descent-ascent in "minimizer form".

With ``l_omega = f_i`` and ``l_psi = -f_i`` every parameter block follows the same rule (spec fedmm.md sec. 2,
"uniform minimizer form")::

    theta <- theta - eta_theta * [ sign_theta * grad f_i(theta) + correction(theta) ]

``sign`` is +1 on omega (descent) and -1 on psi (ascent); ``eta`` is a per-coordinate step size (eta_1 on omega,
eta_2 on psi, a smaller one on the feature extractor in the pretrained regime). The correction is the
algorithm's difference: nothing (FedAvgGDA, FedSGDA), ``mu (theta - theta_0^t)`` (FedProxGDA),
``mu (theta - theta_0^t) + dual`` (FedMM). Both gradients are taken at the SAME point on the same fresh minibatch
(simultaneous, not alternating GDA), plain SGD, no momentum. :meth:`MinimaxAlgorithm.descent_ascent` states
this loop as a :class:`~fedsolve.core.statements.Descend` on the saddle objective.

A saddle objective near zero or negative says nothing about progress, so the divergence guard watches the
server's model ``w`` (its largest entry) instead of the train loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, weighted_mean
from fedsolve.families.minimax.saddle import OMEGA, minimax_of, player_signs


class GDAConfig(AlgorithmConfig):
    """Hyper-parameters shared by the minimax solvers (paper defaults, from scratch: spec 2.5)."""

    lr: float = Field(0.01, gt=0, description="eta_1: step size of the min player omega")
    lr_psi: float = Field(0.01, gt=0, description="eta_2: step size of the max player psi")
    feature_lr: float | None = Field(
        None,
        gt=0,
        description="step size of the 'features' block (pretrained "
        "regime: 0.0005); null: eta_1 times the problem's "
        "feature_scale (0.05 pretrained, else 1)",
    )
    local_epochs: float | None = Field(None, gt=0, description="local passes (local_steps takes precedence)")
    local_steps: int | None = Field(20, ge=1, description="M: local descent-ascent steps per round")
    batch_size: int | None = Field(64, ge=1, description="minibatch per client per local step (null: full batch)")
    aggregation: Literal["uniform", "sample_size"] = Field(
        "uniform", description="server mean: 'uniform' 1/N (the paper) or sample-size weighted"
    )

    @model_validator(mode="after")
    def _no_weight_decay(self):
        if self.weight_decay != 0:
            raise ValueError("weight_decay: not supported by the minimax solvers (the paper uses plain SGD); use 0")
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("local_steps: give local_steps (M) or local_epochs")
        return self


class MinimaxAlgorithm(Algorithm):
    """Base of FedMM and the GDA baselines: server state ``{"w": (omega_0, psi_0)}`` as one flat vector; the
    divergence guard watches it (a saddle objective near zero or negative is no train loss to watch)."""

    Config = GDAConfig
    cfg: GDAConfig
    watch = "w"

    def setup(self) -> None:
        mm = minimax_of(self.problem)
        self.objective = mm.loss
        om = self.layout.mask(OMEGA)
        self.sign = player_signs(self.layout).double()  # +1 omega (descent), -1 psi (ascent)
        self.sign[~om] *= mm.psi_scale  # psi's gradient factor (1 in the paper)
        lr = torch.where(om, self.cfg.lr, self.cfg.lr_psi)
        feature_lr = self.cfg.feature_lr
        if feature_lr is None and mm.feature_scale != 1.0:  # the pretrained regime: 0.01 x 0.05 = 0.0005
            feature_lr = self.cfg.lr * mm.feature_scale
        if feature_lr is not None:
            if not self.layout.has_block("features"):
                raise ValueError("feature_lr: the problem has no 'features' block")
            lr = torch.where(self.layout.mask("features"), feature_lr, lr)
        self.lr_vec = lr

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        if round_ is None:  # the global model is scored as it is
            return {}
        c = self.cfg
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def init(self, x0, rngs):
        return {"w": x0.clone()}, ClientStates(self.num_clients)

    def broadcast(self, server, ids, round_):
        return {"w": expand(server["w"], ids)}

    def aggregate(self, server, ids, uploads, round_):
        """The server average: 1/N over the clients of the round (the paper), or sample-size weighted."""
        rows = uploads["w"]
        if self.cfg.aggregation == "uniform":
            return {"w": rows.mean(0)}
        return {"w": weighted_mean(rows, self.client_weights[ids])}

    def eval_model(self, state, msg):
        """The global (omega_0, psi_0); scored with omega_0's label predictor on the target test data."""
        return msg["w"]


def descent_ascent(
    algo: MinimaxAlgorithm, start: Tensor, then, prox: Tensor | float = 0.0, linear: Tensor | None = None
) -> Descend:
    """The local loop of ``algo`` as a statement: ``theta <- theta - eta * [sign * grad f_i(theta) + linear +
    prox * (theta - start)]`` over the planned steps (simultaneous GDA on one fresh minibatch per step; ``sign`` =
    +1 on omega, ``-psi_scale`` on psi; ``eta`` per coordinate); ``then(theta, steps)`` gives the new client rows
    and the upload. The objective is a ``TensorLoss`` (its gradient is taken per parameter tensor)."""
    pull = not (isinstance(prox, float) and prox == 0.0)
    # .to(start): start's dtype and device
    return Descend(
        start=start,
        lr=algo.lr_vec.to(start),
        scale=algo.sign.to(start),
        objective=algo.objective,
        prox=prox,
        anchor=start if pull else None,
        linear=linear,
        then=then,
    )


def block_vector(layout, on_omega: float, on_psi: float) -> Tensor:
    """``[d]`` vector: ``on_omega`` on omega, ``on_psi`` on psi (mu_1/mu_2 of FedMM's local terms)."""
    return torch.where(layout.mask(OMEGA), float(on_omega), float(on_psi))
