"""Unconstrained FedAvg / FedProx on a constrained problem's objective sum_i f_i (constraints ignored),
with the same certificate as Prox-AL FL, so a report shows what ignoring the constraints costs."""

from __future__ import annotations

from fedsolve.engine.algorithm import register
from fedsolve.families.constrained.kkt import certificate, final_record
from fedsolve.families.classic.fedavg import FedAvg
from fedsolve.families.classic.fedprox import FedProx
from fedsolve.families.constrained.problem import get_spec


class _ObjectiveOnly:
    """Mixin: local SGD on the problem's ``f_i`` (not the model loss); certificates with ``mu = 0``."""

    def setup(self) -> None:
        super().setup()
        self.spec = get_spec(self.problem, self.name)

    def _objective(self, p, x, y, w):
        return self.spec.objective(p, x.double(), y.double(), (w > 0).double())

    def supports_linear_gd(self) -> bool:  # the linear executor would train the model loss instead of f_i
        return False

    def local_update(self, state, msg, ctx):
        w = ctx.sgd(msg["w"], self.cfg.lr, extra=self.prox_term(msg), loss=self._objective)
        return {}, {"w": w}

    def diagnostics(self, server, clients):
        return certificate(self.spec, self.problem.data, server["w"])

    def finalize(self, server, clients):
        return {"constrained": {**self.diagnostics(server, clients), "status": "unconstrained baseline",
                                **final_record(self.spec, self.problem.data, server["w"])}}


@register
class UnconstrainedFedAvg(_ObjectiveOnly, FedAvg):
    name = "fedavg_uncons"
    description = "FedAvg on a constrained problem's objective, constraints ignored (baseline for proxal)"


@register
class UnconstrainedFedProx(_ObjectiveOnly, FedProx):
    name = "fedprox_uncons"
    description = "FedProx on a constrained problem's objective, constraints ignored (baseline for proxal)"
