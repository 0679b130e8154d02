"""Partial-model personalization: what FedAPM and the baselines of Pillutla et al. (2022) share.

A client's model is split into a personal block ``v_i`` (never leaves the client, never averaged) and a shared
block ``u``. Client state rows: ``v`` ``[m, d_v]``, ``u`` ``[m, d_u]`` (the client's latest local copy of the shared
block) and ``drift`` (``||u_i - u^t||`` at its latest participation); the server holds ``u`` ``[d_u]`` and, when it
averages all m clients' latest (stale) uploads, their running sum ``zsum``.

Each local phase trains one block with the other fixed, stated as a ``Descend`` on that block
(:meth:`PartialAlgorithm.block_descent`): the step direction is ``alpha_i grad f_i + (alpha_i wd + a) p + c`` with
the phase's own affine term ``(a, c)`` (FedAPM's proximal pull and dual; none for FedAlt).

Which parameters are personal: ``personalization: problem`` uses the problem's ``personal`` block (none defined:
nothing is personal), or a preset type (``input`` | ``output`` | ``split_input``) built from the model's parameter
groups (``fedsolve.families.personalized.blocks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedsolve.core.context import LocalContext, ParamBlock
from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend, Then
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import (
    Algorithm,
    AlgorithmConfig,
    aggregation_weights,
    expand,
    stale_mean_step,
    weighted_mean,
)
from fedsolve.families.personalized.blocks import personal_mask

Personalization = Literal["problem", "input", "output", "split_input", "split-input"]


class PartialConfig(AlgorithmConfig):
    """Hyper-parameters shared by partial-personalization algorithms."""

    personalization: Personalization = Field(
        "problem", description="personal block: the problem's 'personal' block, or a preset type"
    )
    alpha: Literal["one", "uniform", "samples"] = Field(
        "one", description="loss weight alpha_i in the local objective: 1, 1/m or n_i/n"
    )
    personal_epochs: float | None = Field(
        None, gt=0, description="epochs of the personal (v) phase (null: local_epochs)"
    )
    personal_steps: int | None = Field(
        None, ge=1, description="steps of the personal phase (overrides epochs; null: local_steps)"
    )
    personal_lr: float | None = Field(None, gt=0, description="learning rate of the personal block (null: lr)")
    eval_shared: Literal["local", "server"] = Field(
        "server", description="evaluate client i with (v_i, u_i) ('local') or (v_i, u^t) ('server')"
    )
    log_other_eval: bool = Field(
        False, description="also log test accuracy/loss of the other eval_shared choice (keys other_eval_*)"
    )


class BaselineConfig(PartialConfig):
    aggregate_over: Literal["selected", "all"] = Field(
        "selected",
        description="'selected': mean over this round's uploads (standard); 'all': mean over "
        "all m clients' latest (stale) uploads (FedAPM code's quirk)",
    )
    weighting: Literal["samples", "uniform"] = Field("samples", description="server mean weights")


def drift(u_new: Tensor, u_t: Tensor) -> Tensor:
    """``||u_i^{t+1} - u^t||`` (over the last axis): the paper's model deviation of a participating client."""
    return torch.linalg.vector_norm(u_new - u_t, dim=-1)


