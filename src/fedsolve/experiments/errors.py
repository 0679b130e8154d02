"""The error a bad experiment input raises: one line naming the field (or file) and what is allowed. The CLI turns
it into that line and exit status 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config problem, naming the field and what is allowed."""
