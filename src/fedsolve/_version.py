"""The package's version, written once (pyproject.toml reads it; ``fedsolve.__version__`` re-exports it)."""

__version__ = "0.1.0"
