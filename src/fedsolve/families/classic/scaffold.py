"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

y_i <- y_i - eta (g_i(y_i) - c_i + c)                      (K local steps from x)
c_i^+ = c_i - c + (x - y_i) / (K eta)                       (option II)
x <- x + eta_g * mean_{S}(y_i - x);   c <- c + |S|/N * mean_{S}(c_i^+ - c_i)
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates
from fedsolve.engine.algorithm import Algorithm, AlgorithmConfig, Averages, expand, register


class ScaffoldConfig(AlgorithmConfig):
    global_lr: float = Field(1.0, gt=0, description="server step size eta_g")


@register
class Scaffold(Algorithm):
    name = "scaffold"
    description = "SCAFFOLD: local SGD corrected by control variates (Karimireddy et al. 2020)"
    Config = ScaffoldConfig
    cfg: ScaffoldConfig
    averages = Averages("x", "dy", "delta", "uniform")

    def init(self, x0, rngs):
        m, d = self.num_clients, x0.numel()
        return (
            {"x": x0.clone(), "c": torch.zeros(d, dtype=x0.dtype)},
            ClientStates(m, {"c_i": torch.zeros(m, d, dtype=x0.dtype)}),
        )

    def broadcast(self, server, ids, round_):
        return {"x": expand(server["x"], ids), "c": expand(server["c"], ids)}

    def local_update(self, state, msg, ctx):
        x, c, c_i, lr = msg["x"], msg["c"], state["c_i"], self.cfg.lr

        def then(y, k_steps):  # option II: c_i^+ = c_i - c + (x - y) / (K eta)
            c_new = c_i - c + (x - y) / (k_steps.unsqueeze(-1) * lr)
            return {"c_i": c_new}, {"dy": y - x, "dc": c_new - c_i}

        return Descend(start=x, lr=lr, weight_decay=self.cfg.weight_decay, linear=c - c_i, then=then)

    def aggregate(self, server, ids, uploads, round_):
        s = ids.numel()
        x = server["x"] + self.cfg.global_lr * uploads["dy"].mean(0)
        c = server["c"] + (s / self.num_clients) * uploads["dc"].mean(0)
        return {"x": x, "c": c}

    def eval_model(self, state, msg):
        return msg["x"]
