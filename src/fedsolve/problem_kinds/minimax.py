"""Problem kind ``domain_adaptation``: adversarial domain adaptation (FedMM, spec fedmm.md sec. 1).

A config's ``data`` section names a domain dataset (``fedsolve.data.domains``: labelled source rows, unlabelled
target rows, row groups ``("source", "target")``); this kind replaces the config's ``model`` section by a
:class:`~fedsolve.minimax.DomainAdversarialNet` and sets the saddle objective::

    problem: {kind: domain_adaptation, params: {loss: dann, nu: 1.0, features: cnn}}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedsolve.minimax import adversarial_problem
from fedsolve.problems import register_problem_kind


class DomainAdaptationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loss: Literal["dann", "cdan", "mdd"] = Field("dann", description="adversarial loss (spec 1.1)")
    nu: float | None = Field(None, gt=0, description="trade-off nu (default: DANN 1.0, CDAN 1.0, MDD 0.5)")
    features: Literal["cnn", "mlp"] = Field("cnn", description="feature extractor")
    feature_dim: int = Field(64, ge=1, description="width of the 'mlp' feature extractor")
    hidden: list[int] = Field(default_factory=lambda: [100, 100], description="classifier hidden sizes")
    domain_hidden: int = Field(100, ge=1, description="DANN/CDAN discriminator hidden size")


@register_problem_kind("domain_adaptation")
def domain_adaptation(problem, params, seed):
    try:
        p = DomainAdaptationParams(**dict(params))
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(f"domain_adaptation: {errs}") from None
    return adversarial_problem(problem.data, p.loss, p.nu, p.features, p.feature_dim, p.hidden, p.domain_hidden,
                               name=problem.name)
