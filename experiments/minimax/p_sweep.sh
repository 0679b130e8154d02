#!/usr/bin/env bash
# FedMM Fig. 2 analogue: the p sweep (experiments/minimax/p_sweep_<loss>.yaml), one process at a time.
# Usage: bash experiments/minimax/p_sweep.sh [OUT] [LOSSES] [PS] [SEED]
#   OUT     output root (default runs/minimax); each run in OUT/p_sweep_<loss>[_s<SEED>]/p<p>
#   LOSSES  e.g. "dann mdd" (default: "cdan dann mdd")
#   PS      source/target splits p (default "0.5 0.8 1.0"; the paper's figure: 0.5 ... 1.0)
#   SEED    seed (default 0; another seed goes to its own folder, OUT/p_sweep_<loss>_s<SEED>/p<p>)
# Finished runs are skipped (a folder with summary.json), so an interrupted sweep picks up where it stopped.
set -euo pipefail
OUT=${1:-runs/minimax}
LOSSES=${2:-"cdan dann mdd"}
PS=${3:-"0.5 0.8 1.0"}
SEED=${4:-0}
export OMP_NUM_THREADS=1
HERE=$(dirname "$0")
for loss in $LOSSES; do
  suffix=""; [ "$SEED" != 0 ] && suffix="_s$SEED"
  for p in $PS; do
    dir="$OUT/p_sweep_$loss$suffix/p$p"
    if [ ! -f "$dir/summary.json" ]; then
      fedsolve compare "$HERE/p_sweep_$loss.yaml" --set data.params.p="$p" --set "seeds=[$SEED]" \
        --set name="minimax_p_sweep_${loss}_p$p" --quiet --jobs 1 --out "$dir" --overwrite
    fi
  done
done
