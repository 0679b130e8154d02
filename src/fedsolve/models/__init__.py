"""Models with named parameter groups.

Every model exposes ``GROUPS``: ``{group: [parameter-name patterns]}``, used to build named
blocks of the flat parameter vector (e.g. ``personal = head`` for output personalization).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import nn

from fedsolve.core.native import max_pool2x2

from .resnet import CifarResNet
from .text import CharLSTM


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (or linear regression with ``out_dim=1``)."""

    GROUPS: ClassVar[dict[str, list[str]]] = {"head": ["linear.*"], "body": []}

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


class MLP(nn.Module):
    """Fully connected network; ``body`` = hidden layers, ``head`` = output layer."""

    GROUPS: ClassVar[dict[str, list[str]]] = {"body": ["hidden.*"], "head": ["out.*"]}

    def __init__(self, in_dim: int, out_dim: int, hidden: Sequence[int] = (200, 200)):
        super().__init__()
        if (
            isinstance(hidden, (str, bytes, dict))
            or not isinstance(hidden, Sequence)
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)
        ):
            raise ValueError(
                f"hidden: expected a list of layer widths, each a whole number >= 1 (e.g. [200, 200]; "
                f"[] for none), got {hidden!r}"
            )
        layers: list[nn.Module] = []
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.hidden = nn.Sequential(*layers)
        self.out = nn.Linear(d, out_dim)

    def forward(self, x):
        return self.out(self.hidden(x.reshape(x.shape[0], -1)))


class LeNet(nn.Module):
    """LeNet-style CNN: conv(6,5x5,pad 2)-pool-conv(16,5x5)-pool-fc-fc.

    ``body`` = convolutions, ``head`` = fully connected layers (FedAPM output personalization;
    FPFC fuses the last layer ``fc2`` only with ``fc_hidden=0``).
    """

    GROUPS = {  # noqa: RUF012  (the default, CifarCNN's too: an instance with other fc layers replaces it)
        "body": ["conv1.*", "conv2.*"],
        "head": ["fc1.*", "fc2.*"],
        "last": ["fc2.*"],
    }
    INPUT = "image"

    def __init__(
        self, in_shape: Sequence[int] = (1, 28, 28), out_dim: int = 10, fc_hidden: int = 120, fc_hidden2: int = 0
    ):
        """``fc_hidden2`` > 0 adds a second hidden fc layer (``fc_mid``): conv-pool-conv-pool-fc-fc-fc, the 7-layer
        LeNet-5 of the SimFBO paper's CNN run (fc 120 -> 84 -> out)."""
        super().__init__()
        if fc_hidden2 and not fc_hidden:
            raise ValueError("model.params.fc_hidden2: needs fc_hidden > 0 (the first hidden fc layer)")
        c, h, w = in_shape
        self.conv1 = nn.Conv2d(c, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=2 if h < 16 else 0)
        with torch.no_grad():
            n = self._features(torch.zeros(1, c, h, w)).shape[1]
        self.fc_mid = None
        if fc_hidden:
            self.fc1: nn.Linear | None = nn.Linear(n, fc_hidden)
            if fc_hidden2:
                self.fc_mid = nn.Linear(fc_hidden, fc_hidden2)
                self.GROUPS = {
                    "body": ["conv1.*", "conv2.*"],
                    "head": ["fc1.*", "fc_mid.*", "fc2.*"],
                    "last": ["fc2.*"],
                }
            self.fc2 = nn.Linear(fc_hidden2 or fc_hidden, out_dim)
        else:
            self.fc1 = None
            self.fc2 = nn.Linear(n, out_dim)
            self.GROUPS = {"body": ["conv1.*", "conv2.*"], "head": ["fc2.*"], "last": ["fc2.*"]}

    def _features(self, x):
        x = max_pool2x2(torch.relu(self.conv1(x)))  # torch.max_pool2d(., 2), compiled forward on CPU
        x = max_pool2x2(torch.relu(self.conv2(x)))
        return x.flatten(1)

    def forward(self, x):
        z = self._features(x)
        if self.fc1 is not None:
            z = torch.relu(self.fc1(z))
        if self.fc_mid is not None:
            z = torch.relu(self.fc_mid(z))
        return self.fc2(z)


