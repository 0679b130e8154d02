"""Two-modality human-activity-recognition model (FedAPM's KU-HAR "HARClassifier", scaled down).

Zhu et al. (FedAPM, KDD'25) App. B.2 / spec sec. 4.2: per modality a Conv1d stack (k5, p2, ReLU,
maxpool 2), a GRU over the pooled sequence, attention fusion over the concatenated token
sequences (``Linear(d_hid, att) - tanh - Linear(att, d_head)``, softmax over time, output
flattened to ``d_hid * d_head``) and a two-layer classifier.

Substitutions, so that the model runs under ``torch.func.vmap`` (vectorized executor):

* the GRU is written out as explicit GRU-cell math in a Python loop over time (``torch.func.vmap``
  has no batching rule for ``aten::gru``), with PyTorch's gate order and parameter shapes;
* no dropout (the vectorized executor forbids randomness inside ``local_update``); the paper's
  dropout 0.1 is a regulariser only;
* channel widths are scaled down for CPU (paper: 32-64-128 conv, 128 GRU, d_head 6).

Input: ``x`` of shape ``[B, 2 * C, T]``: the first ``C`` channels are the accelerometer, the next
``C`` the gyroscope (C = 3 axes).

Personalization (``PERSONALIZATION``): ``split_input`` = accelerometer encoder (paper);
``input`` = both conv encoders (the authors' code, ``layer_num = 12``); ``output`` = classifier head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn


class ExplicitGRU(nn.Module):
    """Single-layer unidirectional batch-first GRU with the same parameters as ``nn.GRU``
    (``weight_ih [3H, I]``, ``weight_hh [3H, H]``, ``bias_ih``, ``bias_hh``; gates r, z, n) but
    plain tensor math, so it is vmappable. Returns the output sequence ``[B, T, H]``."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(3 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(3 * hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(3 * hidden_size))
        k = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -k, k)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        gi = x @ self.weight_ih.T + self.bias_ih  # [B, T, 3H], all time steps at once
        h = x.new_zeros(B, self.hidden_size)
        outs = []
        for t in range(T):
            gh = h @ self.weight_hh.T + self.bias_hh
            i_r, i_z, i_n = gi[:, t].chunk(3, -1)
            h_r, h_z, h_n = gh.chunk(3, -1)
            r = torch.sigmoid(i_r + h_r)
            z = torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            h = (1 - z) * n + z * h
            outs.append(h)
        return torch.stack(outs, 1)


def conv_encoder(in_ch: int, channels: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_ch
    for h in channels:
        layers += [nn.Conv1d(c, h, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2)]
        c = h
    return nn.Sequential(*layers)


class AttentionFusion(nn.Module):
    """FedMultimodal's ``FuseBaseSelfAttention``: ``d_head`` attention poolings over the tokens."""

    def __init__(self, d_hid: int, d_head: int, d_att: int):
        super().__init__()
        self.att = nn.Sequential(nn.Linear(d_hid, d_att), nn.Tanh(), nn.Linear(d_att, d_head))

    def forward(self, tokens: Tensor) -> Tensor:  # [B, S, d_hid] -> [B, d_head * d_hid]
        a = torch.softmax(self.att(tokens), dim=1)  # over the sequence
        return torch.einsum("bsk,bsd->bkd", a, tokens).flatten(1)


class HARClassifier(nn.Module):
    """Accelerometer + gyroscope encoders, GRUs, attention fusion, classifier."""

    GROUPS: ClassVar[dict[str, list[str]]] = {
        "acc_encoder": ["acc_conv.*"],
        "gyro_encoder": ["gyro_conv.*"],
        "acc_rnn": ["acc_rnn.*"],
        "gyro_rnn": ["gyro_rnn.*"],
        "fusion": ["fusion.*"],
        "head": ["head.*"],
        "last": ["head.2.*"],  # the classifier's output layer (FedRoD's head)
        "body": ["acc_conv.*", "gyro_conv.*", "acc_rnn.*", "gyro_rnn.*", "fusion.*"],
    }
    PERSONALIZATION: ClassVar[dict[str, list[str]]] = {
        "split_input": ["acc_encoder"],
        "input": ["acc_encoder", "gyro_encoder"],
        "output": ["head"],
    }

    def __init__(
        self,
        in_channels: int = 6,
        num_classes: int = 8,
        conv_channels: Sequence[int] = (16, 32, 32),
        d_hid: int = 32,
        d_head: int = 4,
        d_att: int = 64,
        fc_hidden: int = 64,
    ):
        super().__init__()
        if in_channels % 2:
            raise ValueError(f"HARClassifier: in_channels must be even (accelerometer + gyroscope), got {in_channels}")
        self.c = in_channels // 2
        self.acc_conv = conv_encoder(self.c, conv_channels)
        self.gyro_conv = conv_encoder(self.c, conv_channels)
        self.acc_rnn = ExplicitGRU(conv_channels[-1], d_hid)
        self.gyro_rnn = ExplicitGRU(conv_channels[-1], d_hid)
        self.fusion = AttentionFusion(d_hid, d_head, d_att)
        self.head = nn.Sequential(nn.Linear(d_hid * d_head, fc_hidden), nn.ReLU(), nn.Linear(fc_hidden, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        acc = self.acc_rnn(self.acc_conv(x[:, : self.c]).transpose(1, 2))
        gyro = self.gyro_rnn(self.gyro_conv(x[:, self.c :]).transpose(1, 2))
        return self.head(self.fusion(torch.cat([acc, gyro], 1)))


def build_har_model_fn(input_shape: Sequence[int], out_dim: int, **params):
    """Factory for ``HARClassifier`` sized to data of shape ``[2C, T]`` (without the batch dim)."""
    if len(input_shape) != 2:
        raise ValueError(f"model: 'har' needs inputs [channels, time], got shape {tuple(input_shape)}")
    return lambda: HARClassifier(int(input_shape[0]), out_dim, **params)


#: models of this module, looked up by the experiment runner after ``fedsolve.models.MODELS``
MODELS = {
    "har": (
        HARClassifier,
        "two-modality HAR: acc + gyro Conv1d encoders, explicit GRUs, attention fusion, "
        "classifier (FedAPM's KU-HAR model, vmappable); input [6, T]",
    )
}


def build_model_fn(name: str, input_shape: Sequence[int], out_dim: int, **params):
    """Factory for a model of this module (``har``) sized to the data."""
    if name not in MODELS:
        raise ValueError(f"model: unknown {name!r}; allowed: {sorted(MODELS)}")
    return build_har_model_fn(input_shape, out_dim, **params)
