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
Clients are sampled afresh each round (as for FedNest in this engine). tau_i: ``tau`` for everyone, or a
persistent per-client draw (``tau_max``/``tau_clients``: the draw SimFBO makes for the seed; Fig. 4).
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.engine.algorithm import register
from fedsolve.families.bilevel.common import BilevelAlgorithm
from fedsolve.families.bilevel.local_steps import LocalStepsConfig, batch_groups, directions, draw_tau
from fedsolve.families.bilevel.problem import make_oracles
from fedsolve.core.executor import Work
from fedsolve.core.states import ClientStates


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
    description = ("FBO-AggITD (reconstruction): lower-level SGD and ITD hypergradient in one sub-loop of N "
                   "rounds, then an x step (Xiao & Ji 2023)")
    Config = AggITDConfig

    def setup(self):
        self.oracles = make_oracles(self.problem, self.cfg.oracles)
        spec, c = self.oracles.spec, self.cfg
        T = c.steps()
        groups = batch_groups(spec.lower_group, spec.upper_group, c.independent_batches)
        self._work = {ph: Work(epochs=None, steps=T, batch_size=c.batch_size, group=g) for ph, g in groups.items()}
        if c.tau_clients is not None and len(c.tau_clients) != self.num_clients:
            raise ValueError(f"tau_clients: {len(c.tau_clients)} values for {self.num_clients} clients")

    @property
    def rounds_per_iteration(self) -> int:
        """Communication rounds of one outer iteration: the sub-loop's N."""
        return self.cfg.inner_rounds

    def work(self, round_=0):
        return self._work

    def init(self, x0, rngs):
        x, y = self.oracles.split(x0)
        c = self.cfg
        tau = draw_tau(rngs, self.num_clients, c.tau, c.tau_max, c.tau_clients).to(device=x0.device, dtype=x0.dtype)
        server = {"x": x.clone(), "y": y.clone(), "v": torch.zeros_like(y), "phase": torch.zeros((), dtype=torch.long)}
        return server, ClientStates(self.num_clients, {"tau": tau})

    def last_round(self, server) -> bool:
        return int(server["phase"]) % self.cfg.inner_rounds == self.cfg.inner_rounds - 1

    def broadcast(self, server, ids, round_):
        # the key of y tells the client whether this round closes the sub-loop (then it also returns h_x)
        key = "y_last" if self.last_round(server) else "y"
        return {"x": self.expand(server["x"], ids), key: self.expand(server["y"], ids),
                "v": self.expand(server["v"], ids)}

    def local_update(self, state, msg, ctx):
        """tau_i simultaneous steps of (y, v) at fixed x; in the last round also the mean local hypergradient."""
        c = self.cfg
        last = "y_last" in msg
        x, y, v = msg["x"], msg["y_last" if last else "y"], msg["v"]
        tau = state["tau"]
        first = next(iter(self._work))
        hx = torch.zeros_like(x) if last else None
        steps = torch.zeros((), dtype=x.dtype)
        for k in range(ctx.max_steps(first)):
            on = ((tau > k) & ctx.is_active(first, k)).to(x.dtype)
            dy, dv, dx, fval = directions(self.oracles, ctx, k, x, y, v, c.independent_batches, with_x=last)
            ctx.record_loss(fval, on > 0)
            if last:
                hx, steps = hx + on * dx, steps + on
            y, v = y - on * c.inner_lr * dy, v - on * c.inner_lr * dv
        up = {"y": y, "v": v}
        if last:
            up["hx"] = hx / steps
        return {}, up

    def aggregate(self, server, ids, uploads, round_):
        y, v = uploads["y"].mean(0), uploads["v"].mean(0)
        out = {**server, "y": y, "v": v, "phase": server["phase"] + 1}
        if "hx" in uploads:     # the sub-loop is over: x steps, the ITD product restarts from 0
            out.update(x=server["x"] - self.cfg.outer_lr * uploads["hx"].mean(0), v=torch.zeros_like(v))
        return out
