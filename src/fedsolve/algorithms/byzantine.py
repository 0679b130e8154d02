"""Byzantine model-update attacks (FPFC paper Sec. 6.4.1, following Lin et al. 2022; spec 4.5).

A fixed set of malicious devices (a fraction ``malicious_fraction`` of the m devices, drawn once
from ``attack_seed``) uploads a corrupted vector w~_k instead of its true upload, every round it
takes part. Only what reaches the server is altered; what the malicious device itself trains from is
the threat model's other half, which the paper does not state (``attacker_view``):

* ``server`` (default): it follows the protocol and trains from what the server sends. In FPFC that
  message zeta_k is built from its own corrupted upload (theta_kj = w~_k - w_j for far pairs, so
  zeta_k ~ w~_k): under sign-flip its model follows -|c| w_k and the next upload multiplies by |c|
  again, an exponential blow-up of the attacker's own model (measured: float32 overflow after about 40
  participations, results/fpfc/README.md).
* ``own``: it ignores the server and trains from its own last true model (FPFC: the proximal centre
  zeta_k is its own fused block; FedAvg: it starts from its own model, not the global one; IFCA: every
  cluster model it is sent is its own). Its true model stays bounded, so every upload is a fresh
  corruption of a sensible model, the reading under which the paper's figures are finite.

* ``same_value``:  w~_k = c * 1_d,        c ~ N(0, sigma^2)      (paper sigma = 100)
* ``sign_flip``:   w~_k = -|c| * w_k,     c ~ N(0, sigma^2)      (paper sigma = 10)
* ``gaussian``:    w~_k ~ N(0, sigma^2 I)                       (paper sigma = 100)

``attack_block`` restricts the corruption to one named block of the model (the CNN's ``fused`` last layer,
the "personalization layers" the paper's text names); the other coordinates are uploaded truly.

``byzantine(cls)`` turns an algorithm into an attacked one (``byz_<name>``): the same algorithm with more
hyper-parameters and an ``aggregate`` that corrupts the malicious participants' uploads before the algorithm's
own aggregation. What the attack needs to know about the algorithm is declared once per algorithm class with
:func:`declare_attack_surface` (never guessed from message keys): which upload key holds the device's model
(``w`` for FPFC, FedAvg, IFCA; ``dw`` for CFL, whose uploads are updates; none for LOCAL) and, for
``attacker_view='own'``, how the server's message is replaced by what a device that ignores the server trains
from. ``attack_keys`` (default: the declared model key) can name other upload keys. Registered here:
``byz_fpfc``, ``byz_fpfc_l1``, ``byz_fedavg``, ``byz_local`` (no uploads: immune, a reference),
``byz_ifca``, ``byz_cfl``. The metric of the paper is the mean test accuracy of the *benign*
devices: ``benign_mask(algo)`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

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


@dataclass(frozen=True)
class AttackSurface:
    """What an attack needs to know about one algorithm: ``model_key``, the upload key that holds a device's model
    (None: it uploads no model); ``own_view(algo, msg, sel, own)``, the message with the rows ``sel`` replaced by
    what a device that ignores the server trains from, its own model ``own`` ``[k_sel, d]`` (None: undefined)."""

    model_key: str | None
    own_view: Callable[[Algorithm, dict, Tensor, Tensor], dict] | None = None


SURFACES: dict[type[Algorithm], AttackSurface] = {}


def declare_attack_surface(cls: type[Algorithm], surface: AttackSurface) -> None:
    """Declare ``cls``'s attack surface (its subclasses inherit it unless they declare their own)."""
    SURFACES[cls] = surface


def attack_surface(algo: Algorithm | type[Algorithm]) -> AttackSurface:
    cls = algo if isinstance(algo, type) else type(algo)
    surface = next((SURFACES[k] for k in cls.__mro__ if k in SURFACES), None)
    if surface is None:
        raise ValueError(f"{cls.name} declares no attack surface (byzantine.declare_attack_surface)")
    return surface


def _replace_rows(msg: dict, key: str, sel: Tensor, val: Tensor) -> dict:
    rows = msg[key].clone()
    rows[sel] = val.to(rows.dtype)
    return dict(msg, **{key: rows})


def own_view(algo: Algorithm, msg: dict, sel: Tensor, own: Tensor) -> dict:
    """``msg`` with the rows ``sel`` replaced by what a device that ignores the server trains from (its own model
    ``own`` ``[k_sel, d]``), by ``algo``'s declared attack surface."""
    view = attack_surface(algo).own_view
    if view is None:
        raise ValueError(f"attacker_view: 'own' is not defined for {algo.name}; use attacker_view 'server'")
    return view(algo, msg, sel, own)


def _start_from_own(algo, msg, sel, own):       # FedAvg-type: the start point w is the device's own model
    return _replace_rows(msg, "w", sel, own)


def _own_cluster_models(algo, msg, sel, own):   # IFCA: every cluster model it is sent is its own
    return _replace_rows(msg, "models", sel, own.unsqueeze(1).expand(-1, msg["models"].shape[1], -1))


def _own_proximal_centre(algo, msg, sel, own):  # FPFC: the proximal centre zeta is its own fused block
    return _replace_rows(msg, "zeta", sel, own[:, algo.fidx])


def _declare_surfaces() -> None:
    from fedsolve.algorithms.clustering_baselines import CFL, IFCA
    from fedsolve.algorithms.fedavg import FedAvg
    from fedsolve.algorithms.fpfc import FPFC
    from fedsolve.algorithms.local import Local

    declare_attack_surface(FPFC, AttackSurface("w", _own_proximal_centre))
    declare_attack_surface(FedAvg, AttackSurface("w", _start_from_own))
    declare_attack_surface(IFCA, AttackSurface("w", _own_cluster_models))
    declare_attack_surface(CFL, AttackSurface("dw"))
    declare_attack_surface(Local, AttackSurface(None))


