"""FBO-AggITD (Xiao & Ji, ICML 2023) -- a RECONSTRUCTION from the paper's description (spec simfbo.md 3.7).

The authors' code is not public (SimFBO's authors received it privately) and the paper was not available
to us, so this is built from what spec 3.7 and the SimFBO paper (Sec. 1, Fig. 1) say: AggITD does the
federated lower-level optimisation (local SGD on y, server aggregation over a sub-loop of communication
rounds) and the hypergradient estimation in the SAME sub-loop, by iterative differentiation (ITD) through
the server-aggregated iterates with Hessian- and Jacobian-vector products evaluated at the local iterates;
the server then updates x. One outer iteration (x fixed at x^t) is the sub-loop of N = ``inner_rounds``
communication rounds n = 0..N-1:

    server -> sampled clients:  x^t, y^n, v^n                     (v^0 = 0: the unrolled product restarts)
    client i, k = 0..tau_i-1, both at the SAME local point (x^t, y_k, v_k):
        y_{k+1} = y_k - beta grad_y g_i(x^t, y_k)                                    (local SGD on y)
        v_{k+1} = v_k - beta (grad2_yy g_i(x^t, y_k) v_k - grad_y f_i(x^t, y_k))     (ITD product, forward)
        last round only:  h_{x,i} = mean_k [grad_x f_i(x^t, y_k) - grad2_xy g_i(x^t, y_k) v_k]
    client i -> server:  y_{tau_i}, v_{tau_i} (and h_{x,i} in the last round)
    y^{n+1} = mean_i y_{tau_i},  v^{n+1} = mean_i v_{tau_i}
    after round N-1:  x^{t+1} = x^t - alpha mean_i h_{x,i};   y^0 of the next iteration = y^N (warm start)

Why v is the ITD product: differentiating K steps of y_{k+1} = y_k - beta grad_y g(x, y_k) gives the
hypergradient grad_x f - beta sum_k J_k^T prod_{m>k} (I - beta H_m) grad_y f; with H and J constant along
the trajectory this is grad_x f - J^T v_K, with v_K the K-th iterate of the recursion above from v_0 = 0
(v_K = beta sum_{j<K} (I - beta H)^j grad_y f). Accumulating it FORWARD, alongside y, is what lets it share
the lower level's sub-loop; exact reverse-mode ITD would evaluate grad_y f at the last iterate and pair later
Hessians with it, which needs a backward sweep of N more rounds. This pairing is the reconstruction's main
assumption.

Round accounting: N communication rounds per outer iteration (``rounds_per_iteration``), each one engine
round; every round downloads x, y, v (d_x + 2 d_y floats) and uploads y, v (2 d_y), the last also h_x (d_x).
The rounds are the phases of :data:`PHASES` (``inner``, then ``last``, which closes the sub-loop); clients are
sampled afresh each round. tau_i: ``tau`` for everyone, or a per-client draw (``tau_max``/``tau_clients``: the
draw SimFBO makes for the seed; Fig. 4), persistent or per round.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.plans import Work
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import register
from fedsolve.engine.phases import Phase, PhaseTable
from fedsolve.families.bilevel.common import BilevelAlgorithm, sent
from fedsolve.families.bilevel.local_steps import LocalStepsConfig, batch_groups, check_tau_clients, directions, tau_at

#: one outer iteration: N - 1 ``inner`` rounds of the sub-loop, then the ``last``, whose uploads carry h_x too
PHASES = PhaseTable(
    Phase(
        "inner",
        sends=("x", "y", "v"),
        uploads=("y", "v"),
        then=("inner", "last"),
        doc="tau_i steps of y-SGD and of the ITD product v at fixed x; the server averages y and v",
    ),
    Phase(
        "last",
        sends=("x", "y", "v"),
        uploads=("y", "v", "hx"),
        then=("inner", "last"),
        doc="the same, plus each client's mean x-direction; the server steps x and restarts v at 0",
    ),
    start="inner",
)


class AggITDConfig(LocalStepsConfig):
    """Defaults: the paper's only printed MNIST step sizes (SimFBO A.2, heterogeneous MNIST: inner 0.005,
    outer 0.04); N, tau and the batch are this reconstruction's choices (not given in the SimFBO paper)."""

    inner_lr: float = Field(0.005, gt=0, description="beta: step of the local y-SGD and of the ITD product v")
    outer_lr: float = Field(0.04, gt=0, description="alpha: server step of x")
    inner_rounds: int = Field(2, ge=1, description="N: communication rounds of the sub-loop per outer iteration")
    tau: int = Field(5, ge=1, description="local steps per round (when tau_max and tau_clients are unset)")


