#!/usr/bin/env bash
# Tables 1 and 2 of paper 002 (results/constrained/README.md) with every n and seed, one run at a time.
#
#   bash experiments/constrained/tables.sh            # run what is missing, then print both tables
#   DRY=1 bash experiments/constrained/tables.sh      # only list the missing runs
#
# One `fedsolve compare --only LABEL` per (dataset, n, seed, method) into runs/constrained/<tag>_n<N>_s<S>_<method>;
# a run counts as finished when ANY folder under runs/constrained holds a summary.json for the same dataset,
# n, data limits, round budget, seed and method (experiments/constrained/collect.py --list-done), so the
# runs behind the README are not repeated. Settings (environment): SEEDS (default 0-9), NS (1 5 10 20),
# DATASETS (breast_cancer monks1 adult fairness), ROUNDS1 (Table 1 budget, 1500), ROUNDS2 (Table 2, 600),
# ADULT_LIMIT (Table-1 Adult rows, 5000), EVAL_EVERY (evaluation period; 10 gives every outer iteration
# for plot_fig12.py). `touch runs/constrained/STOP` stops it after the current run (remove the file to go on).
# The README's "Not done" section gives the measured cost per run and of the whole grid.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7 8 9"}
NS=${NS:-"1 5 10 20"}
DATASETS=${DATASETS:-"breast_cancer monks1 adult fairness"}
ROUNDS1=${ROUNDS1:-1500}
ROUNDS2=${ROUNDS2:-600}
ADULT_LIMIT=${ADULT_LIMIT:-5000}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

done_list=$($PY experiments/constrained/collect.py --list-done)

run() {  # run TAG YAML N SEED ROUNDS KEY LABEL [--set ...]: KEY = 'dataset limit server_limit' as collect.py prints
  local tag=$1 yaml=$2 n=$3 seed=$4 rounds=$5 key=$6 label=$7; shift 7
  read -r ds limit slimit <<<"$key"
  if grep -Fxq "$ds $n $limit $slimit $rounds $seed $label" <<<"$done_list"; then return; fi
  local slug; slug=$(tr -c 'A-Za-z0-9\n' '_' <<<"$label")
  local out="runs/constrained/${tag}_n${n}_s${seed}_${slug}"
  if [ -n "${DRY:-}" ]; then echo "missing: $ds n=$n seed=$seed $label -> $out"; return; fi
  if [ -e runs/constrained/STOP ]; then echo "runs/constrained/STOP exists: skipping $out"; return; fi
  echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg): $out"
  nice -n 10 $PY -m fedsolve compare "$yaml" --set data.num_clients="$n" --set "seeds=[$seed]" \
    --set simulation.rounds="$rounds" ${EVAL_EVERY:+--set simulation.eval_every=$EVAL_EVERY} \
    --only "$label" --out "$out" --overwrite --quiet "$@" | tail -n 2
}

E=experiments/constrained
for seed in $SEEDS; do
  for n in $NS; do
    for ds in $DATASETS; do
      case $ds in
        breast_cancer|monks1)
          for label in "Prox-AL FL" "cProx-AL" "FedAvg (no constraints)"; do
            run t1_$ds $E/table1_np_${ds/monks1/monks1}.yaml "$n" "$seed" "$ROUNDS1" "$ds None None" "$label"
          done ;;
        adult)
          for label in "Prox-AL FL" "cProx-AL" "FedAvg (no constraints)"; do
            run t1_adult $E/table1_np_adult.yaml "$n" "$seed" "$ROUNDS1" "adult $ADULT_LIMIT None" "$label" \
              --set problem.params.limit="$ADULT_LIMIT"
          done ;;
        fairness)
          for label in "Prox-AL FL (paper params)" "Prox-AL FL (code params)" "cProx-AL" "FedAvg (no constraints)"; do
            run t2_fair $E/table2_fairness_adult.yaml "$n" "$seed" "$ROUNDS2" "adult 3000 1000" "$label"
          done ;;
      esac
    done
  done
done
[ -n "${DRY:-}" ] || $PY experiments/constrained/collect.py --rounds "$ROUNDS1,$ROUNDS2"
