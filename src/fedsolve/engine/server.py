"""Server pieces in the optax style, and the two wrappers built from them: server optimizers and DP.

A piece is two pure functions, ``init(params) -> state`` and ``update(delta, state, params) -> (delta, state)``,
acting on the server's *update* ``delta`` = (the inner solver's new global model) - (the old one); pieces
``chain`` like optax transformations. Any solver that averages (its ``averages`` declaration names the global model
and how uploads relate to it: FedAvg, FedProx, SCAFFOLD, ...) gets them by composition:

* :class:`ServerOptimizer` (wrapper ``server_opt``): ``w <- w + chain(...)(delta)``:
  FedAvgM (Hsu et al. 2019): ``v <- beta v + delta; w <- w + eta v``   (``optimizer: momentum``);
  FedAdam / FedYogi / FedAdagrad (Reddi et al. 2021, Alg. 2): ``m <- b1 m + (1 - b1) delta``;
  ``v <- b2 v + (1 - b2) delta^2`` (Adam), ``v <- v - (1 - b2) delta^2 sign(v - delta^2)`` (Yogi),
  ``v <- v + delta^2`` (Adagrad); ``w <- w + eta m / (sqrt(v) + tau)`` (no bias correction, as in the paper);
  an optional ``clip`` bounds the norm of ``delta`` first.
* :class:`DifferentialPrivacy` (wrapper ``dp``): DP-FedAvg's clipping and Gaussian noise (McMahan et al. 2018):
  each participant's update (its model minus the global one, or its uploaded change) is clipped to norm ``C``
  before the inner solver averages, and ``N(0, (z C s)^2 I)`` is added to the average, ``s`` the largest weight
  share of a participant (``1/k`` for a uniform mean): the change one client can make to the average is at most
  ``C s``. The privacy budget (epsilon) is not computed here: use an accountant with ``z``, the sampling rate and
  the number of rounds.

The pieces' state lives in the server state under ``opt.*`` / ``dp.*`` keys, so it is checkpointed and resumed
with the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import Tensor

from fedsolve.engine.algorithm import Averages
from fedsolve.engine.wrappers import Wrapper, register_wrapper

_Model = TypeVar("_Model", bound=BaseModel)

Record = dict[str, Tensor]


@dataclass(frozen=True)
class Piece:
    """``init(params) -> state`` and ``update(delta, state, params) -> (delta, state)``."""

    init: Callable[[Tensor], Record]
    update: Callable[[Tensor, Record, Tensor], tuple[Tensor, Record]]


def chain(*pieces: Piece) -> Piece:
    """The pieces applied in order, each with its own state (``"<i>.<name>"`` keys)."""

    def init(params):
        return {f"{i}.{k}": v for i, p in enumerate(pieces) for k, v in p.init(params).items()}

    def update(delta, state, params):
        out = {}
        for i, p in enumerate(pieces):
            own = {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(f"{i}.")}
            delta, new = p.update(delta, own, params)
            out.update({f"{i}.{k}": v for k, v in new.items()})
        return delta, out

    return Piece(init, update)


def scale(lr: float) -> Piece:
    return Piece(lambda p: {}, lambda d, s, p: (lr * d, s))


def clip(max_norm: float) -> Piece:
    """``delta`` scaled down to norm ``max_norm`` when it is longer."""

    def update(d, s, p):
        n = float(d.norm())
        return (d * (max_norm / n) if n > max_norm else d), s

    return Piece(lambda p: {}, update)


def momentum(beta: float) -> Piece:
    """Heavy ball: ``v <- beta v + delta``; the update is ``v``."""

    def update(d, s, p):
        v = beta * s["v"] + d
        return v, {"v": v}

    return Piece(lambda p: {"v": torch.zeros_like(p)}, update)


def adaptive(
    kind: Literal["adam", "yogi", "adagrad"],
    b1: float = 0.9,
    b2: float = 0.99,
    tau: float = 1e-3,
    v0: float | None = None,
) -> Piece:
    """Reddi et al. (2021) Alg. 2's server step direction ``m / (sqrt(v) + tau)`` (``v`` starts at ``v0``,
    default ``tau^2``)."""
    start = tau**2 if v0 is None else v0

    def update(d, s, p):
        m = b1 * s["m"] + (1 - b1) * d
        d2 = d * d
        if kind == "adam":
            v = b2 * s["v"] + (1 - b2) * d2
        elif kind == "yogi":
            v = s["v"] - (1 - b2) * d2 * torch.sign(s["v"] - d2)
        else:
            v = s["v"] + d2
        return m / (v.sqrt() + tau), {"m": m, "v": v}

    return Piece(lambda p: {"m": torch.zeros_like(p), "v": torch.full_like(p, start)}, update)


# ------------------------------------------------------------------ the wrappers
def _averaged(inner, what: str) -> Averages:
    if inner.averages is None:
        raise ValueError(
            f"wrap: {what} needs a solver that averages one global model (FedAvg, FedProx, SCAFFOLD, "
            f"...); {inner.name} declares none"
        )
    return inner.averages


def _params(model: type[_Model], params: dict[str, Any], field: str) -> _Model:
    try:
        return model(**params)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"wrap.{field}.{where}: {err['msg']} (got {err.get('input')!r})") from None


class ServerOptConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    optimizer: Literal["momentum", "adam", "yogi", "adagrad", "sgd"] = Field(
        "momentum", description="momentum (FedAvgM), adam (FedAdam), yogi (FedYogi), adagrad (FedAdagrad), sgd"
    )
    lr: float = Field(1.0, gt=0, description="server step size eta")
    beta: float = Field(0.9, ge=0, lt=1, description="momentum beta (FedAvgM)")
    b1: float = Field(0.9, ge=0, lt=1, description="first-moment decay (FedAdam/FedYogi)")
    b2: float = Field(0.99, ge=0, lt=1, description="second-moment decay (FedAdam/FedYogi)")
    tau: float = Field(1e-3, gt=0, description="adaptivity tau (FedAdam/FedYogi/FedAdagrad)")
    clip: float | None = Field(None, gt=0, description="bound on the norm of the averaged update, first")


def server_piece(c: ServerOptConfig) -> Piece:
    pieces = [clip(c.clip)] if c.clip is not None else []
    if c.optimizer == "momentum":
        pieces.append(momentum(c.beta))
    elif c.optimizer in ("adam", "yogi", "adagrad"):
        pieces.append(adaptive(c.optimizer, c.b1, c.b2, c.tau))
    pieces.append(scale(c.lr))
    return chain(*pieces)


class ServerOptimizer(Wrapper):
    """``inner``'s average as the update of a server optimizer (module docstring)."""

    def __init__(self, inner, piece: Piece, label: str = "server_opt"):
        super().__init__(inner)
        self.key = _averaged(inner, label).key
        self.piece = piece

    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        server.update({f"opt.{k}": v for k, v in self.piece.init(server[self.key]).items()})
        return server, clients

    def aggregate(self, server, ids, uploads, round_):
        own = {k: server[k] for k in server if k.startswith("opt.")}
        new = self.inner.aggregate({k: v for k, v in server.items() if k not in own}, ids, uploads, round_)
        w = server[self.key]
        step, state = self.piece.update(new[self.key] - w, {k[4:]: v for k, v in own.items()}, w)
        new = dict(new)
        new[self.key] = w + step
        new.update({f"opt.{k}": v for k, v in state.items()})
        return new


