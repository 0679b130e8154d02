"""fedsolve on Flower: the same Algorithm as a Flower ServerApp + ClientApp (optional extra).

    pip install -e '.[flower]'        # in the checkout (or the built wheel with [flower]): flwr==1.42.0

* ``fedsolve.flower.app:server_app`` / ``:client_app`` -- the apps a Flower app folder names
  (``python -m fedsolve.flower new-app DIR --experiment exp.yaml`` writes one);
* :func:`build_server_app`, :func:`build_client_app` -- the same, as factories;
* :func:`simulate_with_participation` -- the simulation a deployment must match, given which
  clients actually answered in each round;
* :mod:`fedsolve.flower.security` -- TLS certificates and SuperNode keys;
  :mod:`fedsolve.flower.launch` -- a loopback SuperLink + SuperNodes for tests and demos.

See docs/deployment.md.
"""

from __future__ import annotations

from typing import Any

from fedsolve.flower.task import RUN_CONFIG_DEFAULTS, DeploymentTask, FlowerUnsupportedError, check_supported, load_task

_NEED_FLWR = {
    "build_server_app": "fedsolve.flower.server",
    "build_client_app": "fedsolve.flower.client",
    "FlowerRun": "fedsolve.flower.server",
}
_OTHER = {"simulate_with_participation": "fedsolve.flower.replay", "write_app": "fedsolve.flower.appdir"}


def flwr_available() -> bool:
    try:
        import flwr  # noqa: F401
    except ImportError:
        return False
    return True


def __getattr__(name: str) -> Any:
    import importlib

    if name in _NEED_FLWR:
        if not flwr_available():
            raise ImportError(
                f"fedsolve.flower.{name} needs Flower: pip install -e '.[flower]' in the fedsolve "
                f"checkout (flwr==1.42.0)"
            )
        return getattr(importlib.import_module(_NEED_FLWR[name]), name)
    if name in _OTHER:
        return getattr(importlib.import_module(_OTHER[name]), name)
    raise AttributeError(f"module 'fedsolve.flower' has no attribute {name!r}")


__all__ = [
    "RUN_CONFIG_DEFAULTS",
    "DeploymentTask",
    "FlowerUnsupportedError",
    "check_supported",
    "load_task",
    "build_server_app",
    "build_client_app",
    "simulate_with_participation",
    "write_app",
    "flwr_available",
]
