#!/usr/bin/env bash
# Optional environment for the peer benchmarks (benchmarks/peers/): Flower's simulation engine and Apple's
# pfl-research, in a virtual environment of their own (benchmarks/peers/.venv, git-ignored) so that the
# project's own dependencies stay lean. torch==2.13.0 (the CPU wheel, as in scripts/setup.sh) is installed
# FIRST, then the peers, so that pip keeps that torch and pulls no CUDA packages.
# Usage: bash scripts/setup_peers.sh        (idempotent; a few minutes on a fresh machine, about a second after)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${FEDSOLVE_PEERS_VENV:-benchmarks/peers/.venv}"
say() { echo "[setup_peers] $*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment $VENV ($("$PY" --version 2>&1))"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  say "installing torch 2.13.0 (CPU wheel) first"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
# the peers, with the versions the figures in docs/performance.md were measured with; torch stays pinned
PEERS=("flwr[simulation]==1.42.0" "pfl[pytorch]==0.6.0")
STAMP="$VENV/.peers-installed"
if [ ! -f "$STAMP" ] || [ "$0" -nt "$STAMP" ]; then
  say "installing ${PEERS[*]} (torch kept at 2.13.0)"
  "$VPY" -m pip install -q "torch==2.13.0" "${PEERS[@]}"
  touch "$STAMP"
fi
say "ready: $("$VPY" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "flwr", "ray", "pfl", "numpy")))')"