@register_wrapper("server_opt", "a server optimizer on the average: FedAvgM (momentum), FedAdam, FedYogi, FedAdagrad")
def _server_opt(inner, params):
    return ServerOptimizer(inner, server_piece(_params(ServerOptConfig, params, "server_opt")))


class DPConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clip: float = Field(..., gt=0, description="clipping norm C of each participant's update")
    noise_multiplier: float = Field(..., ge=0, description="noise std z, in units of C times the largest weight share")


class DifferentialPrivacy(Wrapper):
    """DP-FedAvg's clipping and Gaussian noise around ``inner`` (module docstring)."""

    def __init__(self, inner, cfg: DPConfig):
        super().__init__(inner)
        self.avg = _averaged(inner, "dp")
        self.key, self.upload, self.kind = self.avg.key, self.avg.upload, self.avg.kind
        self.dp = cfg

    def init(self, x0, rngs):
        server, clients = self.inner.init(x0, rngs)
        server["dp.seed"] = torch.randint(0, 2**62, (1,), generator=rngs.torch("dp_noise"))[0]
        return server, clients

    def aggregate(self, server, ids, uploads, round_):
        w = server[self.key]
        up = uploads[self.upload]
        delta = up - w if self.kind == "model" else up
        norms = delta.reshape(delta.shape[0], -1).norm(dim=1).clamp_min(1e-30)
        factor = (self.dp.clip / norms).clamp(max=1.0).to(delta.dtype)
        clipped = delta * factor.view(-1, *([1] * (delta.dim() - 1)))
        uploads = dict(uploads)
        uploads[self.upload] = w + clipped if self.kind == "model" else clipped
        inner_server = {k: v for k, v in server.items() if k != "dp.seed"}
        new = dict(self.inner.aggregate(inner_server, ids, uploads, round_))
        share = self._largest_share(ids)
        std = self.dp.noise_multiplier * self.dp.clip * share
        gen = torch.Generator().manual_seed(int(server["dp.seed"]) % (2**62) + 1_000_003 * int(round_))
        noise = torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w.dtype).to(w.device)
        new[self.key] = new[self.key] + std * noise
        new["dp.seed"] = server["dp.seed"]
        return new

    def _largest_share(self, ids: Tensor) -> float:
        """The largest weight one participant has in the inner average (its sample share, or ``1/k``)."""
        k = ids.numel()
        if self.avg.weights == "uniform" or not k:
            return 1.0 / max(k, 1)
        w = self.inner.client_weights[ids.cpu()].double()
        return float(w.max() / w.sum())


@register_wrapper("dp", "DP-FedAvg: each participant's update clipped to norm C, Gaussian noise on the average")
def _dp(inner, params):
    return DifferentialPrivacy(inner, _params(DPConfig, params, "dp"))


__all__ = [
    "Piece",
    "chain",
    "scale",
    "clip",
    "momentum",
    "adaptive",
    "ServerOptimizer",
    "DifferentialPrivacy",
    "server_piece",
    "ServerOptConfig",
    "DPConfig",
]
