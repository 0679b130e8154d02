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

:class:`Byzantine` wraps an algorithm (``Byzantine(FedAvg(cfg, problem), attack="gaussian",
malicious_fraction=0.4)``, composed like an optax transformation): it implements the five functions by
delegating to the wrapped algorithm, with an ``aggregate`` that corrupts the malicious participants' uploads
before the wrapped algorithm's own aggregation. ``byzantine(cls)`` registers the same wrapper under
``byz_<name>`` for configs (``<name>``'s hyper-parameters plus :class:`AttackConfig`'s). What the attack needs
to know about the algorithm is declared once per algorithm class with
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
from typing import Any, Callable, Literal, Mapping

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, create_model
from torch import Tensor

from fedsolve.engine.algorithm import ALGORITHMS, Algorithm, register

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
    if isinstance(algo, Byzantine):
        algo = algo.inner
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
    return view(algo.inner if isinstance(algo, Byzantine) else algo, msg, sel, own)


def _start_from_own(algo, msg, sel, own):       # FedAvg-type: the start point w is the device's own model
    return _replace_rows(msg, "w", sel, own)


def _own_cluster_models(algo, msg, sel, own):   # IFCA: every cluster model it is sent is its own
    return _replace_rows(msg, "models", sel, own.unsqueeze(1).expand(-1, msg["models"].shape[1], -1))


def _own_proximal_centre(algo, msg, sel, own):  # FPFC: the proximal centre zeta is its own fused block
    return _replace_rows(msg, "zeta", sel, own[:, algo.fidx])


def _declare_surfaces() -> None:
    from fedsolve.families.clustered.baselines import CFL, IFCA
    from fedsolve.families.classic.fedavg import FedAvg
    from fedsolve.families.clustered.fpfc import FPFC
    from fedsolve.families.classic.local import Local

    declare_attack_surface(FPFC, AttackSurface("w", _own_proximal_centre))
    declare_attack_surface(FedAvg, AttackSurface("w", _start_from_own))
    declare_attack_surface(IFCA, AttackSurface("w", _own_cluster_models))
    declare_attack_surface(CFL, AttackSurface("dw"))
    declare_attack_surface(Local, AttackSurface(None))


class AttackConfig(BaseModel):
    """The attack's settings (the fields a ``byz_<name>`` config adds to ``<name>``'s)."""

    model_config = ConfigDict(extra="forbid")
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


