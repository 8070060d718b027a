#!/usr/bin/env bash
# On a machine with 2 (or more) NVIDIA GPUs: data parallelism over NCCL (docs/distributed.md).
# Builds for sm_90a, runs the data-parallel and CUDA tests, trains the default and the large
# config on 1 and on 2 GPUs and compares them, times the large step's scaling, kills a worker
# mid-run (under `train --nproc` and under an outside launcher), and prints a summary last; the
# summary and the logs also go to $MT_LOG_DIR (default build-gpu/logs-dist).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0  # never use NVLink multicast
build=${MT_BUILD_DIR:-build-gpu}
logs=${MT_LOG_DIR:-$build/logs-dist}
runs=$build/runs-dist
mkdir -p "$logs"
rm -rf "$runs" && mkdir -p "$runs"
: >"$logs/summary.txt"
note() { echo "$*" >>"$logs/summary.txt"; }
finish() {
  echo
  echo "================ data-parallel summary ================"
  cat "$logs/summary.txt"
}
trap finish EXIT

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
note "GPUs: $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if ! MT_BUILD_DIR=$build bash scripts/build.sh -DMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$logs/build.log" 2>&1; then
  tail -40 "$logs/build.log"
  note "build FAILED"
  exit 1
fi
note "build: $(grep -o 'minitrain: NCCL [A-Z]*' "$logs/build.log" | tail -1)"

"$build/mt_tests" --gtest_filter='Dist*:LoaderShard*:*Graph*:TrainCli*' >"$logs/tests.log" 2>&1
note "tests: $(grep -E '^\[  (PASSED|FAILED) ' "$logs/tests.log" | tr '\n' ' ')"

# name, nproc, then --set arguments
train() {
  local name=$1 n=$2; shift 2
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  local start=$(date +%s.%N)
  timeout 300 "$build/train" --config "$config" --nproc "$n" --set checkpoint.dir="$runs/$name" \
    "${args[@]}" >"$logs/train-$name.log" 2>&1
  local rc=$?
  note "train $name ($n GPU, rc $rc, $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s): $(grep -E '\| loss' "$logs/train-$name.log" | tail -1 | cut -c12-)"
  grep -h 'gradient all-reduces in' "$logs/train-$name.log" | cut -c12- | while IFS= read -r l; do note "  $l"; done
}

# Both configs: the same global batch on 1 and 2 GPUs; one GPU in 4 microbatches, two in 2
# each: the same microbatches, summed in another order.
config=configs/mlp.yaml
train mlp-1 1
train mlp-2 2 optim.microbatches=2
note "  mlp 2 GPUs vs 1: $(python3 scripts/compare_metrics.py "$runs/mlp-1/metrics.jsonl" "$runs/mlp-2/metrics.jsonl" --tolerance 1e-3 2>&1 | tail -1)"
note "  $(grep -h 'test:' "$logs/train-mlp-1.log" | cut -c12-) | 2 GPUs: $(grep -h 'test:' "$logs/train-mlp-2.log" | cut -c12-)"

config=configs/large.yaml
train large-1 1
train large-2 2 optim.microbatches=2
note "  large 2 GPUs vs 1: $(python3 scripts/compare_metrics.py "$runs/large-1/metrics.jsonl" "$runs/large-2/metrics.jsonl" --tolerance 1e-2 2>&1 | tail -1)"

# The one-GPU benchmark's per-piece breakdown of the step (docs/perf.md, "Where the time goes").
timeout 200 "$build/train_step" >"$logs/train_step.log" 2>&1
note "train_step (rc $?):"
grep -hE '^train_step|where the time goes|^     ' "$logs/train_step.log" | while IFS= read -r l; do note "  $l"; done

# Scaling: the train-step benchmark's large step on 1 GPU, then on 2 (the same work per GPU).
timeout 240 "$build/train_step" --size large --nproc 1 >"$logs/dp-step-1.log" 2>&1
note "$(grep -h '^train_step dp' "$logs/dp-step-1.log")"
timeout 240 "$build/train_step" --size large --nproc 2 >"$logs/dp-step-2.log" 2>&1
note "$(grep -h '^train_step dp' "$logs/dp-step-2.log")"
# NCCL on at most 16 SMs: less contention with the backward's GEMMs, a slower all-reduce.
NCCL_MAX_CTAS=16 timeout 240 "$build/train_step" --size large --nproc 2 >"$logs/dp-step-2-ctas16.log" 2>&1
note "NCCL_MAX_CTAS=16: $(grep -h '^train_step dp' "$logs/dp-step-2-ctas16.log")"

# A worker killed mid-run under `train --nproc 2`: the launcher stops the other and the job ends.
config=configs/mlp.yaml
"$build/train" --config $config --nproc 2 --set optim.steps=1000000 --set logging.every=1000 \
  --set eval.every=1000000 --set checkpoint.every=1000000 --set checkpoint.dir="$runs/kill" \
  >"$logs/kill-launcher.log" 2>&1 &
launcher=$!
sleep 15
victim=$(pgrep -P $launcher | tail -1)
kill -9 "$victim"
t0=$(date +%s.%N)
wait $launcher
rc=$?
note "kill -9 of worker pid $victim under train --nproc 2: job ended $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s later, rc $rc: $(grep -h 'train:' "$logs/kill-launcher.log" | tr '\n' ' ')"

# SIGTERM to the launcher itself (a scheduler's way to stop a job): passed on to the workers.
"$build/train" --config $config --nproc 2 --set optim.steps=1000000 --set logging.every=1000 \
  --set eval.every=1000000 --set checkpoint.every=1000000 --set checkpoint.dir="$runs/term" \
  >"$logs/term-launcher.log" 2>&1 &
launcher=$!
sleep 12
workers=$(pgrep -P $launcher | tr '\n' ' ')
kill -TERM $launcher
t0=$(date +%s.%N)
wait $launcher
rc=$?
left=0
for w in $workers; do kill -0 "$w" 2>/dev/null && left=$((left + 1)); done
note "SIGTERM to the launcher: job ended $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s later, rc $rc, workers still running: $left: $(grep -h 'train:' "$logs/term-launcher.log" | tr '\n' ' ')"

# A rank killed under an outside launcher: two processes started by hand; the survivor must give up by
# itself, through its NCCL timeout (MT_DIST_TIMEOUT=20 here).
id=$(mktemp -u /tmp/mt-nccl-id-XXXXXX)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MT_DIST_FILE=$id MT_DIST_TIMEOUT=20 "$build/train" \
    --config $config --set optim.steps=1000000 --set logging.every=1000 --set eval.every=1000000 \
    --set checkpoint.every=1000000 --set checkpoint.dir="$runs/kill-env" >"$logs/kill-env-$r.log" 2>&1 &
  pids[$r]=$!
done
sleep 15
kill -9 "${pids[1]}"
t0=$(date +%s.%N)
wait "${pids[0]}"
rc=$?
note "kill -9 of rank 1 started by hand (MT_DIST_TIMEOUT=20): rank 0 ended $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s later, rc $rc: $(grep -h 'error' "$logs/kill-env-0.log" | tail -1)"
