"""Unconstrained FedAvg / FedProx on a constrained problem's objective sum_i f_i (constraints ignored),
with the same certificate as Prox-AL FL, so a report shows what ignoring the constraints costs."""

from __future__ import annotations

from fedsolve.core.statements import Descend
from fedsolve.engine.algorithm import Algorithm, register
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.classic.fedprox import FedProx
from fedsolve.families.constrained.kkt import certificate, final_record
from fedsolve.families.constrained.problem import Part, get_spec


class _ObjectiveOnly(Algorithm):
    """Mixin: local SGD on the problem's ``f_i`` (not the model loss); certificates with ``mu = 0``."""

    def setup(self) -> None:
        super().setup()
        self.spec = get_spec(self.problem, self.name)
        if self.spec.per_party:
            raise ValueError(
                f"{self.name}: a problem of per-party functions is not supported by this baseline "
                f"(it reads the clients' rows only); use proxal or cproxal"
            )

    def _objective(self, p, x, y, w):
        return self.spec.f(p, Part(x.double(), y.double(), (w > 0).double(), w.new_zeros((), dtype=int), {}))

    def local_update(self, state, msg, ctx):
        c = self.cfg
        return Descend(
            start=msg["w"],
            lr=c.lr,
            weight_decay=c.weight_decay,
            prox=getattr(c, "mu", 0.0),
            anchor=msg["w"],
            objective=self._objective,
            then=lambda w, steps: ({}, {"w": w}),
        )

    def report(self, server, clients, final: bool = False):
        cert = certificate(self.spec, self.problem.data, server["w"])
        if not final:
            return cert
        return {
            "constrained": {
                **cert,
                "status": "unconstrained baseline",
                **final_record(self.spec, self.problem.data, server["w"]),
            }
        }


@register
class UnconstrainedFedAvg(_ObjectiveOnly, FedAvg):
    name = "fedavg_uncons"
    description = "FedAvg on a constrained problem's objective, constraints ignored (baseline for proxal)"


@register
class UnconstrainedFedProx(_ObjectiveOnly, FedProx):
    name = "fedprox_uncons"
    description = "FedProx on a constrained problem's objective, constraints ignored (baseline for proxal)"
