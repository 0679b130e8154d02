"""The newcomers' server (FPFC Sec. 6.4.2, spec 3.2): asyncFPFC with only the newcomers active.

m_old devices finished training and are frozen (their fused blocks ``W_old``); each newcomer i runs eq. (5)
against them. The server keeps, per (newcomer, old device) pair, the same ``(delta, s)`` as FPFC and updates
it with the one pair update (:func:`~fedsolve.families.clustered.fpfc.pairs.pair_step`); newcomers never pair with
each other. The message is

    zeta_i = (sum_{j old} w_j + w_i + sum_{j old} (theta_ij - v_ij/rho)) / denom,   denom = m_old + 1 (or m_old).

Server state: ``W`` ``[n, d]`` (the newcomers' last models), ``W_old`` ``[m_old, d_f]``, ``delta``
``[n, m_old, d_f]``, ``scale`` ``[n, m_old]`` and ``denom``. :meth:`start` builds it from the newcomers'
first models (after their local warm-up) and runs the first pair update; every round is then
broadcast zeta -> eq. (5) -> aggregate (store w_i, pair update), so after the last round theta reflects
the last w_i.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsolve.families.clustered.fpfc.algorithm import FPFC
from fedsolve.families.clustered.fpfc.pairs import pair_step


class FPFCNewcomers(FPFC):
    """The newcomers of a trained FPFC run against its frozen devices (see the module docstring)."""

    name = "fpfc_newcomers"
    description = "FPFC newcomers: asyncFPFC with only the newcomers active against frozen devices"
    finite_check_keys = ("W",)

    def start(self, W: Tensor, W_old: Tensor, denom: int) -> dict[str, Tensor]:
        """The server record for newcomer models ``W`` ``[n, d]`` and frozen models ``W_old`` ``[m_old, d]``."""
        n, m_old = W.shape[0], W_old.shape[0]
        server = {"W": W.clone(), "W_old": W_old[:, self.fidx].to(self.sdtype),
                  "delta": torch.zeros(n, m_old, self.df, dtype=self.sdtype),
                  "scale": torch.zeros(n, m_old, dtype=self.sdtype), "denom": torch.tensor(float(denom))}
        return self._pair_update(server, torch.arange(n))

    def _pair_update(self, server: dict[str, Tensor], ids: Tensor) -> dict[str, Tensor]:
        server = dict(server)
        Wf = self.fused(server["W"][ids], self.sdtype)
        d, s = pair_step(Wf.unsqueeze(1), server["W_old"].unsqueeze(0), server["delta"][ids], server["scale"][ids],
                         self.prox_fn)
        server["delta"] = server["delta"].index_copy(0, ids, d)
        server["scale"] = server["scale"].index_copy(0, ids, s)
        return server

    def theta_norms(self, server) -> Tensor:
        """``[n, m_old]``: ||theta_ij|| between newcomer i and old device j."""
        return server["scale"].abs() * server["delta"].norm(dim=-1)

    def broadcast(self, server, ids, round_):
        Wf = self.fused(server["W"][ids], self.sdtype)
        rowsum = ((2 * server["scale"][ids] - 1).unsqueeze(-1) * server["delta"][ids]).sum(1)
        zeta = (server["W_old"].sum(0).unsqueeze(0) + Wf + rowsum) / server["denom"].to(self.sdtype)
        msg = {"zeta": zeta.to(server["W"].dtype)}
        if not self.all_fused:
            msg["shared"] = server["W"][ids][:, self.sidx]
        return msg

    def aggregate(self, server, ids, uploads, round_):
        server = dict(server, W=server["W"].index_copy(0, ids, uploads["w"].to(server["W"].dtype)))
        return self._pair_update(server, ids)

    def eval_broadcast(self, server, ids):
        return {"w": server["W"][ids]}

    def diagnostics(self, server, clients):
        return {}

    def finalize(self, server, clients):
        return {}
