"""FedNest and LFedNest (Tarzanagh et al., ICML 2022): the nested baselines of SimFBO (spec simfbo.md 3.7).

One engine round is one communication round, so an outer iteration is a fixed schedule of rounds whose
position (``phase``) lives in the server state; ``broadcast``/``aggregate`` branch on it and the message's
keys tell the client what to compute. FedNest, per outer iteration (10 rounds with the defaults):

    FedInn  (2 rounds x inner_ep)  anchor:   grad_y G(x, y0)          ~ mean_i grad_y g_i(x, y0)  (full lower split)
                                   inner:    local_ep epochs of SVRG SGD on y:
                                             y <- y - lr (grad_y g_i(y; b) - grad_y g_i(y0; b) + grad_y G(y0)); y = mean
    FedIHGP (1 + neumann rounds)   p0:       p = counter = mean_i grad_y f_i(x, y)            (full upper split)
                                   neumann:  counter <- counter - hlr mean_i H_i counter;  p <- p + counter
    FedOut  (2 rounds)             hypergrad: hg = mean_i (grad_x f_i - hlr grad2_xy g_i p)
                                   outer:    outer_tau local steps (tau_i with ``tau_outer``)
                                             x <- x - hlr (grad_x f_i(x; b) - grad_x f_i(x0; b) + hg);
                                             x = mean

LFedNest (2 rounds): FedInn with plain local SGD on y (1 round x inner_ep), then each client a LOCAL Neumann
series with its own Hessian, its local hypergradient and outer_tau x-steps (1 round); the server averages x.
The Hessian inverse is approximated as hlr sum_j (I - hlr H)^j (the FedNest code's convention).

Deviation: the engine samples a fresh set of clients every communication round (FedNest's code keeps one
sample through FedIHGP/FedOut); with full participation (Fig. 4) the two coincide.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsolve.engine.algorithm import register
from fedsolve.families.bilevel.common import BilevelAlgorithm
from fedsolve.families.bilevel.local_steps import draw_tau, max_steps, validate_tau
from fedsolve.families.bilevel.problem import BilevelOracles
from fedsolve.core.executor import Work
from fedsolve.core.states import ClientStates


class FedNestConfig(BaseModel):
    """Defaults: the FedNest repository's (fig2.sh; spec 3.4)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(0.01, gt=0, description="inner (y) step size")
    hlr: float = Field(0.01, gt=0, description="outer (x) step size and Neumann step")
    local_ep: float = Field(5.0, gt=0, description="local epochs of y-SGD over the lower split per FedInn")
    inner_ep: int = Field(1, ge=1, description="FedInn repetitions per outer iteration")
    neumann: int = Field(5, ge=0, description="Neumann-series terms of the inverse-Hessian-vector product")
    outer_tau: int = Field(1, ge=1, description="local x-steps per FedOut")
    batch_size: int | None = Field(64, ge=1, description="minibatch of the local SGD loops (null: full split)")
    tau_max: int | None = Field(None, ge=1, description="system heterogeneity (Fig. 4): FedInn's local y-SGD takes "
                                "each client's persistent tau_i ~ U{1..tau_max} steps instead of local_ep epochs "
                                "(the same draw as SimFBO's for a seed)")
    tau_clients: list[int] | None = Field(None, description="explicit persistent tau_i of FedInn, one per client")
    hold_sample: bool = Field(True, description="keep one client sample through FedInn (anchor + inner) and "
                              "one through FedOut (p0 ... outer), as FedNest's code does; false: a fresh sample "
                              "every communication round (every run before this option); LFedNest's phases "
                              "draw afresh either way")
    tau_outer: bool = Field(False, description="with tau_max / tau_clients: the local x-steps (FedOut) also take "
                            "each client's tau_i steps instead of outer_tau")

    @model_validator(mode="after")
    def _tau(self):
        validate_tau(self.tau_max, self.tau_clients)
        if self.tau_outer and not self.heterogeneous:
            raise ValueError("tau_outer: needs per-client tau_i (set tau_max or tau_clients)")
        return self

    @property
    def heterogeneous(self) -> bool:
        return self.tau_max is not None or self.tau_clients is not None


