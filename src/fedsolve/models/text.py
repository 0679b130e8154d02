"""A character LSTM for next-character prediction (LEAF's Shakespeare model, Caldas et al. 2018).

Each input is a sequence of character indices (``[T]``, stored in the data's float type; they are exact
integers); the model embeds them (``embed_dim`` = 8), runs a ``layers``-layer LSTM with ``hidden`` units
(2 x 256 in LEAF) and scores the next character from the last step's output with one linear layer. The
vocabulary is the set of classes (``out_dim``) unless ``vocab_size`` says otherwise.

The LSTM is :class:`StackedLSTM`: ``nn.LSTM``'s equations, parameters and initialization written as plain
tensor operations, because ``torch.func.vmap`` (which evaluates and trains many clients at once) has no
batching rule for ``nn.LSTM``'s fused kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

__all__ = ["CharLSTM", "StackedLSTM"]


class StackedLSTM(nn.Module):
    """A batch-first unidirectional ``nn.LSTM`` (same parameter names and shapes: ``weight_ih_l{k}``
    ``[4H, I]``, ``weight_hh_l{k}`` ``[4H, H]``, ``bias_ih_l{k}``, ``bias_hh_l{k}``; gates in the order
    input, forget, cell, output; uniform(-1/sqrt(H), 1/sqrt(H)) initialization), in plain tensor operations.
    Returns the last layer's outputs ``[B, T, H]``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1):
        super().__init__()
        self.hidden_size, self.num_layers = hidden_size, num_layers
        for k in range(num_layers):
            n_in = input_size if k == 0 else hidden_size
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size, n_in)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size, hidden_size)))
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
        bound = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        for k in range(self.num_layers):
            w_hh, b_hh = getattr(self, f"weight_hh_l{k}"), getattr(self, f"bias_hh_l{k}")
            gx = x @ getattr(self, f"weight_ih_l{k}").T + getattr(self, f"bias_ih_l{k}")  # all steps at once
            h = c = x.new_zeros(B, self.hidden_size)
            outs = []
            for t in range(T):
                i, f, g, o = (gx[:, t] + h @ w_hh.T + b_hh).chunk(4, -1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            x = torch.stack(outs, 1)
        return x


class CharLSTM(nn.Module):
    """Embedding - LSTM - linear on the last step (module docstring); ``body`` = embedding and LSTM,
    ``head`` = ``last`` = the output layer ``out``."""

    GROUPS: ClassVar[dict[str, list[str]]] = {"body": ["embed.*", "lstm.*"], "head": ["out.*"], "last": ["out.*"]}
    INPUT = "sequence"

    def __init__(
        self,
        in_shape: Sequence[int] = (80,),
        out_dim: int = 80,
        vocab_size: int | None = None,
        embed_dim: int = 8,
        hidden: int = 256,
        layers: int = 2,
    ):
        super().__init__()
        if len(in_shape) != 1:
            raise ValueError(
                f"model: 'char_lstm' needs sequences of character indices [T], got inputs of shape {tuple(in_shape)}"
            )
        if min(embed_dim, hidden, layers) < 1 or (vocab_size is not None and vocab_size < 1):
            raise ValueError(
                f"model.params: sizes must be positive, got embed_dim={embed_dim}, hidden={hidden}, "
                f"layers={layers}, vocab_size={vocab_size}"
            )
        self.embed = nn.Embedding(vocab_size or out_dim, embed_dim)
        self.lstm = StackedLSTM(embed_dim, hidden, layers)
        self.out = nn.Linear(hidden, out_dim)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x.long()))[:, -1])
