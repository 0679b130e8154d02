"""Example experiment configs shipped inside the package, so an installed fedsolve (a wheel, no checkout) can run
them: ``fedsolve examples`` prints their paths, ``fedsolve examples demo`` the path of one.

The files are copies of the checkout's ``experiments/demo.yaml`` and ``examples/*.yaml`` (with the plugin module a
config needs, ``my_fedavgm.py``: run that config with ``fedsolve --import <its path> run ...``); a test keeps the
copies identical to those originals.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).parent


def example_files() -> dict[str, Path]:
    """Every shipped example by name: a config by its stem (``demo``), another file by its file name
    (``my_fedavgm.py``)."""
    files = sorted(p for p in FOLDER.iterdir() if p.suffix in (".yaml", ".py") and p.name != "__init__.py")
    return {p.stem if p.suffix == ".yaml" else p.name: p for p in files}


def example_path(name: str) -> Path:
    """The path of the shipped example ``name`` (a config's stem, ``demo`` or ``demo.yaml``, or a file name);
    ``ValueError`` naming the allowed names otherwise."""
    files = example_files()
    key = name.removesuffix(".yaml")
    if key not in files:
        raise ValueError(f"examples: no example named {name!r}; allowed: {', '.join(files)}")
    return files[key]
