"""Byzantine model-update attacks (FPFC paper Sec. 6.4.1, following Lin et al. 2022; spec 4.5).

A fixed set of malicious devices (a fraction ``malicious_fraction`` of the m devices, drawn once
from ``attack_seed``) uploads a corrupted vector w~_k instead of its true upload, every round it
takes part. It keeps training on its own true state; only what reaches the server is altered.

* ``same_value``:  w~_k = c * 1_d,        c ~ N(0, sigma^2)      (paper sigma = 100)
* ``sign_flip``:   w~_k = -|c| * w_k,     c ~ N(0, sigma^2)      (paper sigma = 10)
* ``gaussian``:    w~_k ~ N(0, sigma^2 I)                       (paper sigma = 100)

``byzantine(cls)`` turns any registered algorithm into an attacked one (``byz_<name>``): the same
algorithm with three more hyper-parameters and an ``aggregate`` that corrupts the upload keys in
``attack_keys`` (default ``w``: the uploaded model; e.g. ``dw`` for CFL, whose uploads are updates)
of the malicious participants before the algorithm's own aggregation. Registered here:
``byz_fpfc``, ``byz_fpfc_l1``, ``byz_fedavg``, ``byz_local`` (no uploads: immune, a reference),
``byz_ifca``, ``byz_cfl``. The metric of the paper is the mean test accuracy of the *benign*
devices: ``benign_mask(algo)`` gives them (``experiments/fpfc/robustness.py`` uses it).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fedsolve.algorithms.base import ALGORITHMS, Algorithm, register

PAPER_SIGMA = {"same_value": 100.0, "sign_flip": 10.0, "gaussian": 100.0}
Attack = Literal["none", "same_value", "sign_flip", "gaussian"]


def attack_rows(rows: Tensor, attack: str, sigma: float, gen: torch.Generator) -> Tensor:
    """Corrupted versions of ``rows`` ``[k, ...]`` (one draw of c per row)."""
    k = rows.shape[0]
    shape = (k,) + (1,) * (rows.dim() - 1)
    if attack == "same_value":
        c = torch.randn(shape, generator=gen, dtype=torch.float64) * sigma
        return (c * torch.ones_like(rows, dtype=torch.float64)).to(rows.dtype)
    if attack == "sign_flip":
        c = torch.randn(shape, generator=gen, dtype=torch.float64) * sigma
        return (-c.abs() * rows.double()).to(rows.dtype)
    if attack == "gaussian":
        return (torch.randn(rows.shape, generator=gen, dtype=torch.float64) * sigma).to(rows.dtype)
    if attack == "none":
        return rows
    raise ValueError(f"attack: unknown {attack!r}; allowed: none, same_value, sign_flip, gaussian")


def malicious_set(m: int, fraction: float, seed: int) -> Tensor:
    """Boolean ``[m]`` mask: round(fraction * m) devices, a fixed random draw."""
    n_bad = int(round(fraction * m))
    perm = np.random.default_rng(seed).permutation(m)
    mask = torch.zeros(m, dtype=torch.bool)
    mask[torch.as_tensor(perm[:n_bad], dtype=torch.long)] = True
    return mask


def benign_mask(algo: Algorithm) -> Tensor:
    return ~getattr(algo, "malicious", torch.zeros(algo.num_clients, dtype=torch.bool))


def byzantine(cls: type[Algorithm]) -> type[Algorithm]:
    """``cls`` with attacked uploads (see the module docstring)."""

    class Config(cls.Config):
        attack: Attack = Field("none", description="Byzantine attack of the malicious devices' uploads")
        malicious_fraction: float = Field(0.0, ge=0, le=1, description="share of malicious devices (paper: "
                                                                       "0, 0.2, 0.4, 0.6, 0.8)")
        attack_sigma: float | None = Field(None, gt=0, description="noise level sigma; null = the paper's "
                                                                   "(100 same-value, 10 sign-flip, 100 gaussian)")
        attack_seed: int = Field(0, ge=0, description="seed of the malicious set and of the attack draws")
        attack_keys: tuple[str, ...] = Field(("w",), description="upload keys that are corrupted")

    Config.__name__ = f"Byzantine{cls.Config.__name__}"

    class Attacked(cls):
        name = f"byz_{cls.name}"
        description = f"{cls.description} -- under a Byzantine model-update attack (FPFC Sec. 6.4.1)"

        def setup(self) -> None:
            super().setup()
            c = self.cfg
            self.malicious = malicious_set(self.num_clients, c.malicious_fraction, c.attack_seed)
            self.sigma = c.attack_sigma if c.attack_sigma is not None else PAPER_SIGMA.get(c.attack, 0.0)

        def aggregate(self, server, ids, uploads, round_):
            c = self.cfg
            bad = self.malicious[ids]
            if c.attack != "none" and bool(bad.any()) and uploads:   # LOCAL uploads nothing
                gen = torch.Generator().manual_seed(c.attack_seed * 1_000_003 + int(round_))
                uploads = dict(uploads)
                for key in c.attack_keys:
                    if key not in uploads:
                        raise ValueError(f"attack_keys: {self.name} uploads {sorted(uploads)}, not {key!r}")
                    rows = uploads[key].clone()
                    rows[bad] = attack_rows(rows[bad], c.attack, self.sigma, gen)
                    uploads[key] = rows
            return super().aggregate(server, ids, uploads, round_)

        def diagnostics(self, server, clients):
            out = dict(super().diagnostics(server, clients))
            out["malicious"] = float(self.malicious.sum())
            return out

    Attacked.Config = Config
    Attacked.__name__ = Attacked.__qualname__ = f"Byzantine{cls.__name__}"
    return Attacked


for _base in ("fpfc", "fpfc_l1", "fedavg", "local", "ifca", "cfl"):
    if _base in ALGORITHMS and f"byz_{_base}" not in ALGORITHMS:
        register(byzantine(ALGORITHMS[_base]))
