"""The newcomers' server (FPFC Sec. 6.4.2, spec 3.2): asyncFPFC with only the newcomers active.

m_old devices finished training and are frozen (their models ``frozen``, of which only the fused blocks matter);
each newcomer i runs eq. (5) against them. The server keeps, per (newcomer, old device) pair, the same
``(delta, s)`` as FPFC and updates it with the one pair update
(:func:`~fedsolve.families.clustered.fpfc.pairs.pair_step`); newcomers never pair with each other. The message is

    zeta_i = (sum_{j old} w_j + w_i + sum_{j old} (theta_ij - v_ij/rho)) / denom,   denom = m_old + 1 (or m_old).

Round 0 is the newcomers' warm-up: each trains alone (``init_epochs`` of plain local steps, no proximal term) from
the mean of the old models (the paper is silent on the start; documented choice) and uploads its model; the
server stores it and runs the first pair update (v = 0). Every later round is broadcast zeta -> eq. (5) ->
aggregate (store w_i, pair update), so after the last round theta reflects the last w_i. A run of R newcomer
rounds is a plain run of R + 1 rounds with every newcomer active.

Server state: ``W`` ``[n, d]`` (the newcomers' last models), ``W_old`` ``[m_old, d_f]``, ``delta``
``[n, m_old, d_f]``, ``scale`` ``[n, m_old]`` and ``denom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fedsolve.core.plans import Work
from fedsolve.core.statements import Descend
from fedsolve.core.states import ClientStates, repeat_rows
from fedsolve.families.clustered.fpfc.algorithm import FPFC, FPFCConfig
from fedsolve.families.clustered.fpfc.pairs import pair_step


class FPFCNewcomers(FPFC):
    """The newcomers of a trained FPFC run against its frozen devices (see the module docstring): ``frozen``
    ``[m_old, d]``, the old devices' models; ``denom``, zeta's denominator; ``init_epochs``, the warm-up's epochs."""

    name = "fpfc_newcomers"
    description = "FPFC newcomers: asyncFPFC with only the newcomers active against frozen devices"
    finite_check_keys = ("W",)

    def __init__(
        self,
        config: FPFCConfig | Mapping[str, Any] | None,
        problem,
        frozen: Tensor,
        denom: int,
        init_epochs: float = 10.0,
    ):
        self.frozen, self.denom, self.init_epochs = frozen, int(denom), float(init_epochs)
        super().__init__(config, problem)

    def init(self, x0, rngs):
        n, m_old = self.num_clients, self.frozen.shape[0]
        W = repeat_rows(self.frozen.mean(0), n)
        server = {
            "W": W.clone(),
            "W_old": self.frozen[:, self.fidx].to(self.sdtype),
            "delta": torch.zeros(n, m_old, self.df, dtype=self.sdtype),
            "scale": torch.zeros(n, m_old, dtype=self.sdtype),
            "denom": torch.tensor(float(self.denom)),
        }
        return server, ClientStates(n, {"w": W})

    def work(self, round_: int | None = 0) -> dict[str, Work]:
        if round_ == 0:  # the warm-up
            return {"train": Work(epochs=self.init_epochs, batch_size=self.cfg.batch_size)}
        return super().work(round_)

    def theta_norms(self, server) -> Tensor:
        """``[n, m_old]``: ||theta_ij|| between newcomer i and old device j."""
        return server["scale"].abs() * server["delta"].norm(dim=-1)

    def broadcast(self, server, ids, round_):
        if round_ is None:  # scored with their own models
            return {"w": server["W"][ids]}
        Wf = self.fused(server["W"][ids], self.sdtype)
        rowsum = ((2 * server["scale"][ids] - 1).unsqueeze(-1) * server["delta"][ids]).sum(1)
        zeta = (server["W_old"].sum(0).unsqueeze(0) + Wf + rowsum) / server["denom"].to(self.sdtype)
        msg = {"zeta": zeta.to(server["W"].dtype)}
        if not self.all_fused:
            msg["shared"] = server["W"][ids][:, self.sidx]
        return msg

    def local_update(self, state, msg, ctx):
        if ctx.round == 0:  # the warm-up: plain local steps from the device's start (the mean of the old models)
            c = self.cfg
            return Descend(
                start=state["w"], lr=c.lr, weight_decay=c.weight_decay, then=lambda w, steps: ({"w": w}, {"w": w})
            )
        return super().local_update(state, msg, ctx)

    def aggregate(self, server, ids, uploads, round_):
        server = dict(server, W=server["W"].index_copy(0, ids, uploads["w"].to(server["W"].dtype)))
        Wf = self.fused(server["W"][ids], self.sdtype)
        d, s = pair_step(
            Wf.unsqueeze(1), server["W_old"].unsqueeze(0), server["delta"][ids], server["scale"][ids], self.prox_fn
        )
        server["delta"] = server["delta"].index_copy(0, ids, d)
        server["scale"] = server["scale"].index_copy(0, ids, s)
        return server

    def report(self, server, clients, final: bool = False):
        return {}
