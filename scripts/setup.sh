#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with torch installed FIRST, then fedsolve and its
# extras. Usage: bash scripts/setup.sh [extras]   (default extras: test)
# A torch already in .venv is kept (to use a CUDA or another CPU build, create .venv and install it
# before running this; see README, "Install elsewhere"); without one, torch==2.13.0 is installed.
# On a fresh machine this takes a few minutes (mostly the torch wheel); when everything is in place,
# about a second. Each step says what it does, and a long one says every 15 s that it is still at work
# (pip itself is quiet: -q).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
PY="${PYTHON:-python3}"
say() { echo "[setup] $*" >&2; }
TICKER=""
trap '[ -z "$TICKER" ] || kill "$TICKER" 2>/dev/null' EXIT
# ticking WHAT CMD...: run CMD; every 15 s while it runs, say that WHAT is still at work and for how long
ticking() {
  local what=$1 rc=0
  shift
  ( s=0; while sleep 15 </dev/null >/dev/null 2>&1; do s=$((s + 15)); say "  ... $what: still at work (${s} s)"; done ) &
  TICKER=$!
  "$@" || rc=$?
  kill "$TICKER" 2>/dev/null || true
  wait "$TICKER" 2>/dev/null || true
  TICKER=""
  return "$rc"
}
if [ ! -x .venv/bin/python ]; then
  say "creating the virtual environment .venv ($("$PY" --version 2>&1))"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# torch first, pinned: where the configured index holds the CPU wheel of exactly this version pip takes it;
# an unpinned torch would pull several GB of CUDA packages. fedsolve then keeps whatever torch >= 2.1 is there.
if TORCH_VERSION=$("$VPY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
  say "keeping the installed torch $TORCH_VERSION"
else
  say "installing torch 2.13.0 (about 200 MB for the CPU wheel; the longest step, 1-3 minutes)"
  ticking "installing torch (downloading, then unpacking about 750 MB)" "$VPY" -m pip install -q "torch==2.13.0"
fi
STAMP=".venv/.fedsolve-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  say "installing fedsolve and its extras [$EXTRAS] (about a minute)"
  ticking "installing fedsolve [$EXTRAS] (resolving, downloading, then installing)" \
    "$VPY" -m pip install -q -e ".[$EXTRAS]"
  touch "$STAMP"
fi
say "ready: $("$VPY" -m fedsolve.cli --version)"
