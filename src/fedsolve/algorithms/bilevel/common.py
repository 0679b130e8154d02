"""What every bilevel solver shares around its protocol: the server holds the upper variable ``x`` and the lower
variable ``y`` (and, where the solver keeps one, the linear-system variable ``v``); a client is evaluated on the
model that joins ``x`` and ``y``."""

from __future__ import annotations

from fedsolve.algorithms.base import Algorithm


class BilevelAlgorithm(Algorithm):
    """Base of SimFBO, ShroFBO, FBO-AggITD and the FedNest family (``self.oracles`` is set in ``setup``)."""

    def eval_broadcast(self, server, ids):
        return {k: self.expand(server[k], ids) for k in ("x", "y")}

    def eval_model(self, state, msg):
        return self.oracles.join(msg["x"], msg["y"])

    def diagnostics(self, server, clients):
        return {"v_norm": float(server["v"].norm())} if "v" in server else {}
