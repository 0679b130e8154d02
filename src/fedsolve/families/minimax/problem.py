"""Adversarial domain adaptation as a federated saddle problem (FedMM, spec fedmm.md sec. 1.1).

:func:`adversarial_problem` builds it on domain data: omega (the MIN player) = the feature extractor + the label
classifier of :class:`DomainAdversarialNet`, psi (the MAX player) = its domain head, and the saddle objective
``f_i = mean over the batch of [CE on source rows - nu * L_dom]`` with the DANN, CDAN or MDD loss, selected by name
(:func:`adversarial_loss`); from scratch or in the "pretrained" regime (:class:`Pretrain`: the label predictor
first trained on the labelled source alone, then a 20x smaller step on the feature extractor; spec 2.5 and 6.3).
``psi_gradient="authors_code"`` scales psi's gradient of ``f_i`` as the authors' code does
(:func:`psi_gradient_scale`); the default ``"paper"`` leaves it as in eq. 12.

Domain data convention (``fedsolve.data.domains``): labelled source rows carry their class ``y >= 0``,
unlabelled target rows carry ``y = -1``; the data's row groups are ``("source", "target")``. Every client's train
and test data are checked finite when the problem is built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedsolve.core.context import TensorLoss
from fedsolve.data.federated import FederatedData
from fedsolve.families.minimax.dann_grad import dann_value_and_grad
from fedsolve.families.minimax.saddle import OMEGA, PSI, check_finite_data, with_saddle_objective
from fedsolve.problems import FederatedProblem

__all__ = [
    "Pretrain",
    "DomainAdaptationProblem",
    "pretrain_on_source",
    "adversarial_problem",
    "adversarial_loss",
    "DomainAdversarialNet",
    "ADVERSARIAL_LOSSES",
    "DEFAULT_NU",
    "PRETRAINED_NU",
    "DOMAIN_GROUPS",
    "PSI_GRADIENTS",
    "psi_gradient_scale",
]

#: row-group names of domain data (``FederatedData.group_names``)
DOMAIN_GROUPS = ("source", "target")
#: how the domain-data check names the fields
DOMAIN_ROLES = {"train_x": "source and target training images", "test_x": "target test images"}

ADVERSARIAL_LOSSES = ("dann", "cdan", "mdd")
#: nu of the from-scratch MNIST runs in the authors' code (the paper is silent; spec 2.5)
DEFAULT_NU = {"dann": 1.0, "cdan": 1.0, "mdd": 0.5}
#: nu of the pretrained (Office-31) runs: the paper and the authors' code (spec 2.5)
PRETRAINED_NU = {"dann": 0.25, "cdan": 0.25, "mdd": 0.1}
#: how psi's gradient of f_i enters its step: as in the paper (eq. 12), or scaled as in the authors' code
PSI_GRADIENTS = ("paper", "authors_code")


def psi_gradient_scale(psi_gradient: str, nu: float, pretrained: bool) -> float:
    """The factor on psi's gradient of ``f_i = L_cls - nu L_dom`` (spec 2.5, "discriminator gradient scaling").

    ``"paper"``: 1, psi ascends ``f_i`` with step eta_2 (eq. 12), i.e. descends ``nu L_dom``.
    ``"authors_code"``: the authors' TF code divides the domain head's gradient by ``nu + 0.01`` in its
    pretrained ("finetune") mode and by ``nu`` from scratch ("stratch_train"), so psi descends ``L_dom`` times
    ``nu / (nu + 0.01)`` (pretrained) or the unscaled ``L_dom`` (from scratch); the penalty and dual terms of its
    FedMM optimizer are added after that scaling, unscaled."""
    if psi_gradient not in PSI_GRADIENTS:
        raise ValueError(f"psi_gradient: unknown {psi_gradient!r}; allowed: {list(PSI_GRADIENTS)}")
    if psi_gradient == "paper":
        return 1.0
    return 1.0 / (nu + 0.01) if pretrained else 1.0 / nu


# ------------------------------------------------------------------ adversarial domain adaptation
class Chain(nn.ModuleList):
    """Layers applied in order (children named ``0``, ``1``, ...)."""

    def forward(self, h: Tensor) -> Tensor:
        for layer in self:
            h = layer(h)
        return h


def _mlp(d_in: int, hidden: Sequence[int], d_out: int) -> Chain:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(d_in, h), nn.ReLU()]
        d_in = h
    layers.append(nn.Linear(d_in, d_out))
    return Chain(layers)


class DomainAdversarialNet(nn.Module):
    """Feature extractor ``zeta^1`` -> label classifier ``zeta^2`` (omega) and a domain head (psi).

    ``features="cnn"``: conv3x3 C->32, ReLU, maxpool2, conv3x3 32->48, ReLU, maxpool2 (the authors' "toybase"
    shape with 3x3 kernels for small images, spec 6.3); ``"mlp"``: one ReLU layer of ``feature_dim``.
    Domain head (spec 1.1): DANN ``D -> domain_hidden -> 2`` on the features; CDAN the same on the flattened
    outer product softmax(logits) x features (no stop-gradient); MDD a K-way auxiliary classifier with the
    classifier's shape. No batch-norm and no dropout (no buffers: every client runs it alike; spec 6.3).

    ``forward(x)`` gives the class logits (evaluation); ``forward(x, adversarial=True)`` gives
    ``(logits, domain_logits)``.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        loss: str = "dann",
        features: str = "cnn",
        feature_dim: int = 64,
        hidden: Sequence[int] = (100, 100),
        domain_hidden: int = 100,
        init: str = "torch",
    ):
        super().__init__()
        if loss not in ADVERSARIAL_LOSSES:
            raise ValueError(f"loss: unknown {loss!r}; allowed: {list(ADVERSARIAL_LOSSES)}")
        self.kind = loss
        in_shape = tuple(int(s) for s in in_shape)
        if features == "cnn":
            if len(in_shape) != 3:
                raise ValueError(f"features 'cnn' needs image inputs [C, H, W], got shape {in_shape}")
            c, h, w = in_shape
            self.features = Chain(
                [
                    nn.Conv2d(c, 32, 3, padding=1),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                    nn.Conv2d(32, 48, 3, padding=1),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                    nn.Flatten(),
                ]
            )
            d = 48 * (h // 4) * (w // 4)
        elif features == "mlp":
            self.features = Chain([nn.Flatten(), nn.Linear(math.prod(in_shape), feature_dim), nn.ReLU()])
            d = feature_dim
        else:
            raise ValueError(f"features: unknown {features!r}; allowed: ['cnn', 'mlp']")
        self.classifier = _mlp(d, hidden, num_classes)
        if loss == "dann":
            self.domain = _mlp(d, [domain_hidden], 2)
        elif loss == "cdan":
            self.domain = _mlp(num_classes * d, [domain_hidden], 2)
        else:
            self.domain = _mlp(d, hidden, num_classes)
        if init == "authors_code":
            authors_init(self)
        elif init != "torch":
            raise ValueError(f"init: unknown {init!r}; allowed: ['torch', 'authors_code']")

    def forward(self, x: Tensor, adversarial: bool = False):
        return self._forward(x, adversarial, lambda name, module, h: module(h))

    def forward_with(self, params: dict[str, Tensor], x: Tensor, adversarial: bool = False):
        """``forward`` with the parameter tensors ``params`` (``{name: tensor}``, e.g. ``layout.unflatten(w)``) in
        place of the module's own: the same operations as ``functional_call(self, params, ...)`` without its
        per-call swapping of every parameter in and out of the modules (the local steps' hot path)."""
        return self._forward(x, adversarial, lambda name, module, h: _layer_with(module, params, name, h))

    def _forward(self, x: Tensor, adversarial: bool, layer):
        """The network, each layer ``module`` (named ``name``) applied to ``h`` as ``layer(name, module, h)``."""

        def seq(prefix: str, h: Tensor) -> Tensor:
            for name, module in getattr(self, prefix).named_children():
                h = layer(f"{prefix}.{name}", module, h)
            return h

        z = seq("features", x)
        logits = seq("classifier", z)
        if not adversarial:
            return logits
        if self.kind == "cdan":
            p = torch.softmax(logits, -1)
            z = (p.unsqueeze(-1) * z.unsqueeze(-2)).flatten(-2)
        return logits, seq("domain", z)


def _layer_with(module: nn.Module, params: dict[str, Tensor], name: str, h: Tensor) -> Tensor:
    """One layer of :class:`DomainAdversarialNet` on ``h`` with its weight and bias taken from ``params``."""
    if isinstance(module, nn.Linear):
        return F.linear(h, params[f"{name}.weight"], params[f"{name}.bias"])
    if isinstance(module, nn.Conv2d):  # zero padding (the only mode this network builds)
        return F.conv2d(
            h,
            params[f"{name}.weight"],
            params[f"{name}.bias"],
            module.stride,
            module.padding,
            module.dilation,
            module.groups,
        )
    return module(h)  # ReLU, MaxPool2d, Flatten: no parameters


def authors_init(model: nn.Module) -> None:
    """The authors' code's initialization (spec fedmm.md 2.5): every weight of a linear or convolutional layer
    from a normal of std 0.1 truncated at two standard deviations (TensorFlow's ``truncated_normal``), every
    bias 0.1. The paper is silent; PyTorch's default (``init: torch``) is what the reported runs used."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.1, a=-0.2, b=0.2)
            assert m.bias is not None, "every linear and convolutional layer of this network has a bias"
            nn.init.constant_(m.bias, 0.1)


def adversarial_loss(model: DomainAdversarialNet, layout, nu: float) -> TensorLoss:
    """``f_i = mean over the batch of [ CE(zeta(x), y) on source rows  -  nu * L_dom ]`` (spec 1.1, eq. 4).

    * DANN/CDAN: ``L_dom`` = 2-way domain cross-entropy, source = 0, target = 1 (so a source row gives
      ``CE + nu log(1 - h)``, a target row ``nu log h``).
    * MDD: ``y_hat`` = argmax of the (detached) main logits; ``L_dom`` = CE(f'(z), y_hat) on source rows and
      ``-log(1.00001 - softmax(f'(z))[y_hat])`` on target rows.

    Target rows (``y < 0``) carry no label term. omega descends ``f_i``, psi ascends it. Written on the parameter
    tensors (:class:`~fedsolve.core.context.TensorLoss`: callable on the flat vector too)."""
    kind = model.kind

    def f(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        logits, d = model.forward_with(params, x, adversarial=True)
        src = y >= 0
        ce = F.cross_entropy(logits, y.clamp_min(0), reduction="none") * src
        logq = torch.log_softmax(d, -1)
        if kind == "mdd":
            yhat = logits.detach().argmax(-1, keepdim=True)
            src_term = -logq.gather(-1, yhat).squeeze(-1)
            tgt_term = -torch.log(1.00001 - logq.exp().gather(-1, yhat).squeeze(-1))
            dom = torch.where(src, src_term, tgt_term)
        else:
            dom = torch.where(src, -logq[..., 0], -logq[..., 1])
        return (w * (ce - nu * dom)).sum()

    return TensorLoss(layout, f, dann_value_and_grad(model, nu))


@dataclass(frozen=True)
class Pretrain:
    """The "pretrained" regime's first stage (spec 6.3, the Office-31 stand-in): ``steps`` plain SGD steps of
    step ``lr`` on the source cross-entropy of the label predictor omega (features + classifier), minibatches of
    ``batch_size`` drawn from the POOLED labelled source rows of all clients. Centralized: it runs once, before
    round 0, and is not a communication round (it is not in the ledger); psi keeps its fresh initialization."""

    steps: int = 1000
    lr: float = 0.1
    batch_size: int = 64

    def __post_init__(self):
        for k in ("steps", "lr", "batch_size"):
            if not getattr(self, k) > 0:
                raise ValueError(f"pretrain.{k} must be > 0, got {getattr(self, k)}")


def pretrain_on_source(problem: FederatedProblem, params: Tensor, spec: Pretrain, generator: torch.Generator) -> Tensor:
    """``params`` after ``spec.steps`` SGD steps on the mean source cross-entropy, omega only (psi unchanged)."""
    data = problem.data
    src = torch.nonzero(data.train_y >= 0).flatten()
    if src.numel() == 0:
        raise ValueError("pretrain: the data has no labelled source rows")
    x, y = data.train_x[src], data.train_y[src]
    om = problem.layout.mask(OMEGA).to(params.dtype)
    model = problem.model
    w = params.detach().clone()

    def ce(p: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        logits = functional_call(model, problem.layout.unflatten(p), (xb,))
        return F.cross_entropy(logits, yb)

    grad = torch.func.grad(ce)
    b = min(spec.batch_size, y.numel())
    for _ in range(spec.steps):
        idx = torch.randint(0, y.numel(), (b,), generator=generator)
        w = w - spec.lr * om * grad(w, x[idx], y[idx])
    return w


@dataclass(eq=False)
class DomainAdaptationProblem(FederatedProblem):
    """A domain-adaptation problem; with ``pretrain`` its initial parameters are the random ones after the
    centralized source-only stage :func:`pretrain_on_source` (every solver starts from the same point)."""

    pretrain: Pretrain | None = None

    def init_params(self, generator: torch.Generator) -> Tensor:
        x0 = super().init_params(generator)
        if self.pretrain is None:
            return x0
        with torch.random.fork_rng(devices=[]):
            g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            return pretrain_on_source(self, x0.to(self.device), self.pretrain, g).cpu()


def adversarial_problem(
    data: FederatedData,
    loss: Literal["dann", "cdan", "mdd"] = "dann",
    nu: float | None = None,
    features: str = "cnn",
    feature_dim: int = 64,
    hidden: Sequence[int] = (100, 100),
    domain_hidden: int = 100,
    name: str = "domain_adaptation",
    pretrain: Pretrain | None = None,
    feature_scale: float | None = None,
    psi_gradient: Literal["paper", "authors_code"] = "paper",
    init: Literal["torch", "authors_code"] = "torch",
) -> FederatedProblem:
    """Adversarial domain adaptation on domain data (labelled source ``y >= 0``, unlabelled target ``y = -1``).

    Blocks: ``omega`` = features + classifier, ``psi`` = domain head, ``features`` = the feature extractor
    (its own learning rate in the pretrained regime). ``pretrain``: the pretrained regime (source-only stage,
    :class:`Pretrain`); then ``nu`` defaults to :data:`PRETRAINED_NU` and ``feature_scale`` (the factor on the
    features' step size, ``saddle.Minimax``) to 0.05, else :data:`DEFAULT_NU` and 1. ``psi_gradient``: the
    factor on psi's gradient of ``f_i``, :func:`psi_gradient_scale` ("paper": 1). ``init``: the network's
    initialization, PyTorch's default or the authors' code's (:func:`authors_init`)."""
    if loss not in ADVERSARIAL_LOSSES:
        raise ValueError(f"loss: unknown {loss!r}; allowed: {list(ADVERSARIAL_LOSSES)}")
    if data.task != "classification" or data.num_classes is None:
        raise ValueError(
            "data: domain adaptation needs classification data (labelled source rows); allowed: a "
            "domain dataset (fedsolve.data.domains)"
        )
    if tuple(data.group_names) != DOMAIN_GROUPS or data.train_groups is None:
        raise ValueError(
            f"data: domain adaptation needs domain data, row groups {DOMAIN_GROUPS} (train_groups), got "
            f"{tuple(data.group_names) or None}; allowed: a dataset of fedsolve.data.domains or one "
            f"built with its domain_split"
        )
    if bool(((data.train_groups == 1) != (data.train_y < 0)).any()):
        raise ValueError("data: target rows (group 'target') must carry y = -1 and source rows y >= 0")
    check_finite_data(data, DOMAIN_ROLES)
    nu = (PRETRAINED_NU if pretrain is not None else DEFAULT_NU)[loss] if nu is None else float(nu)
    if nu <= 0:
        raise ValueError(f"nu must be > 0, got {nu}")
    feature_scale = (0.05 if pretrain is not None else 1.0) if feature_scale is None else float(feature_scale)
    if feature_scale <= 0:
        raise ValueError(f"feature_scale must be > 0, got {feature_scale}")
    psi_scale = psi_gradient_scale(psi_gradient, nu, pretrain is not None)
    shape, k = data.input_shape, int(data.num_classes)
    hidden = tuple(int(h) for h in hidden)

    def model_fn():
        return DomainAdversarialNet(shape, k, loss, features, feature_dim, hidden, domain_hidden, init)

    model_fn()  # validate the architecture now (clear errors)
    blocks = {OMEGA: ["features.*", "classifier.*"], PSI: ["domain.*"], "features": ["features.*"]}
    problem = DomainAdaptationProblem(
        data=data, model_fn=model_fn, loss="cross_entropy", blocks=blocks, name=name, pretrain=pretrain
    )
    problem.extras["domain_adaptation"] = {
        "loss": loss,
        "nu": nu,
        "features": features,
        "regime": "scratch" if pretrain is None else "pretrained",
        "feature_scale": feature_scale,
        "psi_gradient": psi_gradient,
        "psi_scale": psi_scale,
        "init": init,
    }
    # model_fn builds a DomainAdversarialNet
    return with_saddle_objective(
        problem,
        lambda layout: adversarial_loss(cast(DomainAdversarialNet, problem.model), layout, nu),
        f"{loss}",
        feature_scale,
        psi_scale,
        checked=True,
    )