class _Nested(BilevelAlgorithm):
    """Shared mechanics of FedNest and LFedNest: the round schedule and the client computations."""

    Config = FedNestConfig

    def setup(self):
        self.oracles = BilevelOracles(self.problem)
        spec, c = self.oracles.spec, self.cfg
        full = lambda g: Work(epochs=None, steps=1, batch_size=None, group=g)  # noqa: E731
        self._work = {"lower_full": full(spec.lower_group), "upper_full": full(spec.upper_group),
                      "lower_sgd": (Work(epochs=None, steps=max_steps(1, c.tau_max, c.tau_clients),
                                         batch_size=c.batch_size, group=spec.lower_group) if c.heterogeneous else
                                    Work(epochs=c.local_ep, batch_size=c.batch_size, group=spec.lower_group)),
                      "upper_sgd": Work(epochs=None, steps=(max_steps(1, c.tau_max, c.tau_clients) if c.tau_outer
                                                            else c.outer_tau),
                                        batch_size=c.batch_size, group=spec.upper_group)}
        self.phases = self.build_schedule()

    def build_schedule(self) -> list[str]:
        """The phase names of one outer iteration, in order (``self.phases``)."""
        raise NotImplementedError

    @property
    def rounds_per_iteration(self) -> int:
        """Communication rounds of one outer iteration (FedNest 10, LFedNest 2 with the defaults)."""
        return len(self.phases)

    def work(self, round_=0):
        return self._work

    def init(self, x0, rngs):
        x, y = self.oracles.split(x0)
        zy, zx = torch.zeros_like(y), torch.zeros_like(x)
        server = {"x": x.clone(), "y": y.clone(), "phase": torch.zeros((), dtype=torch.long),
                  "gy_glob": zy.clone(), "p": zy.clone(), "counter": zy.clone(), "hg_glob": zx.clone()}
        c = self.cfg
        if not c.heterogeneous:
            return server, ClientStates(self.num_clients)
        tau = draw_tau(rngs, self.num_clients, 1, c.tau_max, c.tau_clients).to(device=x0.device, dtype=x0.dtype)
        return server, ClientStates(self.num_clients, {"tau": tau})

    def phase(self, server) -> str:
        return self.phases[int(server["phase"]) % len(self.phases)]

    #: phases that draw a new client sample when ``hold_sample`` is on (the rest reuse their block's draw)
    new_sample_at: frozenset[str] = frozenset()

    def sampling_round(self, server, round_):
        """With ``hold_sample``: the round where the current sampling block began (FedNest's code samples once
        for FedInn and once for FedOut; spec 3.7), from the phase counter, so a resumed run draws the same."""
        if not self.cfg.hold_sample or not self.new_sample_at:
            return round_
        k = int(server["phase"]) % len(self.phases)
        back = 0
        while self.phases[k - back] not in self.new_sample_at:
            back += 1
        return round_ - back

    # ------------------------------------------------------------ client computations (one client)
    def _lower_sgd(self, ctx, state, x, y, anchor: tuple | None):
        """Local SGD on y over the lower split (tau_i steps when heterogeneous); ``anchor = (y0, global
        gradient)``: the SVRG correction."""
        lr = self.cfg.lr
        for k in range(ctx.max_steps("lower_sgd")):
            b = ctx.batch("lower_sgd", k)
            g, _ = self.oracles.grad_y_g(x, y, b)
            if anchor is not None:
                y0, glob = anchor
                g = g - self.oracles.grad_y_g(x, y0, b)[0] + glob
            on = ctx.is_active("lower_sgd", k)
            if "tau" in state:
                on = on & (state["tau"] > k)
            y = y - lr * on.to(y.dtype) * g
        return y

    def _outer_steps(self, ctx, state, x0, y, hg):
        """outer_tau (or, with ``tau_outer``, tau_i) local x-steps x <- x - hlr (grad_x f_i(x; b) - grad_x f_i(x0; b)
        + hg)."""
        x = x0
        for k in range(ctx.max_steps("upper_sgd")):
            b = ctx.batch("upper_sgd", k)
            gx, _, _ = self.oracles.grad_f(x, y, b)
            gx0, _, _ = self.oracles.grad_f(x0, y, b)
            on = ctx.is_active("upper_sgd", k)
            if self.cfg.tau_outer:
                on = on & (state["tau"] > k)
            x = x - self.cfg.hlr * on.to(x.dtype) * (gx - gx0 + hg)
        return x

    def _local_hypergradient(self, ctx, x, y, p):
        """grad_x f_i - hlr grad2_xy g_i p on the full splits."""
        gx, _, _ = self.oracles.grad_f(x, y, ctx.batch("upper_full", 0))
        return gx - self.cfg.hlr * self.oracles.jvp_xy_g(x, y, p, ctx.batch("lower_full", 0))

    def record_upper_loss(self, ctx, msg) -> None:
        """Every phase reports the same number as its train loss: f_i at the broadcast (x, y) on the full upper
        split (the divergence check compares rounds of different phases)."""
        y = next(msg[k] for k in ("y", "y_anchor", "y_p0", "y_inner", "y_outer") if k in msg)
        with torch.no_grad():
            ctx.record_loss(self.oracles.f(msg["x"], y, ctx.batch("upper_full", 0)), torch.ones((), dtype=torch.bool))

    def _advance(self, server, **changes):
        return {**server, **changes, "phase": server["phase"] + 1}


