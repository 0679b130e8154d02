#!/usr/bin/env bash
# Set up (if needed) and run the demo comparison; the report lands in runs/demo/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# a second run of the demo starts it over (pass --resume to continue an interrupted one instead)
fresh=(--overwrite)
for a in "$@"; do [ "$a" = --resume ] && fresh=(); done
.venv/bin/fedsolve compare experiments/demo.yaml --out runs/demo "${fresh[@]}" "$@"
echo "open runs/demo/report.md (plots in runs/demo/plots/)"