class PartialAlgorithm(Algorithm):
    """Base class: personal/shared split, v- and u-phases, server averaging of the shared block."""

    # the baselines' config; FedAPM's is a PartialConfig without the server-mean options (read with getattr)
    Config: ClassVar[type[PartialConfig]] = BaselineConfig
    cfg: PartialConfig
    #: the personalization used when the config says ``problem`` and the problem defines none
    default_personalization: Personalization | None = None

    # ------------------------------------------------------------------ split / join
    def setup(self) -> None:
        kind = self.cfg.personalization
        if kind == "problem" and not self.layout.has_block("personal") and self.default_personalization:
            kind = self.default_personalization
        pmask = personal_mask(self.problem, kind)
        self.pmask, self.smask = pmask, ~pmask  # [d] masks of the personal and the shared block
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
        """Inverse of ``split`` (pure indexing over the last axis, differentiable)."""
        return self.pblock.scatter(v, u)

    def alpha(self, ctx: LocalContext) -> float | Tensor:
        a = self.cfg.alpha
        return 1.0 if a == "one" else (1.0 / self.num_clients if a == "uniform" else ctx.weight)

    # ------------------------------------------------------------------ local work
    def work(self, round_: int | None = 0) -> dict[str, Work]:
        c = self.cfg
        if round_ is None:
            return {}
        w = {"u": Work(epochs=c.local_epochs, steps=c.local_steps, batch_size=c.batch_size)}
        if self.d_v:
            pe = c.personal_epochs if c.personal_epochs is not None else c.local_epochs
            ps = (
                c.personal_steps
                if c.personal_steps is not None
                else (c.local_steps if c.personal_epochs is None else None)
            )
            w["v"] = Work(epochs=pe, steps=ps, batch_size=c.batch_size)
        return w

    def block_descent(
        self,
        ctx: LocalContext,
        phase: Literal["v", "u"],
        start: Tensor,
        rest: Tensor,
        prox: float = 0.0,
        linear: Tensor | None = None,
        until: Callable | None = None,
        then: Then | None = None,
    ) -> Descend:
        """Local SGD on ``alpha_i f_i`` (with the L2 term ``(weight_decay/2)||.||^2`` in ``f_i``) over one block:
        the personal block (phase ``v``, learning rate ``personal_lr``) with the shared one fixed at ``rest``, or the
        shared block (phase ``u``) with the personal one fixed at ``rest``; the phase's own terms ``prox * p +
        linear`` join the step direction (``until``: a stopping rule; ``then``: the statement's last step)."""
        c = self.cfg
        block, lr = (self.pblock, c.personal_lr or c.lr) if phase == "v" else (self.sblock, c.lr)
        return Descend(
            start=start,
            block=block,
            rest=rest,
            lr=lr,
            phase=phase,
            scale=self.alpha(ctx),
            weight_decay=c.weight_decay,
            prox=prox,
            linear=linear,
            until=until,
            then=then,
        )

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

    # ------------------------------------------------------------------ the functions
    def init(self, x0, rngs):
        v0, u0 = self.split(x0)
        m = self.num_clients
        server = {"u": u0.clone()}
        if self.over_all:  # S = sum_i w_i z_i over all m clients, with z_i^0 = u^0 (float64: no drift over rounds)
            server["zsum"] = self._all_weights(None, u0).double().sum() * u0.double()
        return server, ClientStates(m, defaults={"v": v0, "u": u0, "drift": x0.new_zeros(())})

    def broadcast(self, server, ids, round_):
        return {"u": expand(server["u"], ids)}

    def aggregate(self, server, ids, uploads, round_):
        """``u^{t+1} = sum_i w_i z_i / sum_i w_i`` over all m clients' latest ``z_i`` (stale for the others),
        kept as the running sum ``S`` updated by the participants' differences; or over this round's uploads."""
        new = dict(server)
        if self.over_all:
            dz = uploads["dz"]
            new["zsum"], new["u"] = stale_mean_step(
                server["zsum"], dz, self._all_weights(ids, dz), self._all_weights(None, server["zsum"]).sum()
            )
        elif getattr(self.cfg, "weighting", "uniform") == "uniform":
            new["u"] = uploads["z"].mean(0)
        else:
            new["u"] = weighted_mean(uploads["z"], self.client_weights[ids])
        return new

    def eval_model(self, state, msg):
        return self.join(state["v"], state["u"] if self.cfg.eval_shared == "local" else msg["u"])

    def report(self, server, clients, final: bool = False):
        """``model_deviation = sum_i ||u_i - u||``, ``local_drift`` (mean ``||u_i - u^t||`` at each client's latest
        participation) and, with ``log_other_eval``, the other ``eval_shared`` choice's models (scored by the engine
        as ``other_eval_*``)."""
        if final:
            return {}
        gap = (clients["u"] - server["u"]).norm(dim=-1)
        out: dict[str, Any] = {"model_deviation": float(gap.sum()), "local_drift": float(clients["drift"].mean())}
        if self.cfg.log_other_eval:
            other = clients["u"] if self.cfg.eval_shared == "server" else server["u"].expand_as(clients["u"])
            out["other_eval_"] = self.join(clients["v"], other)
        return out
