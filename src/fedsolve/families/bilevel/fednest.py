"""FedNest and LFedNest (Tarzanagh et al., ICML 2022): the nested baselines of SimFBO (spec simfbo.md 3.7).

One engine round is one communication round, so an outer iteration is a fixed sequence of rounds: the phases of
a phase table (:data:`FEDNEST`, :data:`LFEDNEST`), whose current phase lives in the server state; ``broadcast`` sends
the phase's message and ``aggregate`` moves to the next phase. FedNest, per outer iteration (10 rounds with the
defaults):

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

Client samples: as in FedNest's code, one sample serves FedInn (anchor + inner) and a new one all of FedOut (p0,
the Neumann rounds, the hypergradient and the x-step): those phases keep the sample drawn when their block began
(``Phase.keeps_sample``); ``hold_sample: false`` draws afresh every round.
"""

from __future__ import annotations

import torch

from fedsolve.core.plans import Work
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.engine.phases import Phase, PhaseTable
from fedsolve.families.bilevel.common import BilevelAlgorithm, sent
from fedsolve.families.bilevel.fednest_config import FedNestConfig
from fedsolve.families.bilevel.local_steps import check_tau_clients, draw_tau, max_steps


# fmt: off
def fednest_table(hold: bool) -> PhaseTable:
    """FedNest's rounds as phases; ``hold``: the rounds after a block's first keep its client sample."""
    return PhaseTable(
        Phase("anchor", sends=("x", "y"), uploads=("gy",), then=("inner",),
              doc="FedInn: grad_y g_i(x, y0) on the full lower split (the SVRG anchor)"),
        Phase("inner", sends=("x", "y", "gy_glob"), uploads=("y",), then=("anchor", "p0"), keeps_sample=hold,
              doc="FedInn: SVRG local SGD on y; y = mean"),
        Phase("p0", sends=("x", "y"), uploads=("fy",), then=("neumann", "hypergrad"),
              doc="FedIHGP: grad_y f_i on the full upper split; p = counter = mean"),
        Phase("neumann", sends=("x", "y", "counter"), uploads=("hc",), then=("neumann", "hypergrad"),
              keeps_sample=hold, doc="FedIHGP: one Neumann term with the global Hessian"),
        Phase("hypergrad", sends=("x", "y", "p"), uploads=("hg",), then=("outer",), keeps_sample=hold,
              doc="FedOut: hg = mean_i (grad_x f_i - hlr grad2_xy g_i p)"),
        Phase("outer", sends=("x", "y", "hg_glob"), uploads=("x",), then=("anchor",), keeps_sample=hold,
              doc="FedOut: SVRG local x-steps; x = mean"),
        start="anchor")


#: FedNest's phases (the default ``hold_sample: true``)
FEDNEST = fednest_table(True)
#: LFedNest's phases (a fresh sample every round)
LFEDNEST = PhaseTable(
    Phase("inner", sends=("x", "y"), uploads=("y",), then=("inner", "outer_local"),
          doc="local SGD on y; y = mean"),
    Phase("outer_local", sends=("x", "y"), uploads=("x",), then=("inner",),
          doc="local Neumann series, local hypergradient, local x-steps; x = mean"),
    start="inner")

# fmt: on