class CifarCNN(LeNet):
    """FedAPM's CIFAR-10 CNN (Zhu et al., KDD'25, App. B.2): conv(16, 3x3, pad 1)-ReLU-pool-conv(32, 3x3, pad 1)-
    ReLU-pool-fc(128)-ReLU-fc.

    LeNet's forward pass and parameter groups (``body`` = convolutions, ``head`` = fc layers), so output
    personalization makes fc1 + fc2 personal: on ``[3, 32, 32]`` images 5,088 shared and 263,562 personal
    parameters, as in the authors' model (spec sec. 2.4).
    """

    def __init__(
        self,
        in_shape: Sequence[int] = (3, 32, 32),
        out_dim: int = 10,
        channels: Sequence[int] = (16, 32),
        fc_hidden: int = 128,
    ):
        nn.Module.__init__(self)
        c, h, w = in_shape
        if len(channels) != 2 or min(channels) < 1:
            raise ValueError(f"model.params.channels: two positive channel counts, got {list(channels)}")
        self.conv1 = nn.Conv2d(c, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.fc_mid = None
        self.fc1 = nn.Linear(channels[1] * (h // 4) * (w // 4), fc_hidden)
        self.fc2 = nn.Linear(fc_hidden, out_dim)


MODELS: dict[str, tuple[Callable[..., nn.Module], str]] = {
    "logreg": (LogisticRegression, "multinomial logistic / linear regression on flattened inputs"),
    "mlp": (MLP, "fully connected ReLU network, hidden sizes configurable (default 200-200)"),
    "lenet": (LeNet, "LeNet-style CNN: 2 conv + 2 fc (fc_hidden=0: one fc, FPFC's ConvNet)"),
    "cifar_cnn": (CifarCNN, "FedAPM's CIFAR-10 CNN: 2 conv 3x3 (16, 32 channels) + 2 fc (128 hidden)"),
    "cifar_resnet": (
        CifarResNet,
        "ResNet-(6n+2) for 32x32 images (default ResNet-20), GroupNorm (norm: batch for BatchNorm)",
    ),
    "char_lstm": (CharLSTM, "character LSTM (LEAF Shakespeare): embedding 8, 2 x 256 LSTM, next character"),
}


def build_model_fn(name: str, input_shape: Sequence[int], out_dim: int | None, **params) -> Callable[[], nn.Module]:
    """A factory for model ``name`` sized to the data (``input_shape`` without the batch dim) with ``out_dim``
    outputs (a classification dataset's ``num_classes``). A model class's ``INPUT`` says what its first argument
    is: ``"image"`` the shape ``[C, H, W]`` (``[H, W]`` gets one channel), ``"sequence"`` the shape as it is,
    otherwise the flattened input size."""
    if name not in MODELS:
        raise ValueError(f"model: unknown {name!r}; allowed: {sorted(MODELS)}")
    if out_dim is None:
        raise ValueError(
            f"model: {name!r} needs out_dim, the number of outputs (regression data has no "
            f"num_classes: give its target width)"
        )
    cls = MODELS[name][0]
    kind = getattr(cls, "INPUT", "flat")
    if kind == "image":
        shape = tuple(input_shape) if len(input_shape) == 3 else (1, *input_shape)
        if len(shape) != 3:
            raise ValueError(f"model: {name!r} needs image inputs [C,H,W], got shape {tuple(input_shape)}")
        return lambda: cls(shape, out_dim, **params)
    if kind == "sequence":
        shape = tuple(input_shape)
        return lambda: cls(shape, out_dim, **params)
    flat = int(math.prod(input_shape))
    return lambda: cls(flat, out_dim, **params)


def model_groups(model: nn.Module) -> dict[str, list[str]]:
    return {k: list(v) for k, v in getattr(model, "GROUPS", {}).items()}


def output_layer(model: nn.Module, who: str) -> str:
    """The name of the model's output layer: the module of its group ``last`` (else ``head``), which must be one
    linear layer holding the model's last parameter tensors (a weight ``[C, h]`` and a bias ``[C]``); a
    ``ValueError`` naming ``who`` (the solver) otherwise. FedRoD's heads and FedCP's are this layer."""
    groups = getattr(model, "GROUPS", {})
    patterns = groups.get("last") or groups.get("head") or []
    names = [n for n, _ in model.named_parameters()]
    mine = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    path = mine[0].rsplit(".", 1)[0] if mine else ""
    layer = model.get_submodule(path) if mine else None
    if (
        not isinstance(layer, nn.Linear)
        or layer.bias is None
        or mine != [f"{path}.weight", f"{path}.bias"]
        or mine != names[-2:]
    ):
        raise ValueError(
            f"{who}: the model's head (group 'last', else 'head') must be its final linear layer (a weight "
            f"[C, h] and a bias [C], the last parameter tensors); got {mine or 'no such group'}"
        )
    return path
