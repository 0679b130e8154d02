"""Module-level Flower apps for ``[tool.flwr.app.components]`` of a fedsolve Flower app:

    serverapp = "fedsolve.flower.app:server_app"
    clientapp = "fedsolve.flower.app:client_app"

(An importable module, not ``__main__``, so Flower never pickles the apps by value.)
"""

from fedsolve.flower.client import build_client_app
from fedsolve.flower.server import build_server_app

server_app = build_server_app()
client_app = build_client_app()