class _Nested(BilevelAlgorithm):
    """Shared mechanics of FedNest and LFedNest: the server state and the client computations."""

    Config = FedNestConfig
    cfg: FedNestConfig

    def setup(self):
        spec, c = self.use_oracles("autograd").spec, self.cfg
        check_tau_clients(c.tau_clients, self.num_clients)
        full = lambda g: Work(epochs=None, steps=1, batch_size=None, group=g)
        self._work = {
            "lower_full": full(spec.lower_group),
            "upper_full": full(spec.upper_group),
            "lower_sgd": (
                Work(
                    epochs=None,
                    steps=max_steps(1, c.tau_max, c.tau_clients),
                    batch_size=c.batch_size,
                    group=spec.lower_group,
                )
                if c.heterogeneous
                else Work(epochs=c.local_ep, batch_size=c.batch_size, group=spec.lower_group)
            ),
            "upper_sgd": Work(
                epochs=None,
                steps=(max_steps(1, c.tau_max, c.tau_clients) if c.tau_outer else c.outer_tau),
                batch_size=c.batch_size,
                group=spec.upper_group,
            ),
        }

    @property
    def rounds_per_iteration(self) -> int:
        """Communication rounds of one outer iteration (FedNest 10, LFedNest 2 with the defaults)."""
        raise NotImplementedError

    def work(self, round_=0):
        return {} if round_ is None else self._work

    def init(self, x0, rngs):
        assert self.phases is not None, "FedNest and LFedNest declare their phases"
        x, y = self.oracles.split(x0)
        zy, zx = torch.zeros_like(y), torch.zeros_like(x)
        server = {
            "x": x.clone(),
            "y": y.clone(),
            "gy_glob": zy.clone(),
            "p": zy.clone(),
            "counter": zy.clone(),
            "hg_glob": zx.clone(),
            "done": torch.tensor(0),
            "iteration": torch.tensor(0),
            **self.phases.init(),
        }
        c = self.cfg
        if not c.heterogeneous:
            return server, ClientStates(self.num_clients)
        tau = draw_tau(rngs, self.num_clients, 1, c.tau_max, c.tau_clients).to(device=x0.device, dtype=x0.dtype)
        return server, ClientStates(self.num_clients, {"tau": tau})

    def broadcast(self, server, ids, round_):
        if round_ is None:
            return sent(server, ids, ("x", "y"))
        assert self.phases is not None, "FedNest and LFedNest declare their phases"
        ph = self.phases.current(server)
        return self.phases.message(ph, ids, **sent(server, ids, self.phases[ph].sends))

    def advance(self, server, round_: int, to: str, **changes):
        """``server`` with ``changes``, moved to phase ``to`` (a block that draws a new sample begins next round)."""
        out = {**server, **changes}
        assert self.phases is not None, "FedNest and LFedNest declare their phases"
        fresh = not self.phases[to].keeps_sample
        return self.phases.enter(out, to, round_ + 1 if fresh else None)

    # ------------------------------------------------------------ client computations (one client)
    def _lower_sgd(self, O, ctx, state, x, y, anchor: tuple | None):
        """Local SGD on y over the lower split (tau_i steps when heterogeneous); ``anchor = (y0, global
        gradient)``: the SVRG correction."""
        lr = self.cfg.lr
        for k in range(ctx.max_steps("lower_sgd")):
            b = ctx.batch("lower_sgd", k)
            g, _ = O.grad_y_g(x, y, b)
            if anchor is not None:
                y0, glob = anchor
                g = g - O.grad_y_g(x, y0, b)[0] + glob
            on = ctx.is_active("lower_sgd", k)
            if "tau" in state:
                on = on & (state["tau"] > k)
            y = y - lr * on.to(y.dtype) * g
        return y

    def _outer_steps(self, O, ctx, state, x0, y, hg):
        """outer_tau (or, with ``tau_outer``, tau_i) local x-steps x <- x - hlr (grad_x f_i(x; b) - grad_x f_i(x0; b)
        + hg)."""
        x = x0
        for k in range(ctx.max_steps("upper_sgd")):
            b = ctx.batch("upper_sgd", k)
            gx, _, _ = O.grad_f(x, y, b)
            gx0, _, _ = O.grad_f(x0, y, b)
            on = ctx.is_active("upper_sgd", k)
            if self.cfg.tau_outer:
                on = on & (state["tau"] > k)
            x = x - self.cfg.hlr * on.to(x.dtype) * (gx - gx0 + hg)
        return x

    def _local_hypergradient(self, O, ctx, x, y, p):
        """grad_x f_i - hlr grad2_xy g_i p on the full splits."""
        gx, _, _ = O.grad_f(x, y, ctx.batch("upper_full", 0))
        return gx - self.cfg.hlr * O.jvp_xy_g(x, y, p, ctx.batch("lower_full", 0))

    def record_upper_loss(self, O, ctx, msg) -> None:
        """Every phase reports the same number as its train loss: f_i at the broadcast (x, y) on the full upper
        split (the divergence check compares rounds of different phases)."""
        with torch.no_grad():
            ctx.record_loss(O.f(msg["x"], msg["y"], ctx.batch("upper_full", 0)), torch.ones((), dtype=torch.bool))


