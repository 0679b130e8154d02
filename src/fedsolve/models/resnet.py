"""A ResNet for 32x32 images (He et al. 2016, Sec. 4.2: the CIFAR-10 networks), depth ``6n + 2``.

A 3x3 convolution with ``width`` channels, then three stages of ``n`` basic blocks (two 3x3 convolutions
with a shortcut) at ``width``, ``2 width`` and ``4 width`` channels, the second and third starting with
stride 2, then global average pooling and one linear layer. Depth 20 (n = 3) with width 16 is ResNet-20
(0.27 M parameters). Where the channel count changes, the shortcut is a 1x1 convolution with its norm
(the paper's option B).

``norm``: ``group`` (default: GroupNorm with ``groups`` groups per layer, as federated studies use since
batch statistics differ across clients; it keeps no running statistics, so every executor runs it),
``batch`` (BatchNorm2d with running statistics, which the engine keeps per client or averages:
``model.buffers``, ``fedsolve.engine.buffers``) or ``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
from torch import nn

__all__ = ["CifarResNet"]


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(min(groups, channels), channels)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    """conv3x3-norm-ReLU-conv3x3-norm, plus the shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str, groups: int):
        super().__init__()
        bias = norm == "none"
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=bias)
        self.norm1 = _norm(norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=bias)
        self.norm2 = _norm(norm, cout, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=bias), _norm(norm, cout, groups))

    def forward(self, x):
        out = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for ``[C, H, W]`` images (module docstring); ``body`` = convolutions and norms,
    ``head`` = ``last`` = the final linear layer ``fc``."""

    GROUPS: ClassVar[dict[str, list[str]]] = {"body": ["stem.*", "stages.*"], "head": ["fc.*"], "last": ["fc.*"]}
    INPUT = "image"

    def __init__(
        self,
        in_shape: Sequence[int] = (3, 32, 32),
        out_dim: int = 10,
        depth: int = 20,
        width: int = 16,
        norm: Literal["group", "batch", "none"] = "group",
        groups: int = 2,
    ):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"model.params.depth: {depth}; allowed: 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56)")
        if norm not in ("group", "batch", "none"):
            raise ValueError(f"model.params.norm: {norm!r}; allowed: 'group', 'batch', 'none'")
        if width < 1 or groups < 1:
            raise ValueError(f"model.params: width and groups must be positive, got width={width}, groups={groups}")
        n = (depth - 2) // 6
        c = in_shape[0]
        self.stem = nn.Sequential(
            nn.Conv2d(c, width, 3, 1, 1, bias=norm == "none"), _norm(norm, width, groups), nn.ReLU()
        )
        blocks, cin = [], width
        for s, cout in enumerate((width, 2 * width, 4 * width)):
            for b in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if s > 0 and b == 0 else 1, norm, groups))
                cin = cout
        self.stages = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, out_dim)

    def forward(self, x):
        z = self.stages(self.stem(x))
        return self.fc(z.mean(dim=(2, 3)))
