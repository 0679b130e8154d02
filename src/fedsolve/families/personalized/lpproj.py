"""lp-proj (Lin, Han, Li, Zhang, "Personalized Federated Learning towards Communication Efficiency, Robustness and
Fairness", NeurIPS 2022), one of FedAPM's Table 4 baselines: every client keeps a personal model theta_i in R^D; what
the clients share is a k-dimensional model w (k << D) that stands for the projection P theta_i of their personal
models, P a fixed random k x D matrix (unit rows; orthonormal with ``orthogonalize``) that every party draws from the
same seed, so only k floats travel each way:

    min_{w, theta_1..theta_m}  sum_i f_i(theta_i) + lam ||w - P theta_i||_p

Client i, given w^t (w_i = w^t, c = w_i - P theta_i):

    each local step, on one minibatch:
        theta_i <- theta_i - lr * (clip(grad f_i(theta_i)) - lam * P^T (sign(c) |c|^(p-1)))    (the theta-step)
    after every ``personal_steps`` of them:
        w_i <- w_i - local_lr * lam * sign(c) (|c| / ||c||_p)^(p-1)                             (the w-step)
    upload w_i
server:   w^{t+1} = the sample-size weighted mean of the uploaded w_i;  theta_i never leaves the client.

For p = 1 (the authors' default) both steps are subgradient steps on lam ||w - P theta_i||_1; for p > 1 the
theta-step is the gradient of (lam / p) ||c||_p^p and the w-step that of lam ||c||_p, as in the authors' code.
``clip`` bounds the norm of grad f_i (their ``clip_grad_norm_(., 60)``). Each client is scored with theta_i.
Departures from the authors' code (stated, not hidden): only the round's sampled clients train (their code trains
every client each round and averages a sample of K of them); theta_i starts at the common initial model (theirs: a
fresh model per client); ``weight_decay`` enters the theta-step (their optimizer's weight decay is computed and
dropped, a no-op); the local work is the usual epochs or steps (theirs: ``num_local_round`` x ``num_epoch`` steps,
i.e. ``local_steps = 100``, ``personal_steps = 20``); a last run of fewer than ``personal_steps`` steps ends the
round without a w-step.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, expand, register, weighted_mean


class LpProjConfig(AlgorithmConfig):
    lam: float = Field(15.0, ge=0, description="lam: weight of ||w - P theta_i||_p (the official lamda)")
    p: float = Field(1.0, ge=1, description="the norm's p (1: the authors' default)")
    proj_dim: int = Field(10, ge=1, description="k: the shared model's dimension, P's rows (the official d)")
    local_lr: float = Field(0.1, gt=0, description="step of the w-step (the official local_lr); lr is theta's step")
    personal_steps: int = Field(20, ge=1, description="theta-steps between two w-steps (the official num_epoch)")
    clip: float | None = Field(60.0, gt=0, description="largest norm of grad f_i in a theta-step (null: no clip)")
    orthogonalize: bool = Field(False, description="orthonormal rows of P (Gram-Schmidt) instead of unit rows")
    proj_seed: int = Field(0, ge=0, description="seed of P, the same for the server and every client")


def _power_sign(c: Tensor, p: float) -> Tensor:
    """``sign(c) |c|^(p-1)``; ``sign(c)`` for p = 1 (no 0^0)."""
    return torch.sign(c) if p == 1 else torch.sign(c) * c.abs().pow(p - 1)


@register
class LpProj(Algorithm):
    name = "lpproj"
    description = "lp-proj: personal models tied to a shared low-dimensional projection by an lp penalty (Lin 2022)"
    Config = LpProjConfig
    cfg: LpProjConfig

    def setup(self) -> None:
        """P: ``proj_dim`` x D Gaussian rows of unit norm, from ``proj_seed`` (orthonormal with ``orthogonalize``)."""
        c, dim = self.cfg, self.layout.dim
        if c.orthogonalize and c.proj_dim > dim:
            raise ValueError(f"proj_dim: {c.proj_dim}; allowed with orthogonalize: 1 to {dim}, the model's size")
        gen = torch.Generator().manual_seed(c.proj_seed)
        P = torch.randn(c.proj_dim, dim, generator=gen, dtype=torch.float64)
        P = torch.linalg.qr(P.T).Q.T if c.orthogonalize else P / P.norm(dim=1, keepdim=True)
        self.P = P

    def init(self, x0, rngs):
        server = {"w": x0.new_zeros(self.cfg.proj_dim)}
        return server, ClientStates(self.num_clients, defaults={"theta": x0})

    def broadcast(self, server, ids, round_):
        return {"w": expand(server["w"], ids)}

    def local_update(self, state, msg, ctx):
        c = self.cfg
        theta, w = state["theta"], msg["w"]
        P = self.P.to(theta)
        done = torch.zeros((), dtype=theta.dtype)
        for s in range(ctx.max_steps("train")):
            live = ctx.is_active("train", s)
            loss, g = ctx.loss_grad(theta, "train", s)
            if c.clip is not None:
                g = g * (c.clip / (g.norm() + 1e-6)).clamp(max=1.0)
            pull = c.lam * P.T @ _power_sign(w - P @ theta, c.p)
            theta = torch.where(live, theta - c.lr * (g + c.weight_decay * theta - pull), theta)
            ctx.record_loss(loss, live)
            done = done + live.to(done)
            gap = w - P @ theta
            scale = 1.0 if c.p == 1 else torch.linalg.vector_norm(gap, ord=c.p).clamp_min(1e-30) ** (1 - c.p)
            w_step = live & (torch.remainder(done, c.personal_steps) == 0)
            w = torch.where(w_step, w - c.local_lr * c.lam * _power_sign(gap, c.p) * scale, w)
        return {"theta": theta}, {"w": w}

    def aggregate(self, server, ids, uploads, round_):
        return {"w": weighted_mean(uploads["w"], self.client_weights[ids])}

    def eval_model(self, state, msg):
        return state["theta"]