class Byzantine(Algorithm):
    """``inner`` under attack: the five functions delegate to ``inner``; ``broadcast`` gives an attacker that
    ignores the server its own view, ``aggregate`` corrupts the malicious participants' declared upload keys
    before ``inner``'s aggregation. Everything else (``cfg``, ``cluster_labels``, ...) is ``inner``'s.

    ``Byzantine(FPFC(cfg, problem), attack="sign_flip", malicious_fraction=0.4)``."""

    def __init__(self, inner: Algorithm, attack: AttackConfig | Mapping[str, Any] | str | None = None, **kw):
        if isinstance(attack, str) or attack is None:
            attack = AttackConfig(**({"attack": attack} if attack else {}), **kw)
        elif not isinstance(attack, AttackConfig):
            attack = AttackConfig(**dict(attack), **kw)
        vars(self).update(inner=inner, attack_cfg=attack, name=f"byz_{inner.name}",
                          description=f"{inner.description} -- under a Byzantine model-update attack "
                                      f"(FPFC Sec. 6.4.1)")
        self.problem, self.layout, self.num_clients = inner.problem, inner.layout, inner.num_clients
        self.communicates, self.finite_check_keys = inner.communicates, inner.finite_check_keys
        self._setup_attack()

    def __getattr__(self, name: str):         # what the wrapper does not define is the inner algorithm's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # the inner algorithm's config and kernel choice (Simulation.set_hparams replaces cfg, then calls setup)
    cfg = property(lambda self: self.inner.cfg, lambda self, v: setattr(self.inner, "cfg", v))
    kernel = property(lambda self: self.inner.kernel, lambda self, v: setattr(self.inner, "kernel", v))
    client_weights = property(lambda self: self.inner.client_weights)

    def setup(self) -> None:
        self.inner.setup()
        self._setup_attack()

    def to(self, device):
        self.inner.to(device)
        with torch.device(device):
            self._setup_attack()
        return self

    def _setup_attack(self) -> None:
        c = self.attack_cfg
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

    # ----------------------------------------------------------- the five functions
    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        if self.attack_cfg.attacker_view == "own":   # kept in the server record, so checkpoints carry it
            server = dict(server, byz_own=torch.zeros(self.num_clients, x0.numel(), dtype=x0.dtype),
                          byz_has_own=torch.zeros(self.num_clients, dtype=torch.bool))
        return server, clients

    def broadcast(self, server, ids, round_):
        msg = self.inner.broadcast(self._inner_server(server), ids, round_)
        if self.attack_cfg.attacker_view == "own":
            sel = self.malicious[ids] & server["byz_has_own"][ids]
            if bool(sel.any()):
                msg = own_view(self, msg, sel, server["byz_own"][ids[sel]])
        return msg

    def local_update(self, state, msg, ctx):
        return self.inner.local_update(state, msg, ctx)

    def aggregate(self, server, ids, uploads, round_):
        c = self.attack_cfg
        bad = self.malicious[ids]
        keep = {k: server[k] for k in ("byz_own", "byz_has_own") if k in server}
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
        out = self.inner.aggregate(self._inner_server(server), ids, uploads, round_)
        return dict(out, **keep) if keep else out

    def eval_broadcast(self, server, ids):
        return self.inner.eval_broadcast(self._inner_server(server), ids)

    def eval_model(self, state, msg):
        return self.inner.eval_model(state, msg)

    def work(self, round_: int = 0):
        return self.inner.work(round_)

    def diagnostics(self, server, clients):
        out = dict(self.inner.diagnostics(self._inner_server(server), clients))
        out["malicious"] = float(self.malicious.sum())
        return out

    def finalize(self, server, clients):
        return self.inner.finalize(self._inner_server(server), clients)

    @staticmethod
    def _inner_server(server: dict) -> dict:
        """The server record without the wrapper's own keys (the inner algorithm never sees them)."""
        if "byz_own" not in server:
            return server
        return {k: v for k, v in server.items() if k not in ("byz_own", "byz_has_own")}


def byzantine(cls: type[Algorithm]) -> type[Algorithm]:
    """The registered ``byz_<name>`` of ``cls`` (for configs and ``fedsolve compare``): its config is ``cls``'s
    plus :class:`AttackConfig`'s fields; an instance is ``Byzantine(cls(...), attack=...)``."""
    attack_fields = {k: (f.annotation, f) for k, f in AttackConfig.model_fields.items()}
    config = create_model(f"Byzantine{cls.Config.__name__}", __base__=cls.Config, **attack_fields)

    class Attacked(Byzantine):
        name = f"byz_{cls.name}"
        description = f"{cls.description} -- under a Byzantine model-update attack (FPFC Sec. 6.4.1)"
        Config = config

        def __init__(self, config: Any, problem):
            cfg = config if isinstance(config, self.Config) else self.Config(**dict(config or {}))
            values = cfg.model_dump()
            inner = cls({k: v for k, v in values.items() if k not in AttackConfig.model_fields}, problem)
            super().__init__(inner, AttackConfig(**{k: values[k] for k in AttackConfig.model_fields}))

    Attacked.__name__ = Attacked.__qualname__ = f"Byzantine{cls.__name__}"
    return Attacked


_declare_surfaces()
for _base in ("fpfc", "fpfc_l1", "fedavg", "local", "ifca", "cfl"):
    if _base in ALGORITHMS and f"byz_{_base}" not in ALGORITHMS:
        register(byzantine(ALGORITHMS[_base]))
