#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch==2.13.0 (CPU wheel) installed FIRST,
# then fedsolve and its extras. Usage: bash scripts/setup.sh [extras]   (default extras: test)
# On a fresh machine this takes a few minutes (mostly the torch wheel); when everything is in place,
# about a second. Each step says what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
PY="${PYTHON:-python3}"
say() { echo "[setup] $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating the virtual environment .venv ($("$PY" --version 2>&1))"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# torch first, pinned: pip finds the local CPU wheel for exactly this version; an unpinned torch
# would pull several GB of CUDA packages.
if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  say "installing torch 2.13.0 (CPU wheel, about 200 MB; the longest step, 1-3 minutes)"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
STAMP=".venv/.fedsolve-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  say "installing fedsolve and its extras [$EXTRAS] (about a minute)"
  "$VPY" -m pip install -q -e ".[$EXTRAS]"
  touch "$STAMP"
fi
say "ready: $("$VPY" -m fedsolve.cli --version)"
