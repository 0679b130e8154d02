"""Write a Flower app folder (``pyproject.toml``) that runs a fedsolve task.

The app declares NO Python dependencies on purpose: the SuperLink and SuperNodes run in an
environment where ``fedsolve[flower]`` and torch are already installed, and the SuperLink is
started with ``--disable-runtime-dependency-installation`` (SuperNodes do not install by
default), so ``flwr run`` never runs ``uv sync`` and never fetches torch (or anything else)
from the network. The app's code is fedsolve itself (``fedsolve.flower.app``); extra files in
the folder (an experiment YAML, a task module) travel inside the FAB to every machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fedsolve.flower.task import RUN_CONFIG_DEFAULTS


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def write_app(
    app_dir: str | Path,
    *,
    name: str = "fedsolve-app",
    experiment: str | Path | None = None,
    copy_experiment: bool = True,
    **run_config: Any,
) -> Path:
    """Create ``app_dir/pyproject.toml`` (and copy the experiment YAML into it); returns the folder.

    ``run_config`` keys use underscores or dashes (``round_timeout=60`` == ``round-timeout``).
    """
    app = Path(app_dir)
    app.mkdir(parents=True, exist_ok=True)
    cfg = dict(RUN_CONFIG_DEFAULTS)
    for k, v in run_config.items():
        k2 = k.replace("_", "-")
        if k2 not in cfg:
            raise ValueError(f"run config: unknown key {k2!r}; allowed: {sorted(cfg)}")
        cfg[k2] = v
    if experiment is not None:
        exp = Path(experiment)
        if copy_experiment:
            shutil.copyfile(exp, app / exp.name)
            cfg["experiment"] = exp.name
        else:
            cfg["experiment"] = str(exp.resolve())
    lines = [
        "# A Flower app running a fedsolve task (written by `python -m fedsolve.flower new-app`).",
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f'name = "{name}"',
        'version = "1.0.0"',
        'description = "fedsolve task on the Flower deployment runtime"',
        'license = "Apache-2.0"',
        "# No dependencies: SuperLink/SuperNodes use the environment where fedsolve[flower] and torch",
        "# are installed (SuperLink: --disable-runtime-dependency-installation), so nothing is fetched.",
        "dependencies = []",
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "fedsolve"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "fedsolve.flower.app:server_app"',
        'clientapp = "fedsolve.flower.app:client_app"',
        "",
        "[tool.flwr.app.config]",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in cfg.items()]
    (app / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return app