@register
class AggITD(BilevelAlgorithm):
    """FBO-AggITD, a reconstruction (see the module docstring): y-SGD and the forward ITD product v in one
    sub-loop of ``inner_rounds`` communication rounds, then a server step of x."""

    name = "aggitd"
    description = (
        "FBO-AggITD (reconstruction): lower-level SGD and ITD hypergradient in one sub-loop of N "
        "rounds, then an x step (Xiao & Ji 2023)"
    )
    Config = AggITDConfig
    cfg: AggITDConfig
    phases = PHASES

    def setup(self):
        spec, c = self.use_oracles(self.cfg.oracles).spec, self.cfg
        T = c.steps()
        groups = batch_groups(spec.lower_group, spec.upper_group, self.independent)
        self._work = {ph: Work(epochs=None, steps=T, batch_size=c.batch_size, group=g) for ph, g in groups.items()}
        check_tau_clients(c.tau_clients, self.num_clients)

    @property
    def rounds_per_iteration(self) -> int:
        """Communication rounds of one outer iteration: the sub-loop's N."""
        return self.cfg.inner_rounds

    def work(self, round_=0):
        return {} if round_ is None else self._work

    def init(self, x0, rngs):
        x, y = self.oracles.split(x0)
        tau = self.cfg.draw(rngs, self.num_clients).to(device=x0.device, dtype=x0.dtype)
        server = {
            "x": x.clone(),
            "y": y.clone(),
            "v": torch.zeros_like(y),
            "sub": torch.tensor(0),
            "iteration": torch.tensor(0),
            **PHASES.init(),
        }
        if self.cfg.inner_rounds == 1:
            server = PHASES.enter(server, "last")
        return server, ClientStates(self.num_clients, {"tau": tau})

    def broadcast(self, server, ids, round_):
        if round_ is None:
            return sent(server, ids, ("x", "y"))
        return PHASES.message(PHASES.current(server), ids, **sent(server, ids, ("x", "y", "v")))

    def local_update(self, state, msg, ctx):
        """tau_i simultaneous steps of (y, v) at fixed x; in the last round also the mean local hypergradient."""
        c = self.cfg
        last = PHASES.of(msg) == "last"
        x, y, v = msg["x"], msg["y"], msg["v"]
        tau = tau_at(state["tau"], ctx.round, c.per_round)
        first = next(iter(self._work))
        hx = torch.zeros_like(x) if last else None
        steps = torch.zeros((), dtype=x.dtype)
        O = self.oracles.on(ctx.client)
        for k in range(ctx.max_steps(first)):
            on = ((tau > k) & ctx.is_active(first, k)).to(x.dtype)
            dy, dv, dx, fval = directions(O, ctx, k, x, y, v, self.independent, with_x=last)
            ctx.record_loss(fval, on > 0)
            if last:
                hx, steps = hx + on * dx, steps + on
            y, v = y - on * c.inner_lr * dy, v - on * c.inner_lr * dv
        up = {"y": y, "v": v}
        if last:
            assert hx is not None, "hx starts at zero in the last round"
            up["hx"] = hx / steps
        return {}, up

    def aggregate(self, server, ids, uploads, round_):
        y, v = uploads["y"].mean(0), uploads["v"].mean(0)
        out = {**server, "y": y, "v": v, "sub": server["sub"] + 1}
        if PHASES.current(server) == "last":  # the sub-loop is over: x steps, the ITD product restarts from 0
            out.update(
                x=server["x"] - self.cfg.outer_lr * uploads["hx"].mean(0),
                v=torch.zeros_like(v),
                sub=torch.tensor(0),
                iteration=server["iteration"] + 1,
            )
        return PHASES.enter(out, "last" if int(out["sub"]) == self.cfg.inner_rounds - 1 else "inner")
