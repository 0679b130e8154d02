"""Wrappers: behaviour added to ANY solver by composition, never by registering copies of it.

A wrapper is an :class:`~fedsolve.engine.algorithm.Algorithm` that holds another (``inner``) and passes every
function on to it, changing only what it is about: an attack corrupts some uploads before the inner ``aggregate``,
differential privacy clips the uploads and adds noise to the average (``engine/server.py``), a server optimizer
turns the average into a momentum or Adam step. Wrappers nest (``wrap(wrap(FedAvg, dp), server_opt)``); a config
names them in order under an algorithm's ``wrap:`` list::

    algorithms:
      - name: fedavg
        params: {lr: 0.05}
        wrap:
          - {kind: dp, clip: 1.0, noise_multiplier: 0.5}
          - {kind: server_opt, optimizer: adam, lr: 0.01}

:func:`register_wrapper` adds a kind (families register theirs, e.g. the Byzantine attacks); ``fedsolve list``
shows them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedsolve.engine.algorithm import Algorithm

#: kind -> (build(inner, params) -> wrapped algorithm, one-line description)
WRAPPERS: dict[str, tuple[Callable[[Algorithm, dict[str, Any]], Algorithm], str]] = {}


def register_wrapper(kind: str, description: str):
    """Decorator: register ``build(inner, params) -> Algorithm`` as wrapper ``kind``."""

    def deco(build):
        if kind in WRAPPERS and WRAPPERS[kind][0] is not build:
            raise ValueError(f"wrapper {kind!r} registered twice")
        WRAPPERS[kind] = (build, description)
        return build

    return deco


def wrap(algo: Algorithm, specs: Sequence[Mapping[str, Any]] | None) -> Algorithm:
    """``algo`` wrapped by each of ``specs`` in turn (``{kind: <name>, ...params}``)."""
    for i, spec in enumerate(specs or []):
        spec = dict(spec)
        kind = spec.pop("kind", None)
        if kind not in WRAPPERS:
            raise ValueError(f"wrap[{i}].kind: unknown {kind!r}; allowed: {sorted(WRAPPERS)}")
        algo = WRAPPERS[kind][0](algo, spec)
    return algo


@dataclass(frozen=True)
class AttackSurface:
    """What a solver declares (class attribute ``attack_surface``) for attacks on its uploads (e.g. the ``attack``
    wrapper of the clustered family): ``model``, the upload key that holds a client's model (None: it uploads no
    model); ``view``, the message key that a client which ignores the server fills with its own model (None: not
    defined); ``view_columns``, the name of the solver's index attribute listing the model coordinates that key
    carries (None: the whole model)."""

    model: str | None
    view: str | None = None
    view_columns: str | None = None


class Wrapper(Algorithm):
    """An algorithm that passes every function on to ``inner`` (override what the wrapper changes). Its name,
    config, declarations and problem are the inner algorithm's; attributes it does not have are looked up on
    ``inner`` (e.g. a family's helper methods). ``cfg`` and ``client_weights`` are the inner algorithm's own, so
    ``Simulation.set_hparams`` and a move to a GPU reach it."""

    def __init__(self, inner: Algorithm):
        self.inner = inner
        self.problem = inner.problem
        self.layout = inner.layout
        self.num_clients = inner.num_clients
        for attr in (
            "name",
            "description",
            "Config",
            "communicates",
            "reports_train_loss",
            "watch",
            "finite_check_keys",
            "averages",
            "phases",
        ):  # per instance: the declarations of `inner`
            setattr(self, attr, getattr(inner, attr))

    def __getattr__(self, attr: str):
        if attr == "inner":  # not yet set (e.g. while unpickling)
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def cfg(self):
        return self.inner.cfg

    @cfg.setter
    def cfg(self, value) -> None:
        self.inner.cfg = value

    @property
    def client_weights(self):
        return self.inner.client_weights

    @client_weights.setter
    def client_weights(self, value) -> None:
        self.inner.client_weights = value

    @property
    def kernel(self) -> str:
        return self.inner.kernel

    @kernel.setter
    def kernel(self, value: str) -> None:
        self.inner.kernel = value

    @property
    def sampling(self):
        return self.inner.sampling

    @sampling.setter
    def sampling(self, value) -> None:
        self.inner.sampling = value

    def setup(self) -> None:
        if "inner" in vars(self):
            self.inner.setup()

    def init(self, x0, rngs):
        return self.inner.init(x0, rngs)

    def broadcast(self, server, ids, round_):
        return self.inner.broadcast(server, ids, round_)

    def local_update(self, state, msg, ctx):
        return self.inner.local_update(state, msg, ctx)

    def aggregate(self, server, ids, uploads, round_):
        return self.inner.aggregate(server, ids, uploads, round_)

    def eval_model(self, state, msg):
        return self.inner.eval_model(state, msg)

    def work(self, round_=0):
        return self.inner.work(round_)

    def report(self, server, clients, final: bool = False):
        return self.inner.report(server, clients, final)
