"""What every contender of the peer benchmark shares, with nothing but torch and numpy (it is imported both in the
project's environment and in the peers' own, which has no fedsolve).

The driver (``mlp_fedavg.py``) writes one *exchange folder*; every contender reads it:

  x.npy      float32 [N, 784]  training inputs, clients' rows contiguous (client i: rows offsets[i]:offsets[i+1])
  y.npy      int64   [N]       labels
  perms.npy  int32   [R, m, n] the minibatch order of round r, client i: batch b is perms[r, i, b*B:(b+1)*B]
                               (fedsolve's own plans, read from its random streams, so all orders are identical)
  w0.npz     the initial weights, names and shapes of ``make_mlp``'s parameters
  meta.json  clients, samples, hidden sizes, lr, batch, rounds

A contender's result (JSON): ``round_s`` (seconds per round, round 0 the warm-up), ``loss`` (per round: the mean
over clients of the mean minibatch loss of their local steps, fedsolve's ``train_loss``), ``steps`` (SGD steps per
round, summed over clients); the final global weights, flat, go to ``<result>.w.npy`` beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn


def make_mlp(hidden: list[int], d_in: int = 784, classes: int = 10) -> nn.Sequential:
    """The MNIST MLP (784-200-200-10, ReLU), parameters in fedsolve's ``mlp`` order (hidden layers, then out)."""
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        layers += [nn.Linear(d_in, h), nn.ReLU()]
        d_in = h
    layers.append(nn.Linear(d_in, classes))
    return nn.Sequential(*layers)


class Exchange:
    """The exchange folder, read once (inputs memory-mapped)."""

    def __init__(self, folder: str | os.PathLike):
        f = Path(folder)
        self.meta = json.loads((f / "meta.json").read_text())
        self.x = torch.from_numpy(np.load(f / "x.npy", mmap_mode="r")[:].copy())
        self.y = torch.from_numpy(np.load(f / "y.npy"))
        self.perms = np.load(f / "perms.npy")
        with np.load(f / "w0.npz") as z:
            self.w0 = [torch.from_numpy(z[f"p{i}"]) for i in range(len(z.files))]
        self.m, self.n = self.meta["clients"], self.meta["samples"]
        self.lr, self.batch = self.meta["lr"], self.meta["batch"]

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i * self.n:(i + 1) * self.n], self.y[i * self.n:(i + 1) * self.n]

    def order(self, round_: int, i: int) -> np.ndarray:
        """Client ``i``'s sample order in round ``round_`` (its minibatches are consecutive slices)."""
        return self.perms[round_, i]

    def model(self) -> nn.Sequential:
        """A fresh MLP holding the initial weights."""
        net = make_mlp(self.meta["hidden"])
        with torch.no_grad():
            for p, w in zip(net.parameters(), self.w0):
                p.copy_(w)
        return net


def write_result(path: str | os.PathLike, name: str, round_s: list[float], loss: list[float], steps: list[int],
                 w: torch.Tensor | None = None, **extra) -> None:
    out = {"name": name, "round_s": round_s, "loss": loss, "steps": steps, "torch": torch.__version__,
           "threads": torch.get_num_threads(), **extra}
    Path(path).write_text(json.dumps(out))
    if w is not None:
        np.save(f"{path}.w.npy", w.detach().reshape(-1).numpy())
