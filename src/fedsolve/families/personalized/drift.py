"""Client drift of a global-model solver on the shared block: the model deviation of FedAPM's Fig. 5.

Zhu et al. (FedAPM, KDD'25) Fig. 5 compares how far each client's model moves from the broadcast one during its
local round, ``||u_i^{t+1} - u^t||``, for the personalized methods and for FedAvg and FedProx, measured for the
latter on "the same shared model components as in the personalized methods" (the figure's footnote). The
partial-personalization solvers report it as ``local_drift`` (``partial.py``); this wrapper gives any solver that
averages one global model (FedAvg, FedProx, ...) the same number:

    local_drift = (1/m) sum_i ||(w_i^{t_i+1} - w^{t_i})[shared]||

with ``t_i`` client i's latest round (0 before it first takes part, as for the personalized solvers) and
``shared`` the parameters outside the problem's ``personal`` block (the whole model when it defines none).
Nothing else changes: the wrapped solver's numbers are its own. In a config::

    algorithms:
      - {name: fedavg, params: {lr: 0.05}, wrap: [{kind: drift}]}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from fedsolve.engine.wrappers import Wrapper, register_wrapper
from fedsolve.families.personalized.blocks import personal_mask

_KEY = "drift.last"


class SharedDrift(Wrapper):
    """``inner`` with ``local_drift`` reported at every evaluation (module docstring)."""

    def __init__(self, inner):
        super().__init__(inner)
        if inner.averages is None:
            raise ValueError(
                f"wrap.drift: needs a solver that averages one global model (FedAvg, FedProx, ...); "
                f"{inner.name} declares none"
            )
        self.avg = inner.averages
        self.shared = ~personal_mask(inner.problem, "problem")

    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        server[_KEY] = x0.new_zeros(self.num_clients)
        return server, clients

    def aggregate(self, server, ids, uploads, round_):
        w = server[self.avg.key]
        up = uploads[self.avg.upload]
        delta = up - w if self.avg.kind == "model" else up
        moved = delta[:, self.shared.to(delta.device)].norm(dim=1)
        new = dict(self.inner.aggregate({k: v for k, v in server.items() if k != _KEY}, ids, uploads, round_))
        last = server[_KEY].clone()
        last[ids.to(last.device)] = moved.to(last.dtype)
        new[_KEY] = last
        return new

    def report(self, server, clients, final: bool = False):
        out = dict(self.inner.report({k: v for k, v in server.items() if k != _KEY}, clients, final))
        if not final:
            out["local_drift"] = float(server[_KEY].mean())
        return out


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@register_wrapper(
    "drift",
    "logs local_drift: mean over clients of ||w_i - w^t|| on the shared block at each "
    "client's latest round (FedAPM Fig. 5's model deviation, for FedAvg/FedProx)",
)
def _drift(inner, params):
    try:
        _NoParams(**params)
    except ValidationError as e:
        raise ValueError(f"wrap.drift.{e.errors()[0]['loc'][0]}: not a parameter; allowed: none") from None
    return SharedDrift(inner)


__all__ = ["SharedDrift"]
