#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch==2.13.0 (CPU wheel) installed FIRST,
# then fedsolve and its extras. Usage: bash scripts/setup.sh [extras]   (default extras: test)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# torch first, pinned: pip finds the local CPU wheel for exactly this version; an unpinned torch
# would pull several GB of CUDA packages.
if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  "$VPY" -m pip install -q "torch==2.13.0"
fi
STAMP=".venv/.fedsolve-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  "$VPY" -m pip install -q -e ".[$EXTRAS]"
  touch "$STAMP"
fi
