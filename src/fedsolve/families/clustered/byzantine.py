"""Byzantine model-update attacks (FPFC paper Sec. 6.4.1, following Lin et al. 2022; spec 4.5): the wrapper kind
``attack``, which composes with any solver that declares its attack surface.

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

What the attack needs to know about a solver is the solver's own declaration ``attack_surface`` (an
:class:`~fedsolve.engine.wrappers.AttackSurface`; never guessed from message keys): the upload key that holds a
device's model (``w`` for FPFC, FedAvg, IFCA, PACFL; ``dw`` for CFL, whose uploads are updates; none for LOCAL,
which is immune) and the message key that a device ignoring the server fills with its own model (FedAvg ``w``,
IFCA ``models``, FPFC ``zeta`` on its fused coordinates). ``attack_keys`` (default: the declared model key) can
name other upload keys. A config names the attack under the algorithm's ``wrap`` list::

    algorithm:
      name: fpfc
      wrap: [{kind: attack, attack: sign_flip, malicious_fraction: 0.4, attacker_view: own}]

and Python composes it like any wrapper: ``Attack(FedAvg(cfg, problem), attack="gaussian",
malicious_fraction=0.4)``. The metric of the paper is the mean test accuracy of the *benign* devices:
``benign_mask(algo)`` gives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import Tensor

from fedsolve.engine.algorithm import Algorithm
from fedsolve.engine.wrappers import AttackSurface, Wrapper, register_wrapper

PAPER_SIGMA = {"same_value": 100.0, "sign_flip": 10.0, "gaussian": 100.0}
AttackKind = Literal["none", "same_value", "sign_flip", "gaussian"]
#: the wrapper's own server-state keys (the inner solver never sees them)
OWN, HAS_OWN = "attack.own", "attack.has_own"


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
    n_bad = round(fraction * m)
    perm = np.random.default_rng(seed).permutation(m)
    mask = torch.zeros(m, dtype=torch.bool)
    mask[torch.as_tensor(perm[:n_bad], dtype=torch.long)] = True
    return mask


def benign_mask(algo: Algorithm) -> Tensor:
    """``[m]``: True for the devices that are not malicious (every device of an algorithm under no attack)."""
    return ~getattr(algo, "malicious", torch.zeros(algo.num_clients, dtype=torch.bool))


def attack_surface(algo: Algorithm | type[Algorithm]) -> AttackSurface | None:
    """The attack surface a solver (class or instance, wrapped or not) declares; None: it declares none."""
    return getattr(algo, "attack_surface", None)


class AttackConfig(BaseModel):
    """The settings of the ``attack`` wrapper."""

    model_config = ConfigDict(extra="forbid")
    attack: AttackKind = Field("none", description="Byzantine attack of the malicious devices' uploads")
    malicious_fraction: float = Field(
        0.0, ge=0, le=1, description="share of malicious devices (paper: 0, 0.2, 0.4, 0.6, 0.8)"
    )
    attack_sigma: float | None = Field(
        None, gt=0, description="noise level sigma; null = the paper's (100 same-value, 10 sign-flip, 100 gaussian)"
    )
    attack_seed: int = Field(0, ge=0, description="seed of the malicious set and of the attack draws")
    attack_keys: tuple[str, ...] | None = Field(
        None, description="upload keys that are corrupted (null: the solver's declared model key)"
    )
    attack_block: str | None = Field(
        None,
        description="corrupt only this named parameter block of the uploads (e.g. 'fused', the CNN's "
        "last layer: the paper attacks the personalization layers); null = all of it",
    )
    attacker_view: Literal["server", "own"] = Field(
        "server",
        description="what a malicious device trains from: the server's message (the protocol) or "
        "its own last true model (see the module docstring)",
    )


class Attack(Wrapper):
    """``inner`` under attack: every function is ``inner``'s, except that ``broadcast`` gives an attacker that
    ignores the server its own view and ``aggregate`` corrupts the malicious participants' declared upload keys
    before ``inner``'s aggregation (see the module docstring).

    ``Attack(FPFC(cfg, problem), attack="sign_flip", malicious_fraction=0.4)``."""

    def __init__(self, inner: Algorithm, attack: AttackConfig | Mapping[str, Any] | str | None = None, **kw):
        if isinstance(attack, str) or attack is None:
            attack = AttackConfig(**({"attack": attack} if attack else {}), **kw)
        elif not isinstance(attack, AttackConfig):
            attack = AttackConfig(**dict(attack), **kw)
        super().__init__(inner)
        self.attack_cfg = attack
        self.description = f"{inner.description} -- under a Byzantine model-update attack (FPFC Sec. 6.4.1)"
        self._setup_attack()

    def setup(self) -> None:
        super().setup()
        if "attack_cfg" in vars(self):
            self._setup_attack()

    def _setup_attack(self) -> None:
        c = self.attack_cfg
        self.malicious = malicious_set(self.num_clients, c.malicious_fraction, c.attack_seed)
        self.sigma = c.attack_sigma if c.attack_sigma is not None else PAPER_SIGMA.get(c.attack, 0.0)
        self.attack_cols: slice | Tensor = slice(None)  # the coordinates an attack corrupts
        if c.attack_block is not None:
            if not self.layout.has_block(c.attack_block):
                raise ValueError(
                    f"wrap.attack.attack_block: the model has no block {c.attack_block!r}; allowed: "
                    f"{self.layout.block_names()} or null (the whole upload)"
                )
            self.attack_cols = torch.nonzero(self.layout.mask(c.attack_block)).flatten()
        surface = attack_surface(self.inner)
        if surface is None:
            raise ValueError(
                f"wrap.attack: {self.name} declares no attack surface (the upload key of its model); "
                f"allowed: a solver that declares attack_surface"
            )
        self.surface = surface
        self.attack_keys = c.attack_keys if c.attack_keys is not None else ((surface.model,) if surface.model else ())
        if c.attacker_view == "own" and surface.model is not None:  # no uploads (LOCAL): immune, nothing to view
            if surface.view is None:
                raise ValueError(
                    f"wrap.attack.attacker_view: 'own' is not defined for {self.name} (it declares no "
                    f"message key a device could fill with its own model); allowed: 'server'"
                )
            if self.attack_keys != (surface.model,):
                raise ValueError(
                    f"wrap.attack.attacker_view: 'own' needs the uploaded model {surface.model!r} as "
                    f"the attacked key ({self.name}: attack_keys {list(self.attack_keys)}); allowed: "
                    f"'server', or attack_keys null"
                )

    @property
    def own_view(self) -> bool:
        """Malicious devices train from their own last true model (``attacker_view: own``, and a model to view)."""
        return self.attack_cfg.attacker_view == "own" and self.surface.model is not None

    # ----------------------------------------------------------- the functions
    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        if self.own_view:  # kept in the server record, so checkpoints carry it
            server = dict(
                server,
                **{
                    OWN: torch.zeros(self.num_clients, x0.numel(), dtype=x0.dtype),
                    HAS_OWN: torch.zeros(self.num_clients, dtype=torch.bool),
                },
            )
        return server, clients

    def broadcast(self, server, ids, round_):
        msg = self.inner.broadcast(_inner_server(server), ids, round_)
        if round_ is not None and self.own_view:
            sel = self.malicious[ids] & server[HAS_OWN][ids]
            if bool(sel.any()):
                msg = self._view(msg, sel, server[OWN][ids[sel]])
        return msg

    def _view(self, msg: dict, sel: Tensor, own: Tensor) -> dict:
        """``msg`` with the rows ``sel`` of the declared view key filled with the devices' own models ``own``
        ``[k_sel, d]`` (their declared coordinates, repeated over any middle dimension, e.g. IFCA's L models)."""
        key, cols = self.surface.view, self.surface.view_columns
        assert key is not None, "attacker_view 'own' is refused in setup for a solver that declares no view key"
        val = own if cols is None else own[:, getattr(self.inner, cols)]
        rows = msg[key].clone()
        shape = rows[sel].shape
        rows[sel] = val.reshape(val.shape[0], *([1] * (rows.dim() - 2)), val.shape[-1]).expand(shape).to(rows.dtype)
        return dict(msg, **{key: rows})

    def aggregate(self, server, ids, uploads, round_):
        c = self.attack_cfg
        bad = self.malicious[ids]
        keep = {k: server[k] for k in (OWN, HAS_OWN) if k in server}
        if c.attack != "none" and bool(bad.any()) and uploads:  # LOCAL uploads nothing
            gen = torch.Generator().manual_seed(c.attack_seed * 1_000_003 + int(round_))
            uploads = dict(uploads)
            if keep:  # remember the true uploads before they are corrupted
                keep[OWN][ids[bad]] = uploads[self.surface.model][bad].to(keep[OWN].dtype)
                keep[HAS_OWN][ids[bad]] = True
            for key in self.attack_keys:
                if key not in uploads:
                    raise ValueError(f"wrap.attack.attack_keys: {self.name} uploads {sorted(uploads)}, not {key!r}")
                rows = uploads[key].clone()
                sub = rows[bad].reshape(int(bad.sum()), -1)
                sub[:, self.attack_cols] = attack_rows(sub[:, self.attack_cols], c.attack, self.sigma, gen)
                rows[bad] = sub.reshape(rows[bad].shape)
                uploads[key] = rows
        out = self.inner.aggregate(_inner_server(server), ids, uploads, round_)
        return dict(out, **keep) if keep else out

    def report(self, server, clients, final: bool = False):
        out = dict(self.inner.report(_inner_server(server), clients, final))
        if not final:
            out["malicious"] = float(self.malicious.sum())
        return out


def _inner_server(server: dict) -> dict:
    """The server record without the wrapper's own keys (the inner solver never sees them)."""
    if OWN not in server:
        return server
    return {k: v for k, v in server.items() if k not in (OWN, HAS_OWN)}


@register_wrapper(
    "attack",
    "Byzantine model-update attack on a share of devices' uploads (FPFC Sec. 6.4.1): same_value, sign_flip, gaussian",
)
def _attack(inner: Algorithm, params: dict[str, Any]) -> Attack:
    try:
        cfg = AttackConfig(**params)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(
            f"wrap.attack.{'.'.join(str(x) for x in err['loc'])}: {err['msg']} (got {err.get('input')!r})"
        ) from None
    return Attack(inner, cfg)