def byzantine(cls: type[Algorithm]) -> type[Algorithm]:
    """``cls`` with attacked uploads (see the module docstring)."""

    class Config(cls.Config):
        attack: Attack = Field("none", description="Byzantine attack of the malicious devices' uploads")
        malicious_fraction: float = Field(0.0, ge=0, le=1, description="share of malicious devices (paper: "
                                                                       "0, 0.2, 0.4, 0.6, 0.8)")
        attack_sigma: float | None = Field(None, gt=0, description="noise level sigma; null = the paper's "
                                                                   "(100 same-value, 10 sign-flip, 100 gaussian)")
        attack_seed: int = Field(0, ge=0, description="seed of the malicious set and of the attack draws")
        attack_keys: tuple[str, ...] | None = Field(None, description="upload keys that are corrupted (null: the "
                                                                    "algorithm's declared model key)")
        attack_block: str | None = Field(
            None, description="corrupt only this named parameter block of the uploads (e.g. 'fused', the CNN's "
                              "last layer: the paper attacks the personalization layers); null = all of it")
        attacker_view: Literal["server", "own"] = Field(
            "server", description="what a malicious device trains from: the server's message (the protocol) or "
                                  "its own last true model (see the module docstring)")

    Config.__name__ = f"Byzantine{cls.Config.__name__}"

    class Attacked(cls):
        name = f"byz_{cls.name}"
        description = f"{cls.description} -- under a Byzantine model-update attack (FPFC Sec. 6.4.1)"

        def setup(self) -> None:
            super().setup()
            c = self.cfg
            self.malicious = malicious_set(self.num_clients, c.malicious_fraction, c.attack_seed)
            self.sigma = c.attack_sigma if c.attack_sigma is not None else PAPER_SIGMA.get(c.attack, 0.0)
            self.attack_cols: slice | Tensor = slice(None)     # the coordinates an attack corrupts
            if c.attack_block is not None:
                if not self.layout.has_block(c.attack_block):
                    raise ValueError(f"attack_block: the model has no block {c.attack_block!r}; allowed: "
                                     f"{self.layout.block_names()} or null (the whole upload)")
                self.attack_cols = torch.nonzero(self.layout.mask(c.attack_block)).flatten()
            surface = attack_surface(self)
            self.model_key = surface.model_key
            self.attack_keys = c.attack_keys if c.attack_keys is not None else \
                ((surface.model_key,) if surface.model_key else ())
            if c.attacker_view == "own" and surface.model_key is not None and (   # no uploads (LOCAL): immune
                    surface.own_view is None or self.attack_keys != (surface.model_key,)):
                raise ValueError(f"attacker_view: 'own' needs a declared own view and the uploaded model as the "
                                 f"attacked key ({self.name}: model key {surface.model_key!r}, attack_keys "
                                 f"{self.attack_keys}); use attacker_view 'server'")

        def init(self, x0, rngs):
            server, clients = super().init(x0, rngs)
            if self.cfg.attacker_view == "own":   # kept in the server record, so checkpoints carry it
                server = dict(server, byz_own=torch.zeros(self.num_clients, x0.numel(), dtype=x0.dtype),
                              byz_has_own=torch.zeros(self.num_clients, dtype=torch.bool))
            return server, clients

        def broadcast(self, server, ids, round_):
            msg = super().broadcast(server, ids, round_)
            if self.cfg.attacker_view == "own":
                sel = self.malicious[ids] & server["byz_has_own"][ids]
                if bool(sel.any()):
                    msg = own_view(self, msg, sel, server["byz_own"][ids[sel]])
            return msg

        def aggregate(self, server, ids, uploads, round_):
            c = self.cfg
            bad = self.malicious[ids]
            keep = {}
            if c.attacker_view == "own":     # the wrapped algorithm's aggregate never sees these keys
                server = dict(server)
                keep = {k: server.pop(k) for k in ("byz_own", "byz_has_own")}
            if c.attack != "none" and bool(bad.any()) and uploads:   # LOCAL uploads nothing
                gen = torch.Generator().manual_seed(c.attack_seed * 1_000_003 + int(round_))
                uploads = dict(uploads)
                if keep:   # remember the true uploads before they are corrupted
                    keep["byz_own"][ids[bad]] = uploads[self.model_key][bad].to(keep["byz_own"].dtype)
                    keep["byz_has_own"][ids[bad]] = True
                for key in self.attack_keys:
                    if key not in uploads:
                        raise ValueError(f"attack_keys: {self.name} uploads {sorted(uploads)}, not {key!r}")
                    rows = uploads[key].clone()
                    sub = rows[bad].reshape(int(bad.sum()), -1)
                    sub[:, self.attack_cols] = attack_rows(sub[:, self.attack_cols], c.attack, self.sigma, gen)
                    rows[bad] = sub.reshape(rows[bad].shape)
                    uploads[key] = rows
            out = super().aggregate(server, ids, uploads, round_)
            return dict(out, **keep) if keep else out

        def diagnostics(self, server, clients):
            out = dict(super().diagnostics(server, clients))
            out["malicious"] = float(self.malicious.sum())
            return out

    Attacked.Config = Config
    Attacked.__name__ = Attacked.__qualname__ = f"Byzantine{cls.__name__}"
    return Attacked


_declare_surfaces()
for _base in ("fpfc", "fpfc_l1", "fedavg", "local", "ifca", "cfl"):
    if _base in ALGORITHMS and f"byz_{_base}" not in ALGORITHMS:
        register(byzantine(ALGORITHMS[_base]))