@register
class FedNest(_Nested):
    name = "fednest"
    description = "FedNest: FedInn (SVRG) + FedIHGP (global Neumann) + FedOut, 10 rounds per iteration (Tarzanagh 2022)"
    phases = FEDNEST

    def setup(self):
        super().setup()
        self.phases = FEDNEST if self.cfg.hold_sample else fednest_table(False)

    @property
    def rounds_per_iteration(self) -> int:
        c = self.cfg
        return 2 * c.inner_ep + 1 + c.neumann + 2

    def local_update(self, state, msg, ctx):
        O, x, y = self.oracles.on(ctx.client), msg["x"], msg["y"]
        self.record_upper_loss(O, ctx, msg)
        ph = self.phases.of(msg)
        if ph == "anchor":
            return {}, {"gy": O.grad_y_g(x, y, ctx.batch("lower_full", 0))[0]}
        if ph == "inner":
            return {}, {"y": self._lower_sgd(O, ctx, state, x, y, (y, msg["gy_glob"]))}
        if ph == "p0":
            return {}, {"fy": O.grad_f(x, y, ctx.batch("upper_full", 0))[1]}
        if ph == "neumann":
            return {}, {"hc": O.hvp_yy_g(x, y, msg["counter"], ctx.batch("lower_full", 0))}
        if ph == "hypergrad":
            return {}, {"hg": self._local_hypergradient(O, ctx, x, y, msg["p"])}
        return {}, {"x": self._outer_steps(O, ctx, state, x, y, msg["hg_glob"])}

    def aggregate(self, server, ids, uploads, round_):
        c, ph, mean = self.cfg, self.phases.current(server), (lambda k: uploads[k].mean(0))
        done = server["done"] + 1
        if ph == "anchor":
            return self.advance(server, round_, "inner", gy_glob=mean("gy"))
        if ph == "inner":
            more = int(done) < c.inner_ep
            return self.advance(
                server, round_, "anchor" if more else "p0", y=mean("y"), done=done if more else torch.tensor(0)
            )
        if ph == "p0":
            return self.advance(
                server, round_, "neumann" if c.neumann else "hypergrad", p=mean("fy"), counter=mean("fy")
            )
        if ph == "neumann":
            counter = server["counter"] - c.hlr * mean("hc")
            more = int(done) < c.neumann
            return self.advance(
                server,
                round_,
                "neumann" if more else "hypergrad",
                counter=counter,
                p=server["p"] + counter,
                done=done if more else torch.tensor(0),
            )
        if ph == "hypergrad":
            return self.advance(server, round_, "outer", hg_glob=mean("hg"))
        return self.advance(server, round_, "anchor", x=mean("x"), iteration=server["iteration"] + 1)


@register
class LFedNest(_Nested):
    name = "lfednest"
    description = "LFedNest: local SGD on y, then local Neumann + local hypergradient x-steps, 2 rounds per iteration"
    phases = LFEDNEST

    @property
    def rounds_per_iteration(self) -> int:
        return self.cfg.inner_ep + 1

    def local_update(self, state, msg, ctx):
        O, x, y = self.oracles.on(ctx.client), msg["x"], msg["y"]
        self.record_upper_loss(O, ctx, msg)
        if self.phases.of(msg) == "inner":
            return {}, {"y": self._lower_sgd(O, ctx, state, x, y, None)}
        _, fy, _ = O.grad_f(x, y, ctx.batch("upper_full", 0))
        p, counter = fy, fy
        for _ in range(self.cfg.neumann):  # the client's own Hessian (no communication)
            counter = counter - self.cfg.hlr * O.hvp_yy_g(x, y, counter, ctx.batch("lower_full", 0))
            p = p + counter
        hg = self._local_hypergradient(O, ctx, x, y, p)
        return {}, {"x": self._outer_steps(O, ctx, state, x, y, hg)}

    def aggregate(self, server, ids, uploads, round_):
        if self.phases.current(server) == "inner":
            done = server["done"] + 1
            more = int(done) < self.cfg.inner_ep
            return self.advance(
                server,
                round_,
                "inner" if more else "outer_local",
                y=uploads["y"].mean(0),
                done=done if more else torch.tensor(0),
            )
        return self.advance(server, round_, "inner", x=uploads["x"].mean(0), iteration=server["iteration"] + 1)
