"""Problem kind ``domain_adaptation``: adversarial domain adaptation (FedMM, spec fedmm.md sec. 1).

A config's ``data`` section names a domain dataset (``fedsolve.data.domains``: labelled source rows, unlabelled
target rows, row groups ``("source", "target")``); this kind replaces the config's ``model`` section by a
:class:`~fedsolve.families.minimax.problem.DomainAdversarialNet` and sets the saddle objective::

    problem: {kind: domain_adaptation, params: {loss: dann, nu: 1.0, features: cnn}}

``regime: pretrained`` (spec 2.5, 6.3) first trains the label predictor on the pooled labelled source rows
(centralized, before round 0, not a communication round; ``pretrain``: steps, lr, batch_size), then the solvers
step the feature extractor 20x slower (``feature_scale`` 0.05: 0.01 -> 0.0005, unless an algorithm sets
``feature_lr``); nu defaults to the paper's pretrained values (0.25 DANN/CDAN, 0.1 MDD).

``psi_gradient: authors_code`` divides psi's gradient of f_i by nu + 0.01 (pretrained) or nu (from scratch), as
the authors' code does; the default ``paper`` leaves it as in the paper's eq. 12 (spec 2.5).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsolve.families.minimax.problem import Pretrain, adversarial_problem
from fedsolve.problems import parse_params, register_problem_kind


class PretrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(1000, ge=1, description="SGD steps on the pooled source cross-entropy")
    lr: float = Field(0.1, gt=0, description="their step size")
    batch_size: int = Field(64, ge=1, description="their minibatch")


class DomainAdaptationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loss: Literal["dann", "cdan", "mdd"] = Field("dann", description="adversarial loss (spec 1.1)")
    nu: float | None = Field(None, gt=0, description="trade-off nu (default: DANN 1.0, CDAN 1.0, MDD 0.5)")
    features: Literal["cnn", "mlp"] = Field("cnn", description="feature extractor")
    feature_dim: int = Field(64, ge=1, description="width of the 'mlp' feature extractor")
    hidden: list[int] = Field(default_factory=lambda: [100, 100], description="classifier hidden sizes")
    domain_hidden: int = Field(100, ge=1, description="DANN/CDAN discriminator hidden size")
    regime: Literal["scratch", "pretrained"] = Field(
        "scratch", description="from scratch, or pretrained on the source first with a 20x smaller feature step"
    )
    pretrain: PretrainParams = Field(
        default_factory=PretrainParams, description="the pretrained regime's source-only stage (ignored from scratch)"
    )
    feature_scale: float | None = Field(
        None, gt=0, description="factor on the features' step size (default: 0.05 pretrained, 1 from scratch)"
    )
    psi_gradient: Literal["paper", "authors_code"] = Field(
        "paper",
        description="psi's gradient of f_i in its step: 'paper' as in eq. 12 (ascent on f_i, step eta_2); "
        "'authors_code' divided by nu + 0.01 (pretrained) or by nu (from scratch) as in the "
        "authors' code; the penalty and dual terms are not scaled",
    )
    init: Literal["torch", "authors_code"] = Field(
        "torch",
        description="initialization of every layer: 'torch' (PyTorch's default, the reported runs) or "
        "'authors_code' (weights from a normal of std 0.1 truncated at 2 std, biases 0.1, as "
        "the authors' code; the paper is silent)",
    )


@register_problem_kind("domain_adaptation")
def domain_adaptation(problem, params, seed):
    p = parse_params(DomainAdaptationParams, params)
    pretrain = Pretrain(**p.pretrain.model_dump()) if p.regime == "pretrained" else None
    return adversarial_problem(
        problem.data,
        p.loss,
        p.nu,
        p.features,
        p.feature_dim,
        p.hidden,
        p.domain_hidden,
        name=problem.name,
        pretrain=pretrain,
        feature_scale=p.feature_scale,
        psi_gradient=p.psi_gradient,
        init=p.init,
    )
