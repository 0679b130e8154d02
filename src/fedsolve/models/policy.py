"""FedCP's network (the solver: families/personalized/fedcp.py; Zhang, Hua, Wang, Shen, Xue, Guan, "FedCP: Separating
Feature Information for Personalized Federated Learning via Conditional Policy", KDD 2023) around any model whose last
module is a linear head.

With z = body(x) ``[B, h]`` (the model up to its output layer) and a client's context c ``[h]``:

    (pm, gm) = softmax((CS(z * c / ||c||) viewed [B, 2, h] + noise) / tau, over the pair)     pm + gm = 1
    output   = p(z * pm) + g(z * gm)

CS is the Conditional Selection network (Linear(h, 2h), LayerNorm(2h), ReLU; shared by all clients), p the client's
personal head and g the global head (both copies of the model's output layer at the start), c the client's
context. The noise is Gumbel noise during training; at scoring there is none (the authors' code draws it at test
time as well, ``F.gumbel_softmax`` ignoring eval mode, so their test accuracy is one random draw; scoring here is
deterministic, the gate's noise-free softmax). The context is a parameter tensor of the network so that each client's
row carries its own; the solver sets it and never trains it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedsolve.models import output_layer


class ConditionalPolicyNet(nn.Module):
    """The model ``base`` as (body, g, p) with the CS network and a context (module docstring); ``tau``: the
    Gumbel-softmax temperature (the authors' 1)."""

    def __init__(self, base: nn.Module, tau: float = 1.0):
        super().__init__()
        path = output_layer(base, "fedcp")
        head = base.get_submodule(path)
        assert isinstance(head, nn.Linear), "output_layer checks that the head is a linear layer"
        body = copy.deepcopy(base)
        parent, _, leaf = path.rpartition(".")
        setattr(body.get_submodule(parent) if parent else body, leaf, nn.Identity())
        dtype, device = head.weight.dtype, head.weight.device
        h: int = head.in_features
        self.body = body
        self.g = copy.deepcopy(head)
        self.p = copy.deepcopy(head)
        self.cs = nn.Sequential(
            nn.Linear(h, 2 * h, dtype=dtype, device=device), nn.LayerNorm(2 * h, dtype=dtype, device=device), nn.ReLU()
        )
        self.context = nn.Parameter(torch.ones(h, dtype=dtype, device=device))
        self.tau = tau
        self.GROUPS = {"body": ["body.*"], "global_head": ["g.*"], "personal_head": ["p.*"], "cs": ["cs.*"],
                       "context": ["context"]}  # fmt: skip
        self.base_model = (base,)  # the model itself (not a submodule): the solver checks that p(body(x)) is base(x)

    def gates(self, z: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(pm, gm)`` ``[B, h]`` each: the policy's soft split of every feature of ``z`` ``[B, h]``; ``noise``
        ``[B, 2, h]``: Gumbel noise added to the policy's logits (None: none)."""
        logits = self.cs(z * F.normalize(self.context, dim=-1)).reshape(z.shape[0], 2, -1)
        if noise is not None:
            logits = logits + noise
        a = torch.softmax(logits / self.tau, dim=1)
        return a[:, 0], a[:, 1]

    def forward(self, x: Tensor, noise: Tensor | None = None, features: bool = False):
        """The logits (``features``: and the body's features ``z``, as a pair)."""
        z = self.body(x)
        out = self.output(z, noise)
        return (out, z) if features else out

    def output(self, z: Tensor, noise: Tensor | None = None) -> Tensor:
        """The logits from the features ``z``: the personal head on the policy's personal share, plus the global
        head on the rest."""
        pm, gm = self.gates(z, noise)
        return self.p(z * pm) + self.g(z * gm)
