"""Partial-model personalization baselines, and the machinery FedAPM shares with them.

A client's model is split into a personal block ``v_i`` (never leaves the client, never averaged)
and a shared block ``u``. Client state rows: ``v`` ``[m, d_v]`` and ``u`` ``[m, d_u]`` (the
client's latest local copy of the shared block); the server holds ``u`` ``[d_u]`` and, for
all-client stale averaging, a cache ``z`` ``[m, d_u]`` of the latest uploads.

Pillutla, Malik, Mohamed, Rabbat, Sanjabi, Xiao. "Federated Learning with Partial Model
Personalization", ICML 2022:

* **FedAlt** (Gauss-Seidel): ``v_i^{t+1} = LocalSGD_v f_i(., u^t)`` from ``v_i^t``, then
  ``u_i^{t+1} = LocalSGD_u f_i(v_i^{t+1}, .)`` from ``u^t``; server ``u^{t+1} = sum_S w_i u_i^{t+1}``.
* **FedSim** (Jacobi): joint SGD steps on ``(v_i, u_i)`` from ``(v_i^t, u^t)`` on the same minibatches.

Configurations of those two (not copies):

* **FedPer** (Arivazhagan et al. 2019) = FedSim with output (head) personalization;
* **LG-FedAvg** (Liang et al. 2020) = FedSim with input (lower-layer) personalization;
* **FedRep** (Collins et al. 2021) = FedAlt with output personalization, many head epochs (10)
  and one body epoch.

Full-model personalization baselines of FedAPM's Table 4:

* **Ditto** (Li, Hu, Beirami, Smith, ICML 2021): FedAvg on the global ``w`` plus a personal
  ``v_i`` solving ``min f_i(v) + (lam/2)||v - w^t||^2`` by local SGD;
* **pFedMe** (Dinh, Tran, Nguyen, NeurIPS 2020): per local step, ``K`` inner steps on
  ``theta ~ argmin f_i(theta) + (lam/2)||theta - w||^2``, then ``w <- w - eta lam (w - theta)``;
  server ``w <- (1-beta) w + beta mean_S w_i``.

Which parameters are personal: ``personalization: problem`` uses the problem's ``personal`` block
(none defined: nothing is personal), or a preset type (``input`` | ``output`` | ``split_input``)
built from the model's parameter groups (see ``fedsolve.families.personalized.blocks``).
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedsolve.engine.algorithm import (Algorithm, AlgorithmConfig, aggregation_weights, register, stale_mean_step,
                                     weighted_mean)
from fedsolve.families.classic.fedavg import FedAvg, FedAvgConfig
from fedsolve.core.context import ParamBlock
from fedsolve.core.executor import LocalContext, Work
from fedsolve.core.states import ClientStates
from fedsolve.families.personalized.blocks import personal_mask

Personalization = Literal["problem", "input", "output", "split_input", "split-input"]


class PartialConfig(AlgorithmConfig):
    """Hyper-parameters shared by partial-personalization algorithms."""

    personalization: Personalization = Field(
        "problem", description="personal block: the problem's 'personal' block, or a preset type")
    alpha: Literal["one", "uniform", "samples"] = Field(
        "one", description="loss weight alpha_i in the local objective: 1, 1/m or n_i/n")
    personal_epochs: float | None = Field(None, gt=0, description="epochs of the personal (v) phase "
                                                                  "(null: local_epochs)")
    personal_steps: int | None = Field(None, ge=1, description="steps of the personal phase (overrides epochs; "
                                                               "null: local_steps)")
    personal_lr: float | None = Field(None, gt=0, description="learning rate of the personal block (null: lr)")
    eval_shared: Literal["local", "server"] = Field(
        "server", description="evaluate client i with (v_i, u_i) ('local') or (v_i, u^t) ('server')")
    log_other_eval: bool = Field(False, description="also log test accuracy/loss of the other eval_shared choice "
                                                    "(keys other_eval_*)")


class BaselineConfig(PartialConfig):
    aggregate_over: Literal["selected", "all"] = Field(
        "selected", description="'selected': mean over this round's uploads (standard); 'all': mean over "
                                "all m clients' latest (stale) uploads (FedAPM code's quirk)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="server mean weights")


class PartialAlgorithm(Algorithm):
    """Base class: personal/shared split, v- and u-phases, server averaging of the shared block."""

    Config = BaselineConfig
    #: the personalization used when the config says ``problem`` and the problem defines none
    default_personalization: str | None = None

    # ------------------------------------------------------------------ split / join
    def setup(self) -> None:
        kind = self.cfg.personalization
        if kind == "problem" and not self.layout.has_block("personal") and self.default_personalization:
            kind = self.default_personalization
        pmask = personal_mask(self.problem, kind)
        self.pmask, self.smask = pmask, ~pmask   # [d] masks of the personal and the shared block
        #: the two blocks as whole parameter tensors: v = pblock.gather(full), u = sblock.gather(full)
        self.pblock = ParamBlock(self.layout, pmask)
        self.sblock = self.pblock.rest
        self.d_v, self.d_u = self.pblock.size, self.sblock.size
        if self.d_u == 0:
            raise ValueError(f"{self.name}: the personal block covers the whole model (no shared block)")

    def split(self, full: Tensor) -> tuple[Tensor, Tensor]:
        """Flat ``[..., d]`` -> personal ``[..., d_v]``, shared ``[..., d_u]``."""
        return self.pblock.gather(full), self.sblock.gather(full)

    def join(self, v: Tensor, u: Tensor) -> Tensor:
        """Inverse of ``split`` (pure indexing: vmappable, differentiable)."""
        return self.pblock.scatter(v, u)

    def alpha(self, ctx: LocalContext) -> float | Tensor:
        a = self.cfg.alpha
        return 1.0 if a == "one" else (1.0 / self.num_clients if a == "uniform" else ctx.weight)

    # ------------------------------------------------------------------ local work
    def work(self, round_: int = 0) -> dict[str, Work]:
        c = self.cfg
        w = {"u": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}
        if self.d_v:
            pe = c.personal_epochs if c.personal_epochs is not None else c.local_epochs
            ps = c.personal_steps if c.personal_steps is not None else (
                c.local_steps if c.personal_epochs is None else None)
            w["v"] = Work(epochs=pe, steps=ps, batch_size=c.batch_size)
        return w

    def v_step(self, ctx: LocalContext, v: Tensor, u: Tensor, affine: tuple | None = None,
               until: Callable | None = None) -> Tensor:
        """Local SGD on the personal block with the shared block fixed at ``u`` (phase ``v``)."""
        if not self.d_v:
            return v
        return self.block_step(ctx, self.pblock, v, u, "v", self.cfg.personal_lr or self.cfg.lr, affine, until)

    def u_step(self, ctx: LocalContext, v: Tensor, u: Tensor, affine: tuple | None = None,
               until: Callable | None = None) -> Tensor:
        """Local SGD on the shared block with the personal block fixed at ``v`` (phase ``u``)."""
        return self.block_step(ctx, self.sblock, u, v, "u", self.cfg.lr, affine, until)

    def block_step(self, ctx: LocalContext, block: ParamBlock, p: Tensor, rest: Tensor, phase: str, lr: float,
                   affine: tuple | None = None, until: Callable | None = None) -> Tensor:
        """``ctx.block_sgd`` on ``alpha_i f_i`` with the L2 term ``(weight_decay/2)||.||^2`` in ``f_i`` and the
        phase's own affine term ``(a, c)``: step direction ``alpha_i grad f_i + (alpha_i wd + a) p + c`` on the
        block only (the gradient of the block's tensors, no pass over the rest of the model)."""
        scale = self.alpha(ctx)
        a, c = affine if affine is not None else (0.0, None)
        if self.cfg.weight_decay > 0:
            a = scale * self.cfg.weight_decay + a
        return ctx.block_sgd(block, p, rest, lr, phase, scale=scale, affine=(a, c), until=until)

    # ------------------------------------------------------------------ uploads and the running sum
    @property
    def over_all(self) -> bool:
        """The server averages all m clients' latest uploads (``aggregate_over: all``; FedAPM always)."""
        return getattr(self.cfg, "aggregate_over", "all") == "all"

    def z_of(self, state: dict[str, Tensor]) -> Tensor:
        """``z_i``: what client i uploads, recomputed from its own state (here its shared block ``u_i``)."""
        return state["u"]

    def upload(self, state: dict[str, Tensor], new: dict[str, Tensor]) -> dict[str, Tensor]:
        """The message of a participant with state ``state`` before the round and ``new`` after it: ``z_i^{t+1}``
        (mean over the selected), or ``z_i^{t+1} - z_i^t`` when the server averages all m clients (it keeps
        their running sum, so a round costs O(participants); d_u floats either way)."""
        z = self.z_of(new)
        return {"dz": z - self.z_of(state)} if self.over_all else {"z": z}

    def _all_weights(self, ids: Tensor | None, like: Tensor) -> Tensor:
        return aggregation_weights(self, ids, like, getattr(self.cfg, "weighting", "uniform"))

    # ------------------------------------------------------------------ the five functions
    def init(self, x0, rngs):
        v0, u0 = self.split(x0)
        m = self.num_clients
        server = {"u": u0.clone()}
        if self.over_all:   # S = sum_i w_i z_i over all m clients, with z_i^0 = u^0 (float64: no drift over rounds)
            server["zsum"] = self._all_weights(None, u0).double().sum() * u0.double()
        return server, ClientStates(m, defaults={"v": v0, "u": u0, "drift": x0.new_zeros(())})

    def broadcast(self, server, ids, round_):
        return {"u": self.expand(server["u"], ids)}

    def aggregate(self, server, ids, uploads, round_):
        """``u^{t+1} = sum_i w_i z_i / sum_i w_i`` over all m clients' latest ``z_i`` (stale for the others),
        kept as the running sum ``S`` updated by the participants' differences; or over this round's uploads."""
        new = dict(server)
        if self.over_all:
            dz = uploads["dz"]
            new["zsum"], new["u"] = stale_mean_step(server["zsum"], dz, self._all_weights(ids, dz),
                                                    self._all_weights(None, server["zsum"]).sum())
        elif getattr(self.cfg, "weighting", "uniform") == "uniform":
            new["u"] = uploads["z"].mean(0)
        else:
            new["u"] = weighted_mean(uploads["z"], self.client_weights[ids])
        return new

    def eval_broadcast(self, server, ids):
        return {"u": self.expand(server["u"], ids)}

    def eval_model(self, state, msg):
        return self.join(state["v"], state["u"] if self.cfg.eval_shared == "local" else msg["u"])

    def diagnostics(self, server, clients):
        gap = (clients["u"] - server["u"]).norm(dim=-1)
        out = {"model_deviation": float(gap.sum()), "local_drift": float(clients["drift"].mean())}
        return out

    def extra_evals(self, server, clients):
        """With ``log_other_eval``: the other ``eval_shared`` choice's models, scored by the engine as
        ``other_eval_*`` (an optional capability the engine looks for)."""
        if not self.cfg.log_other_eval:
            return {}
        other = clients["u"] if self.cfg.eval_shared == "server" else server["u"].expand_as(clients["u"])
        return {"other_eval_": self.join(clients["v"], other)}

    @staticmethod
    def drift(u_new: Tensor, u_t: Tensor) -> Tensor:
        """``||u_i^{t+1} - u^t||``: the paper's model deviation of one participating client."""
        return (u_new - u_t).norm()


@register
class FedAlt(PartialAlgorithm):
    name = "fedalt"
    description = "FedAlt: alternating personal-then-shared local SGD, average shared block (Pillutla 2022)"

    def local_update(self, state, msg, ctx):
        u_t = msg["u"]
        v = self.v_step(ctx, state["v"], u_t)
        u = self.u_step(ctx, v, u_t)
        new = {"v": v, "u": u, "drift": self.drift(u, u_t)}
        return new, self.upload(state, new)


@register
class FedSim(PartialAlgorithm):
    name = "fedsim"
    description = "FedSim: simultaneous local SGD on personal and shared blocks (Pillutla et al. 2022)"

    def work(self, round_: int = 0):
        c = self.cfg
        return {"train": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}

    def local_update(self, state, msg, ctx):
        u_t, c = msg["u"], self.cfg
        lr = c.lr if c.personal_lr is None else torch.where(self.pmask, c.personal_lr, c.lr)
        full = self.local_sgd(ctx, self.join(state["v"], u_t), "train", lr=lr, scale=self.alpha(ctx))
        v, u = self.split(full)
        new = {"v": v, "u": u, "drift": self.drift(u, u_t)}
        return new, self.upload(state, new)


class _OutputConfig(BaselineConfig):
    personalization: Personalization = "output"


class _InputConfig(BaselineConfig):
    personalization: Personalization = "input"


class FedRepConfig(BaselineConfig):
    personalization: Personalization = "output"
    personal_epochs: float | None = Field(10.0, gt=0, description="head epochs (FedRep: many)")
    local_epochs: float | None = Field(1.0, gt=0, description="body epochs")


@register
class FedPer(FedSim):
    name = "fedper"
    description = "FedPer: FedSim with a personal head (output personalization; Arivazhagan et al. 2019)"
    Config = _OutputConfig


@register
class LGFedAvg(FedSim):
    name = "lgfedavg"
    description = "LG-FedAvg: FedSim with personal lower layers (input personalization; Liang et al. 2020)"
    Config = _InputConfig


@register
class FedRep(FedAlt):
    name = "fedrep"
    description = "FedRep: FedAlt with a personal head, many head epochs then body epochs (Collins et al. 2021)"
    Config = FedRepConfig


# ---------------------------------------------------------------------- full-model personalization
class DittoConfig(FedAvgConfig):
    lam: float = Field(0.1, ge=0, description="Ditto's lambda: pull of the personal model to the global one")
    personal_epochs: float | None = Field(None, gt=0, description="epochs of the personal solve (null: local_epochs)")
    personal_lr: float | None = Field(None, gt=0, description="personal learning rate (null: lr)")
    eval_model: Literal["personal", "global"] = Field("personal", description="model each client is scored with")


@register
class Ditto(FedAvg):
    name = "ditto"
    description = "Ditto: FedAvg global model + personal models pulled to it by (lam/2)||v - w||^2 (Li 2021)"
    Config = DittoConfig

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        return server, ClientStates(self.num_clients, defaults={"v": x0})

    def work(self, round_: int = 0):
        c = self.cfg
        pe = c.personal_epochs if c.personal_epochs is not None else c.local_epochs
        return {**super().work(), "personal": Work(epochs=pe, steps=c.local_steps if c.personal_epochs is None
                                                   else None, batch_size=c.batch_size)}

    def local_update(self, state, msg, ctx):
        w_t, lam = msg["w"], self.cfg.lam
        w = self.local_sgd(ctx, w_t, extra=self.prox_term(msg))
        v = self.local_sgd(ctx, state["v"], "personal", extra=lambda p: lam * (p - w_t), lr=self.cfg.personal_lr)
        return {"v": v}, {"w": w}

    def eval_model(self, state, msg):
        return state["v"] if self.cfg.eval_model == "personal" else msg["w"]


class PFedMeConfig(FedAvgConfig):
    lr: float = Field(0.005, gt=0, description="local step size eta for the local model w")
    personal_lr: float = Field(0.01, gt=0, description="step size of the K inner steps on theta")
    lam: float = Field(15.0, gt=0, description="Moreau-envelope coefficient lambda")
    inner_steps: int = Field(5, ge=1, description="K: inner gradient steps on theta per local step")
    beta: float = Field(1.0, gt=0, description="server mixing beta (1: plain averaging)")
    eval_model: Literal["personal", "global"] = Field("personal", description="model each client is scored with")


@register
class PFedMe(FedAvg):
    name = "pfedme"
    description = "pFedMe: Moreau-envelope personalization, K inner steps per local step (Dinh et al. 2020)"
    Config = PFedMeConfig

    def init(self, x0, rngs):
        server, _ = super().init(x0, rngs)
        return server, ClientStates(self.num_clients, defaults={"theta": x0})

    def local_update(self, state, msg, ctx):
        c = self.cfg
        w = msg["w"]
        theta = w
        for s in range(ctx.max_steps()):
            live = ctx.is_active("train", s)
            th = theta
            for _ in range(c.inner_steps):  # same minibatch for the K inner steps, as in pFedMe's code
                fval, g = ctx.loss_grad(th, "train", s)
                th = th - c.personal_lr * (g + c.weight_decay * th + c.lam * (th - w))
            ctx.record_loss(fval, live)
            theta = torch.where(live, th, theta)
            w = torch.where(live, w - c.lr * c.lam * (w - theta), w)
        return {"theta": theta}, {"w": w}

    def aggregate(self, server, ids, uploads, round_):
        w = super().aggregate(server, ids, uploads, round_)["w"]
        return {"w": (1 - self.cfg.beta) * server["w"] + self.cfg.beta * w}

    def eval_model(self, state, msg):
        return state["theta"] if self.cfg.eval_model == "personal" else msg["w"]
