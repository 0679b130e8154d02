"""asyncFPFC's server (Algorithm 3 of Yu et al., arXiv:2211.04218v3; spec fpfc.md 2.9).

The same device update (eq. 5) and pair update (eq. 6) as FPFC; what changes is *when* a device hears from
the server: device i trains on the zeta_i it was sent when its previous update arrived, and right after
its next update the server updates only the pairs (i, j), j != i, and sends zeta_i back. The server keeps the
last zeta it sent every device in ``Z`` ``[m, d_f]``. A round of this algorithm is the arrival of the
uploads of ``ids``: one device under the schedule ``async_fpfc`` (``fedsolve.families.clustered.protocols.async_fpfc``),
the sampled devices otherwise.
"""

from __future__ import annotations

import torch

from fedsolve.engine.algorithm import register
from fedsolve.families.clustered.fpfc.algorithm import FPFC


@register
class AsyncFPFC(FPFC):
    """FPFC with stale proximal centres: server state ``Z`` holds the zeta_i last sent to each device."""

    name = "async_fpfc"
    description = "asyncFPFC (Algorithm 3): FPFC where each device trains on the zeta_i sent after its last update"

    def init(self, x0, rngs):
        server, clients = super().init(x0, rngs)
        server["Z"] = self.zeta(server, torch.arange(self.num_clients))  # sent to every device at the start
        return server, clients

    def broadcast(self, server, ids, round_):
        if round_ is None:
            return self.scored(server, ids)
        msg = {"zeta": server["Z"][ids]}
        if not self.all_fused:
            msg["shared"] = server["W"][ids][:, self.sidx]
        return msg

    def aggregate(self, server, ids, uploads, round_):
        server = super().aggregate(server, ids, uploads, round_)
        server["Z"] = server["Z"].index_copy(0, ids, self.zeta(server, ids))  # sent back at once
        return server
