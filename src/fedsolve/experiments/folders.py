"""Where a run's files go and how to read them back (shared by the runner and the reports).

Run folder ``<out>/<label>/seed<k>/``: ``config.yaml`` (resolved), ``metrics.jsonl`` (one JSON record per
evaluated round, numbers only), ``timings.jsonl`` (``{"round", "time_s"}`` per evaluation), ``summary.json``,
``per_client.json``, ``checkpoint.pt``, ``report.md`` and ``plots/``. The logs are read back from ``metrics.jsonl.gz``
where only the compressed copy is kept.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def slug(s: str) -> str:
    """``s`` as a folder name: every character that is not alphanumeric or ``-_.`` replaced by ``_``, and a
    leading ``.`` too, so that a label never names a hidden folder, ``.`` or ``..`` (it stays inside ``--out``).
    Two labels with one folder name are refused where a config lists them
    (:func:`fedsolve.experiments.records.label_clash`)."""
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in s)
    return "_" + out[1:] if out.startswith(".") else out or "_"


def default_run_dir(cfg, spec, seed: int, out: str | Path | None = None) -> Path:
    """``<out>/<label>/seed<seed>`` (``out`` default: ``<cfg.out_dir>/<cfg.name>``)."""
    base = Path(out) if out is not None else Path(cfg.out_dir) / cfg.name
    return base / slug(spec.display) / f"seed{seed}"


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a ``.jsonl`` file, or of its gzipped copy ``<path>.gz`` where only that exists (per-round logs
    kept compressed in ``results/``); ``[]`` when neither exists. A broken file (a line that is not a JSON
    record, a truncated ``.gz``) is a ``ConfigError`` naming the file and the line."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    from fedsolve.experiments.errors import ConfigError

    src = packed if not path.exists() and packed.exists() else path
    try:
        if src is packed:
            text = gzip.decompress(packed.read_bytes()).decode()
        elif path.exists():
            text = path.read_text()
        else:
            return []
    except (OSError, EOFError, UnicodeDecodeError) as e:  # a truncated or foreign .gz, bytes that are not text
        raise ConfigError(f"{src}: unreadable ({e}); allowed: the file as fedsolve wrote it") from None
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"{src}: line {i} is not valid JSON ({e.msg}); allowed: the file as fedsolve wrote it"
                ) from None
            if not isinstance(records[-1], dict):
                raise ConfigError(f"{src}: line {i} is not a record ({{...}}); allowed: the file as fedsolve wrote it")
    return records
