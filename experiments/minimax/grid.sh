#!/usr/bin/env bash
# FedMM Tables 1/2 analogue: the three-domain grid (experiments/minimax/grid.yaml), both regimes.
# Usage: bash experiments/minimax/grid.sh [OUT] [LOSSES] [PAIRS] [ROUNDS]
#   OUT     output root (default runs/minimax/grid); each run in OUT/<regime>/<loss>/<source>_<target>
#   LOSSES  e.g. "dann cdan mdd" (default: all three)
#   PAIRS   e.g. "mnist:mnistm digits:mnist" (default: all six ordered pairs)
#   ROUNDS  communication rounds (default 100)
# Per loss: FedMM's eta3 = 1/1.0005 (DANN), 1/1.0002 (CDAN), 1/1.0001 (MDD); pretrained eta_2 = 0.04 (DANN),
# 0.1 (CDAN, MDD), nu and the 20x smaller feature step from the problem kind's pretrained defaults (spec 2.5).
# Finished runs are skipped (a folder with summary.json), so an interrupted grid picks up where it stopped.
set -euo pipefail
OUT=${1:-runs/minimax/grid}
LOSSES=${2:-"dann cdan mdd"}
PAIRS=${3:-"mnist:mnistm mnistm:mnist mnist:digits digits:mnist mnistm:digits digits:mnistm"}
ROUNDS=${4:-100}
export OMP_NUM_THREADS=1
declare -A ETA3=([dann]=0.9995002 [cdan]=0.9998000 [mdd]=0.9999000)
declare -A PSI_PRE=([dann]=0.04 [cdan]=0.1 [mdd]=0.1)
HERE=$(dirname "$0")
for loss in $LOSSES; do
  for pair in $PAIRS; do
    src=${pair%%:*}; tgt=${pair##*:}
    for regime in scratch pretrained; do
      psi=0.01; [ "$regime" = pretrained ] && psi=${PSI_PRE[$loss]}
      common=(--set data.params.source="$src" --set data.params.target="$tgt" --set problem.params.loss="$loss"
              --set problem.params.regime="$regime" --set defaults.lr_psi="$psi" --set simulation.rounds="$ROUNDS"
              --quiet --jobs 1)
      dir="$OUT/$regime/$loss/${src}_${tgt}"
      if [ ! -f "$dir/summary.json" ]; then
        fedsolve compare "$HERE/grid.yaml" "${common[@]}" --set "algorithms.0.params.eta3=${ETA3[$loss]}" \
          --out "$dir" --overwrite
      fi
      if [ ! -f "$dir/central/summary.json" ]; then
        fedsolve compare "$HERE/grid_centralized.yaml" "${common[@]}" --out "$dir/central" --overwrite
      fi
    done
  done
done
