"""Import paths: ``"package.module:attribute"`` names any Python object a config builds from.

A config names a model factory (``model.target``), a data builder (``data.target``) or a sample transform
(``data.sample_transform.target``) by such a path, so that the saved ``config.yaml`` of a run re-runs as it
is, without ``--import``. The module is looked up on ``sys.path`` and, like ``python -m``, in the current
folder; the attribute may be dotted (``module:Class.method``).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _error(field: str | None, msg: str) -> ValueError:
    return ValueError(f"{field}: {msg}" if field else msg)


def check_target(path: str, field: str | None = None) -> None:
    """Raise ``ValueError`` (naming ``field``, when given) unless ``path`` has the form
    ``package.module:attribute``."""
    if not isinstance(path, str) or not _PATH.match(path):
        raise _error(
            field,
            f"{path!r} is not an import path; allowed: 'package.module:attribute' (a module on "
            f"the Python path or in the current folder, a colon, a name in it)",
        )


def resolve_target(path: str, field: str | None = None) -> Any:
    """The object ``path`` (``"package.module:attribute"``) names; ``ValueError`` (naming ``field``, when given)
    when the path is malformed, its module cannot be found or imported, or it has no such attribute."""
    check_target(path, field)
    mod_name, attr = path.split(":")
    try:
        module = _import(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise _error(
                field,
                f"no module named {e.name!r} for {path!r} (looked on the Python path and in the "
                f"current folder); allowed: an importable module",
            ) from None
        raise _error(field, f"importing {mod_name!r} failed: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001  (the user's module raised while being imported)
        raise _error(field, f"importing {mod_name!r} failed: {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise _error(field, f"{mod_name!r} has no attribute {attr!r}; allowed: names it defines, e.g. {public}")
        obj = getattr(obj, part)
    return obj


def _import(name: str):
    """``importlib.import_module`` that also looks in the current folder (as ``python -m`` does)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        top = name.split(".")[0]
        cwd = os.getcwd()
        if e.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, cwd)
        return importlib.import_module(name)


def call_target(
    fn: Callable[..., Any], params: dict[str, Any], field: str, path: str, fill: dict[str, Any] | None = None
) -> Any:
    """``fn(**params)``, with the entries of ``fill`` added for the parameters ``fn`` takes by those names and
    ``params`` does not set (e.g. ``seed``, ``out_dim``). A parameter ``fn`` does not take (named as the
    ``params`` beside ``field``: ``model.target`` -> ``model.params``), or an exception raised by ``fn``,
    becomes one ``ValueError`` naming the field and ``path``."""
    if not callable(fn):
        raise ValueError(f"{field}: {path!r} is a {type(fn).__name__}, not a function or class; allowed: a callable")
    params = dict(params)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: call with the params as given
        sig = None
    if sig is not None:
        ps = sig.parameters
        has_var = any(p.kind is p.VAR_KEYWORD for p in ps.values())
        named = [n for n, p in ps.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        bad = sorted(k for k in params if k not in named and not has_var)
        if bad:
            where = f"{field.rsplit('.', 1)[0]}.params" if "." in field else field
            raise ValueError(f"{where}: {path!r} takes no parameter(s) {bad}; allowed: {named}")
        for k, v in (fill or {}).items():
            if k in named and k not in params:
                params[k] = v
    try:
        return fn(**params)
    except Exception as e:  # noqa: BLE001  (the user's function raised: one line naming the field)
        msg = " ".join(str(e).split())
        raise ValueError(f"{field}: {path}({_show(params)}) raised {type(e).__name__}: {msg}") from None


def _show(params: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return text if len(text) <= 120 else text[:117] + "..."