@register
class FedNest(_Nested):
    name = "fednest"
    description = "FedNest: FedInn (SVRG) + FedIHGP (global Neumann) + FedOut, 10 rounds per iteration (Tarzanagh 2022)"

    new_sample_at = frozenset({"anchor", "p0"})   # FedInn, FedOut

    def build_schedule(self):
        c = self.cfg
        return ["anchor", "inner"] * c.inner_ep + ["p0"] + ["neumann"] * c.neumann + ["hypergrad", "outer"]

    def broadcast(self, server, ids, round_):
        ph = self.phase(server)
        e = lambda k: self.expand(server[k], ids)  # noqa: E731
        msg = {"x": e("x")}
        if ph == "anchor":
            msg["y_anchor"] = e("y")
        elif ph == "inner":
            msg.update(y=e("y"), gy_glob=e("gy_glob"))
        elif ph == "p0":
            msg["y_p0"] = e("y")
        elif ph == "neumann":
            msg.update(y=e("y"), counter=e("counter"))
        elif ph == "hypergrad":
            msg.update(y=e("y"), p=e("p"))
        else:
            msg.update(y=e("y"), hg_glob=e("hg_glob"))
        return msg

    def local_update(self, state, msg, ctx):
        O, x = self.oracles, msg["x"]
        self.record_upper_loss(ctx, msg)
        if "y_anchor" in msg:
            return {}, {"gy": O.grad_y_g(x, msg["y_anchor"], ctx.batch("lower_full", 0))[0]}
        if "gy_glob" in msg:
            return {}, {"y": self._lower_sgd(ctx, state, x, msg["y"], (msg["y"], msg["gy_glob"]))}
        if "y_p0" in msg:
            return {}, {"fy": O.grad_f(x, msg["y_p0"], ctx.batch("upper_full", 0))[1]}
        if "counter" in msg:
            return {}, {"hc": O.hvp_yy_g(x, msg["y"], msg["counter"], ctx.batch("lower_full", 0))}
        if "p" in msg:
            return {}, {"hg": self._local_hypergradient(ctx, x, msg["y"], msg["p"])}
        return {}, {"x": self._outer_steps(ctx, state, x, msg["y"], msg["hg_glob"])}

    def aggregate(self, server, ids, uploads, round_):
        ph, mean = self.phase(server), (lambda k: uploads[k].mean(0))
        if ph == "anchor":
            return self._advance(server, gy_glob=mean("gy"))
        if ph == "inner":
            return self._advance(server, y=mean("y"))
        if ph == "p0":
            return self._advance(server, p=mean("fy"), counter=mean("fy"))
        if ph == "neumann":
            counter = server["counter"] - self.cfg.hlr * mean("hc")
            return self._advance(server, counter=counter, p=server["p"] + counter)
        if ph == "hypergrad":
            return self._advance(server, hg_glob=mean("hg"))
        return self._advance(server, x=mean("x"))


@register
class LFedNest(_Nested):
    name = "lfednest"
    description = "LFedNest: local SGD on y, then local Neumann + local hypergradient x-steps, 2 rounds per iteration"

    def build_schedule(self):
        return ["inner"] * self.cfg.inner_ep + ["outer_local"]

    def broadcast(self, server, ids, round_):
        key = "y_inner" if self.phase(server) == "inner" else "y_outer"
        return {"x": self.expand(server["x"], ids), key: self.expand(server["y"], ids)}

    def local_update(self, state, msg, ctx):
        O, x = self.oracles, msg["x"]
        self.record_upper_loss(ctx, msg)
        if "y_inner" in msg:
            return {}, {"y": self._lower_sgd(ctx, state, x, msg["y_inner"], None)}
        y = msg["y_outer"]
        _, fy, _ = O.grad_f(x, y, ctx.batch("upper_full", 0))
        p, counter = fy, fy
        for _ in range(self.cfg.neumann):       # the client's own Hessian (no communication)
            counter = counter - self.cfg.hlr * O.hvp_yy_g(x, y, counter, ctx.batch("lower_full", 0))
            p = p + counter
        hg = self._local_hypergradient(ctx, x, y, p)
        return {}, {"x": self._outer_steps(ctx, state, x, y, hg)}

    def aggregate(self, server, ids, uploads, round_):
        if self.phase(server) == "inner":
            return self._advance(server, y=uploads["y"].mean(0))
        return self._advance(server, x=uploads["x"].mean(0))
