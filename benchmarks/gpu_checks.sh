#!/usr/bin/env bash
# One lent GPU session's checks, as one prepared script (issues 32, 33, 34): benchmarks first, on an idle GPU,
# then the paper-size runs side by side until a deadline, then everything packed into OUT.
#
# Usage: bash benchmarks/gpu_checks.sh OUT [DEADLINE_S] [--smoke]
#   OUT         folder for the packed results (gpu_scale.json, bench.tar.gz, runs.tar.gz)
#   DEADLINE_S  seconds after the start at which unfinished runs are stopped (SIGTERM: each keeps its
#               checkpoint on that machine) and the results, without checkpoints, are packed
#   --smoke     tiny sizes on the CPU, to check the script itself
#
# Phase A (idle GPU, timed): benchmarks/bilevel_hvp.py on cuda (SimFBO's HVP-heavy local step, vectorized vs
# client by client), benchmarks/gpu_scale.py (MLP and LeNet vectorized vs sequential, 100 to 10,000 clients),
# issue 48's figures: benchmarks/peers/families.py --device cuda (every family's vectorized round against its
# sequential executor and the plain and fastest loops on the same GPU, states checked; targets: `ratio <family>
# sequential` >= 10, `ratio <family> plain` >= 5) and benchmarks/sweep.py --device cuda (16 runs as one batch against
# one run; target `ratio sweep16 one_run` <= 2).
# Phase B (side by side, not timed against each other):
#   - FedNest at 4,000 communication rounds on the full MNIST hyper-representation task (issue 32: its public
#     code reaches 91-92% there), 3 seeds;
#   - FedMM vs FedAvgGDA vs FedProxGDA, DANN, MNIST -> MNIST-M-like at full size (28x28, all images, the
#     CNN feature extractor), 2 clients at p = 1, 3 seeds; FedSGDA (one step per round) at 5x the rounds;
#   - tests/test_device.py (CPU vs CUDA, every algorithm family);
#   - issue 47's label-swap figure with every method tuned on validation (experiments/fpfc/label_swap_tuned_suite.yaml,
#     MNIST first) into results/fpfc/label_swap_tuned_gpu: whatever finishes before the deadline comes back in
#     labelswap.tar.gz as finished run folders; committed there, the next lent session's run of this script
#     keeps them (`--resume`) and goes on (about an hour of GPU in all, so several lent sessions).
# Data come from the fedsolve cache ($FEDSOLVE_DATA_DIR): the machine has no network.
set -u
OUT=${1:?usage: gpu_checks.sh OUT [DEADLINE_S] [--smoke]}
DEADLINE=${2:-480}
SMOKE=${3:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT" runs/gpu_bench runs/gpu
FS=(python -m fedsolve)
export PYTHONUNBUFFERED=1

if [ "$SMOKE" = --smoke ]; then
  DEV=cpu; FNR=6; FNE=3; MMR=4; MME=2; SGR=8; SGE=4; MMDATA=(--set data.params.limit=600 --set data.params.test_limit=200)
  FNDATA=(--set 'data.params={limit: 2000, test_limit: 500}'); JOBS=1
  python benchmarks/bilevel_hvp.py --device cpu --reps 1 > runs/gpu_bench/bilevel_hvp.txt 2>&1
  python benchmarks/gpu_scale.py --smoke --out runs/gpu_bench/gpu_scale.json > runs/gpu_bench/gpu_scale.log 2>&1
  python benchmarks/peers/families.py --smoke --repeats 1 --executors vectorized,sequential --device cpu \
    --json runs/gpu_bench/families_cuda.json > runs/gpu_bench/families_cuda.log 2>&1
  python benchmarks/sweep.py --clients 8 --samples 20 --rounds 1 --seeds 2 --lrs 2 --repeats 1 \
    > runs/gpu_bench/sweep_cuda.txt 2>&1
  LSW=(--set 'seeds=[0]' --set 'experiment.simulation.rounds=4' --set 'experiment.data.params.limit=400' \
       --set 'experiment.data.params.test_limit=100' --only FPFC)
  LSWTUNE=4; LSWOUT=runs/gpu/label_swap_tuned
else
  DEV=cuda; FNR=4000; FNE=100; MMR=1000; MME=50; SGR=5000; SGE=250; MMDATA=(--set data.params.limit=null --set data.params.test_limit=null)
  FNDATA=(--set 'data.params={}'); JOBS=3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > runs/gpu_bench/gpu.txt 2>&1
  python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" >> runs/gpu_bench/gpu.txt 2>&1
  echo "[$(el) s] phase A"
  python benchmarks/bilevel_hvp.py --device cuda --reps 9 > runs/gpu_bench/bilevel_hvp.txt 2>&1
  python benchmarks/bilevel_hvp.py --device cuda --reps 9 --threads 16 > runs/gpu_bench/bilevel_hvp_t16.txt 2>&1
  python benchmarks/gpu_scale.py --out runs/gpu_bench/gpu_scale.json > runs/gpu_bench/gpu_scale.log 2>&1
  python benchmarks/peers/families.py --repeats 3 --executors vectorized,sequential --device cuda \
    --json runs/gpu_bench/families_cuda.json > runs/gpu_bench/families_cuda.log 2>&1
  python benchmarks/sweep.py --device cuda --repeats 3 > runs/gpu_bench/sweep_cuda.txt 2>&1
  LSW=(--set experiment.simulation.device=cuda)
  LSWTUNE=100; LSWOUT=results/fpfc/label_swap_tuned_gpu
fi
grep -h "^ratio\|^clients_per_s\|^round_s" runs/gpu_bench/*.txt runs/gpu_bench/*.log
echo "[$(el) s] phase B"
export OMP_NUM_THREADS=1   # many processes share the host cores; their work is on the GPU

MM=(--set data.params.size=28 --set problem.params.features=cnn --set simulation.device=$DEV "${MMDATA[@]}" --quiet)
pids=()
"${FS[@]}" compare experiments/minimax/mnistm_dann_2clients.yaml "${MM[@]}" --set simulation.rounds=$MMR \
  --set simulation.eval_every=$MME --jobs $((JOBS * 3)) --out runs/gpu/mnistm_dann_full > runs/gpu_bench/mm_full.log 2>&1 &
pids+=($!)
"${FS[@]}" compare experiments/minimax/mnistm_dann_fedsgda.yaml "${MM[@]}" --set simulation.rounds=$SGR \
  --set simulation.eval_every=$SGE --jobs $JOBS --out runs/gpu/mnistm_dann_full_fedsgda > runs/gpu_bench/mm_fedsgda.log 2>&1 &
pids+=($!)
"${FS[@]}" compare experiments/bilevel/fig23_mnist_iid.yaml "${FNDATA[@]}" --set simulation.rounds=$FNR \
  --set simulation.eval_every=$FNE --set simulation.device=$DEV --only FedNest --jobs $JOBS --quiet \
  --out runs/gpu/fednest_4000 > runs/gpu_bench/fednest.log 2>&1 &
pids+=($!)
"${FS[@]}" suite experiments/fpfc/label_swap_tuned_suite.yaml "${LSW[@]}" --jobs $JOBS --quiet --resume \
  --set "experiment.algorithms.0.tune.rounds=$LSWTUNE" --out "$LSWOUT" > runs/gpu_bench/label_swap.log 2>&1 &
pids+=($!)
if [ "$SMOKE" != --smoke ]; then
  timeout 240 python -m pytest -q -p no:cacheprovider tests/test_device.py tests/test_batched_conv.py > runs/gpu_bench/test_device.log 2>&1 &
fi

while [ "$(el)" -lt "$DEADLINE" ]; do
  alive=0; for p in "${pids[@]}"; do ps -o stat= -p "$p" 2>/dev/null | grep -q '^[^Z]' && alive=1; done
  [ $alive = 0 ] && break
  sleep 5
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
sleep 10
for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
wait 2>/dev/null
echo "[$(el) s] packing"
cp runs/gpu_bench/gpu_scale.json "$OUT/" 2>/dev/null
tar -czf "$OUT/bench.tar.gz" runs/gpu_bench
tar -czf "$OUT/runs.tar.gz" --exclude='checkpoint*' runs/gpu
[ -d "$LSWOUT" ] && tar -czf "$OUT/labelswap.tar.gz" --exclude='checkpoint*' --exclude='*.lock' "$LSWOUT"
ls -la "$OUT"
tail -3 runs/gpu_bench/test_device.log 2>/dev/null
for f in runs/gpu_bench/mm_full.log runs/gpu_bench/mm_fedsgda.log runs/gpu_bench/fednest.log runs/gpu_bench/label_swap.log; do echo "== $f"; tail -4 "$f"; done
echo "[$(el) s] done"
