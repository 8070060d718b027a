#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build for sm_90a, run every test (the CUDA ones included), the
# kernel benchmarks and the kernel lab (lab_bench, which rewrites docs/lab_results.md), the
# default training run in f32/bf16/f16 with the mixed-precision checks,
# then the train-step benchmark beside PyTorch, and print a short summary last. The summary is
# also written as it grows to $MT_LOG_DIR/summary.txt (default build-gpu/logs), with every log.
#
#   scripts/gpu-test.sh [PHASE...]     PHASE: tests, bench, train, step, gpt, lm (default: all six),
#                                      attention or mutate (never by default)
#
# lm: the GPT on text (docs/gpt.md): configs/shakespeare-gpu.yaml beside the same recipe in
# PyTorch with torch.compile (scripts/shakespeare_reference.py), both timed wall clock, best
# validation loss against 1.47; `train eval` and `train sample` on the best checkpoint, the
# checkpoint loaded into PyTorch for the same validation loss (scripts/load_checkpoint_torch.py);
# configs/gpt2-124m.yaml for 50 steps, as a CUDA graph and eager, with bitwise equal weights.
#
# attention: bench_attention and PyTorch's SDPA (bench/attention_sdpa.py) in turn, twice
# (MT_ATTENTION_RUNS), each pair with its goal lines; the bench phase runs the pair once.
#
# mutate: the mutation audit of the CUDA kernels (scripts/mutate.py --cuda, with
# tests/mutations-cuda.txt): each entry breaks a kernel, rebuilds it in a scratch tree of its own
# (build-gpu is not built for it) and runs the tests that must notice. On an H100: about 2 minutes
# for the scratch build, 10 to 140 s an entry (attention's compile is the longest), so all of it
# takes longer than a 10-minute command: MT_MUTATE_ONLY=name,name runs some of the entries.
#
# gpt: the GPT-2 124M step (bench/gpt_step.cpp) beside PyTorch eager, torch.compile and
# max-autotune (bench/gpt_torch.py); MT_GPT_BATCH=16|64|all (default all), MT_GPT_MICROBATCH
# (16, 32 or 64: sequences per microbatch; default 64, each batch in one, which at B = 64 needs
# about 32 GiB of device memory: 16 needs under 10), MT_GPT_GEMM_ALGO=heuristic (cuBLASLt's
# first pick for each GEMM instead of the fastest of its first 8, gpt_step --gemm-algo) and
# MT_TORCH_VARIANTS choose a part of it where a command's time is short (max-autotune compiles
# for minutes).
#
# On an H200 the build takes about 90 s from scratch; then tests about 5 minutes, lm about 5 (the
# PyTorch reference's compile and run is 2 of them; gpt2-124m's checkpoints are 1.5 GB each),
# gpt with B = 16 and without max-autotune about 2, and the MLP phases about 10 together. A
# machine that gives commands a time limit runs one or two phases per command (each builds
# first; the build is incremental when build-gpu/ is still there).
#
# Exit status: 0 only if everything passed. A failing test, a benchmark or training run that exits
# non-zero, or a failed check (compare_metrics.py, same_weights.py) is recorded and the rest still
# runs, so the summary is complete; it ends with one "FAILED: ..." line per failure and exit 1.
#
# To see it fail once on purpose: MT_GPU_TEST_BREAK=1 also runs CudaSelfCheck.DISABLED_FailsOnPurpose,
# a test that always fails. MT_GPU_TEST_FILTER=<gtest filter> runs only those tests (e.g. to check
# the script quickly).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0  # never use NVLink multicast
build=${MT_BUILD_DIR:-build-gpu}
logs=${MT_LOG_DIR:-$build/logs}
mkdir -p "$logs"
: >"$logs/summary.txt"
note() { echo "$*" >>"$logs/summary.txt"; }
failures=()
fail() { failures+=("$*"); note "FAILED: $*"; }
# check NAME COMMAND...: runs the command, notes its output, and records a failure if it fails.
check() {
  local name=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  note "  $name: $out"
  (( rc == 0 )) || fail "$name (rc $rc)"
}
finish() {
  local rc=$?
  echo
  echo "================ summary ================"
  cat "$logs/summary.txt"
  if (( ${#failures[@]} )); then
    echo
    printf 'FAILED: %s\n' "${failures[@]}"
    echo "${#failures[@]} failure(s)"
    exit 1
  fi
  if [[ -z ${completed:-} ]]; then  # an early exit, or a signal (a time limit's TERM)
    echo "stopped before the end (exit status $rc): the summary above is partial"
    exit $(( rc ? rc : 1 ))
  fi
  echo "all passed"
}
phases=("$@")
(( ${#phases[@]} )) || phases=(tests bench train step gpt lm)
for p in "${phases[@]}"; do
  [[ $p =~ ^(tests|bench|train|step|gpt|lm|attention|mutate)$ ]] || {
    echo "gpu-test.sh: unknown phase '$p' (tests, bench, train, step, gpt, lm, attention, mutate)" >&2
    exit 2
  }
done
trap finish EXIT
want() { [[ " ${phases[*]} " == *" $1 "* ]]; }
note "phases: ${phases[*]}"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt" \
  || fail "nvidia-smi"
start=$(date +%s)
if [[ ${MT_GPU_TEST_SKIP_BUILD:-0} == 1 ]]; then
  note "build skipped (MT_GPU_TEST_SKIP_BUILD=1): using $build as it is"
elif [[ ${phases[*]} == mutate ]]; then
  note "build skipped: the mutate phase builds its own scratch tree"
elif ! MT_BUILD_DIR=$build bash scripts/build.sh -DMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$logs/build.log" 2>&1; then
  tail -40 "$logs/build.log"
  fail "build (see $logs/build.log)"
  exit 1
else
  note "build ok in $(( $(date +%s) - start )) s"
fi

run_tests() {
# Every test in one process (the CUDA ones included; the CPU ones are cheap).
test_args=()
[[ -n ${MT_GPU_TEST_FILTER:-} ]] && test_args+=("--gtest_filter=$MT_GPU_TEST_FILTER")
if [[ ${MT_GPU_TEST_BREAK:-0} == 1 ]]; then
  test_args=(--gtest_also_run_disabled_tests
             "--gtest_filter=${MT_GPU_TEST_FILTER:-*}:CudaSelfCheck.DISABLED_FailsOnPurpose")
fi
"$build/mt_tests" "${test_args[@]}" >"$logs/tests.log" 2>&1
rc=$?
note "all tests (rc $rc): $(grep -E '^\[  (PASSED|FAILED|SKIPPED)  \] [0-9]+ test' "$logs/tests.log" | tr '\n' ' ')"
note "CUDA tests: $(grep -cE '^\[       OK \] (Cuda|OptimCUDA)' "$logs/tests.log") passed, $(grep -cE '^\[  FAILED  \] .*\(' "$logs/tests.log") failed"
failed_tests=$(grep -E '^\[  FAILED  \] [A-Za-z0-9_/.]+ \(' "$logs/tests.log" | awk '{print $4}')
for t in $failed_tests; do fail "test $t"; done
# A crash or a filter that matches nothing fails too, even with no "[  FAILED  ]" line.
if (( rc != 0 )) && [[ -z $failed_tests ]]; then fail "mt_tests (rc $rc, see $logs/tests.log)"; fi
grep -q '^\[  PASSED  \] [1-9]' "$logs/tests.log" || fail "mt_tests: no test passed"
# The op check (check/op_check.h) of every op: its headline, and every CUDA line that failed.
grep -E '^op_check ' "$logs/tests.log" | while IFS= read -r l; do note "  $l"; done
grep -E '^  FAIL cuda' "$logs/tests.log" | head -20 | while IFS= read -r l; do note "  $l"; done
}

# sdpa_beside OURS_LOG LOG: PyTorch's scaled_dot_product_attention on bench_attention's shapes,
# just after bench_attention wrote OURS_LOG: the peer the attention kernels are measured against
# (bench/attention_sdpa.py), with the goal at GPT-2's shape (PASS/MISS) and the other ratios.
sdpa_beside() {
  if ! python3 -c 'import torch' 2>/dev/null; then
    note "attention_sdpa.py: skipped (no torch)"
    return
  fi
  timeout 300 python3 bench/attention_sdpa.py --ours "$1" >"$2" 2>&1
  local rc=$?
  note "attention_sdpa.py (rc $rc):"
  while IFS= read -r l; do note "  $l"; done <"$2"
  (( rc == 0 )) || fail "attention_sdpa.py (rc $rc)"
}

# attention: bench_attention and SDPA in turn, MT_ATTENTION_RUNS times (default 2): whether the
# goal holds in every run, in a minute or two, without the other benchmarks.
run_attention() {
  local i rc
  for (( i = 1; i <= ${MT_ATTENTION_RUNS:-2}; ++i )); do
    timeout 300 "$build/bench_attention" >"$logs/bench_attention-$i.log" 2>&1
    rc=$?
    note "bench_attention, run $i (rc $rc)"
    (( rc == 0 )) || { fail "bench_attention run $i (rc $rc)"; continue; }
    sdpa_beside "$logs/bench_attention-$i.log" "$logs/attention_sdpa-$i.log"
  done
}

run_bench() {
for b in "$build"/bench_*; do
  [[ -x $b ]] || continue
  name=$(basename "$b")
  timeout 300 "$b" >"$logs/$name.log" 2>&1
  rc=$?
  note "$name (rc $rc):"
  # A benchmark with goals prints one "goal ...: PASS|MISS" line each: those; else its last lines.
  if grep -q '^goal ' "$logs/$name.log"; then
    grep -E '^goal ' "$logs/$name.log" | while IFS= read -r l; do note "  $l"; done
  else
    tail -n 12 "$logs/$name.log" | while IFS= read -r l; do note "  $l"; done
  fi
  (( rc == 0 )) || fail "benchmark $name (rc $rc)"
done

sdpa_beside "$logs/bench_attention.log" "$logs/attention_sdpa.log"

# The kernel lab (docs/lab.md): every numbered version's share of the copy bandwidth and the
# hand-written GEMMs' fraction of cuBLAS. Its tables are the book's: docs/lab_results.md is
# rewritten from this run (commit it); the "lab:" lines go into the summary.
if [[ -x $build/lab_bench ]]; then
  timeout 300 "$build/lab_bench" --markdown docs/lab_results.md >"$logs/lab_bench.log" 2>&1
  rc=$?
  note "lab_bench (rc $rc): docs/lab_results.md rewritten from this run"
  grep '^lab:' "$logs/lab_bench.log" | while IFS= read -r l; do note "  $l"; done
  (( rc == 0 )) || fail "lab_bench (rc $rc, see $logs/lab_bench.log)"
else
  fail "lab_bench was not built"
fi

}

run_train() {
# The default config in each compute dtype; bf16 twice (determinism) and f16 from a scale of 2^40
# (forced overflow: the dynamic scaler must back off, skip those steps and recover).
train() {  # name, then --set arguments
  local name=$1; shift
  local args=()
  for s in "$@"; do args+=(--set "$s"); done
  local log=$build/runs/train-$name.log
  timeout 120 "$build/train" --config configs/mlp.yaml --device cuda \
    --set checkpoint.dir="$build/runs/$name" "${args[@]}" >"$log" 2>&1
  local rc=$?
  note "train $name (rc $rc): $(grep -E 'step +[0-9]+/[0-9]+ \| loss' "$log" | tail -1 | cut -c12-)"
  note "  $(grep -E 'test:' "$log" | cut -c12-)"
  (( rc == 0 )) || fail "train $name (rc $rc, see $log)"
}
rm -rf "$build/runs"
mkdir -p "$build/runs"
train f32 precision.compute_dtype=f32
train bf16 precision.compute_dtype=bf16
train bf16-again precision.compute_dtype=bf16
train bf16-graph precision.compute_dtype=bf16 cuda_graph=true
train f16 precision.compute_dtype=f16
train f16-overflow precision.compute_dtype=f16 precision.initial_scale=1099511627776
cp "$build/runs/train-f16-overflow.log" "$logs/"
note "  f16-overflow: $(grep -c 'step skipped' "$logs/train-f16-overflow.log") skipped steps; $(grep -m1 -o 'loss scale [0-9e.+]* -> [0-9e.+]*' "$logs/train-f16-overflow.log" || true) ... $(grep -o 'loss scale [0-9e.+]* -> [0-9e.+]*' "$logs/train-f16-overflow.log" | tail -1)"
for dt in bf16 f16 f16-overflow; do
  # The overflow run skips its first steps on purpose: it lags f32 early and must end where f32 does.
  last=(); [[ $dt == f16-overflow ]] && last=(--last)
  check "$dt vs f32" python3 scripts/compare_metrics.py "$build/runs/f32/metrics.jsonl" \
    "$build/runs/$dt/metrics.jsonl" --tolerance 0.05 "${last[@]}"
done
# ZeRO-1 over NCCL with one rank: RANK=0 WORLD_SIZE=1 is a launcher's job of one, which with
# optim.shard_state takes the sharded path (reduce-scatter, the fused AdamW on the shard, the
# all-gather, the bf16 copies refreshed). It must train like the plain run of each dtype; with one
# rank it computes the same arithmetic in the same order, so the weights should match bitwise too
# (noted, not required).
for dt in f32 bf16; do
  log=$build/runs/train-zero1-$dt.log
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 timeout 120 "$build/train" --config configs/mlp.yaml --device cuda \
    --set checkpoint.dir="$build/runs/zero1-$dt" --set precision.compute_dtype=$dt \
    --set optim.shard_state=true >"$log" 2>&1
  rc=$?
  note "train zero1-$dt (NCCL, world size 1; rc $rc): $(grep -E 'step +[0-9]+/[0-9]+ \| loss' "$log" | tail -1 | cut -c21-)"
  note "  $(grep -m1 -o 'ZeRO-1: [0-9].*' "$log")"
  (( rc == 0 )) || fail "train zero1-$dt (rc $rc, see $log)"
  check "ZeRO-1 $dt vs plain $dt" python3 scripts/compare_metrics.py "$build/runs/$dt/metrics.jsonl" \
    "$build/runs/zero1-$dt/metrics.jsonl" --tolerance 1e-4
  note "  ZeRO-1 $dt vs plain $dt, final weights: $(python3 scripts/same_weights.py \
    "$build/runs/$dt/step-000300.safetensors" "$build/runs/zero1-$dt/step-000300.safetensors" 2>&1)"
done
# Device memory over a long run (3000 steps): the pool's live bytes at the first and last log.
train long-f32 precision.compute_dtype=f32 optim.steps=3000 logging.every=500 eval.every=3000 \
  checkpoint.every=3000
note "  pool bytes over 3000 steps (step: bytes): $(python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "pool_bytes" in l]
print(", ".join("%d: %d" % (x["step"], x["pool_bytes"]) for x in r))' "$build/runs/long-f32/metrics.jsonl" 2>&1)"
check "two deterministic bf16 runs, final weights" python3 scripts/same_weights.py \
  "$build/runs/bf16/step-000300.safetensors" "$build/runs/bf16-again/step-000300.safetensors"
check "bf16 eager vs bf16 cuda_graph, final weights" python3 scripts/same_weights.py \
  "$build/runs/bf16/step-000300.safetensors" "$build/runs/bf16-graph/step-000300.safetensors"
note "  $(grep -m1 -o 'cuda_graph: .*' "$build/runs/train-bf16-graph.log")"

# The command line on a GPU (docs/guide.md): --version names the architectures built, a smoke run
# of 10 steps (a warmup longer than the run, shortened with a warning) trains, a GPU that is not
# there is a usage error (exit 2).
check "train --version" bash -c "'$build/train' --version | tr '\n' ' ' | grep 'architectures 90'"
check "smoke run, 10 steps on cuda" bash -c "'$build/train' --config configs/mlp.yaml --device cuda \
  --set optim.steps=10 --set checkpoint.dir='$build/runs/smoke' 2>&1 | grep -E 'shortened to 10|step +10/10 \| loss'"
check "--device cuda:99 exits 2" bash -c "'$build/train' --config configs/mlp.yaml --device cuda:99 \
  --set checkpoint.dir='$build/runs/none' >/dev/null 2>&1; [[ \$? == 2 ]] && echo 'exit 2'"

# A user's own model through the installed package (examples/consumer): a residual network
# trained by the trainer on the GPU in bf16 with the step replayed as a CUDA graph, resumed
# bitwise, saved and loaded.
rm -rf "$build/prefix" "$build/consumer"
if cmake --install "$build" --prefix "$build/prefix" >"$logs/consumer.log" 2>&1 &&
   cmake -S examples/consumer -B "$build/consumer" -DCMAKE_PREFIX_PATH="$(cd "$build" && pwd)/prefix" \
     -DCMAKE_BUILD_TYPE=Release >>"$logs/consumer.log" 2>&1 &&
   cmake --build "$build/consumer" -j "$(nproc)" >>"$logs/consumer.log" 2>&1; then
  check "user model (consumer_residual, cuda bf16 cuda_graph)" bash -c \
    "set -o pipefail; '$build/consumer/consumer_residual' --device cuda --dtype bf16 --graph 2>&1 | grep -E 'consumer_residual|cuda_graph'"
else
  tail -20 "$logs/consumer.log"
  fail "consumer build against the installed package"
fi

# The out-of-tree op (examples/swiglu) against the same install: its op check with the CUDA part
# in f32/bf16/f16, its kernels' share of the copy bandwidth, and the model using it trained on cuda.
rm -rf "$build/swiglu"
if cmake -S examples/swiglu -B "$build/swiglu" -DCMAKE_PREFIX_PATH="$(cd "$build" && pwd)/prefix" \
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >"$logs/swiglu.log" 2>&1 &&
   cmake --build "$build/swiglu" -j "$(nproc)" >>"$logs/swiglu.log" 2>&1; then
  "$build/swiglu/test_swiglu" >"$logs/test_swiglu.log" 2>&1
  rc=$?
  note "swiglu op check (rc $rc): $(grep -E '^op_check swiglu:' "$logs/test_swiglu.log") $(grep -E '^\[  (PASSED|FAILED)' "$logs/test_swiglu.log" | tr '\n' ' ')"
  grep -E '^  (PASS|FAIL) cuda' "$logs/test_swiglu.log" | while IFS= read -r l; do note "  $l"; done
  (( rc == 0 )) || fail "test_swiglu (rc $rc, see $logs/test_swiglu.log)"
  check "bench_swiglu" bash -c "set -o pipefail; '$build/swiglu/bench_swiglu' | grep bench_swiglu"
  check "train_swiglu (cuda bf16 cuda_graph)" bash -c \
    "set -o pipefail; '$build/swiglu/train_swiglu' --device cuda --dtype bf16 --graph 2>&1 | grep -E '^train_swiglu|cuda_graph: step'"
else
  tail -30 "$logs/swiglu.log"
  fail "examples/swiglu build against the installed package"
fi

}

run_step() {
# Last, as it takes longest: the whole train step beside PyTorch.
if [[ -x $build/train_step ]]; then
  timeout 1500 bash scripts/bench-train-step.sh "$build" "$build/train-step" >"$logs/train_step.log" 2>&1
  rc=$?
  note "train step vs PyTorch (rc $rc):"
  sed -n '/=== train step summary ===/,$p' "$logs/train_step.log" | tail -n +2 | while IFS= read -r l; do note "  $l"; done
  (( rc == 0 )) || fail "train step benchmark (rc $rc, see $logs/train_step.log)"
fi
}

run_gpt() {
local batch=${MT_GPT_BATCH:-all} dir=$build/gpt-step
mkdir -p "$dir"
timeout 900 "$build/gpt_step" --batch "$batch" --microbatch "${MT_GPT_MICROBATCH:-64}" \
  --gemm-algo "${MT_GPT_GEMM_ALGO:-measured}" --export "$dir" >"$logs/gpt_step.log" 2>&1
rc=$?
note "gpt_step B=$batch (rc $rc):"
grep -E '^gpt_step ' "$logs/gpt_step.log" | while IFS= read -r l; do note "  $l"; done
if (( rc != 0 )); then
  tail -5 "$logs/gpt_step.log" | while IFS= read -r l; do note "  $l"; done
  fail "gpt_step (rc $rc, see $logs/gpt_step.log)"
  return
fi
timeout 1500 python3 bench/gpt_torch.py --dir "$dir" --batch "$batch" >"$logs/gpt_torch.log" 2>&1
rc=$?
note "gpt_torch.py (rc $rc):"
grep -E '^gpt_torch ' "$logs/gpt_torch.log" | while IFS= read -r l; do note "  $l"; done
(( rc == 0 )) || { tail -5 "$logs/gpt_torch.log" | while IFS= read -r l; do note "  $l"; done; fail "gpt_torch.py (rc $rc)"; }
}

run_lm() {
local runs=$build/runs-lm t0 rc
rm -rf "$runs"; mkdir -p "$runs"
best_of() {  # the lowest val_loss in a metrics.jsonl
  python3 -c 'import json,sys; v=[json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "\"val_loss\"" in l]; print(min(v) if v else "none")' "$1"
}
t0=$(date +%s)
timeout 600 "$build/train" --config configs/shakespeare-gpu.yaml --set checkpoint.dir="$runs/shakespeare-gpu" \
  >"$logs/shakespeare-gpu.log" 2>&1
rc=$?
local ours_s=$(( $(date +%s) - t0 )) ours_best
ours_best=$(best_of "$runs/shakespeare-gpu/metrics.jsonl" 2>&1)
note "shakespeare-gpu (rc $rc): best val_loss $ours_best in $ours_s s wall"
(( rc == 0 )) || fail "train shakespeare-gpu (rc $rc, see $logs/shakespeare-gpu.log)"
t0=$(date +%s)
timeout 900 python3 scripts/shakespeare_reference.py --device cuda >"$logs/shakespeare_reference.log" 2>&1
rc=$?
local ref_s=$(( $(date +%s) - t0 ))
note "shakespeare reference, PyTorch torch.compile (rc $rc, $ref_s s wall): $(tail -n 2 "$logs/shakespeare_reference.log" | tr '\n' ' ')"
(( rc == 0 )) || fail "shakespeare_reference.py (rc $rc)"
check "goal shakespeare-gpu best val_loss <= 1.47" python3 -c "import sys; b=float(sys.argv[1]); print(f'{b:.4f}', 'PASS' if b <= 1.47 else 'MISS'); sys.exit(0 if b <= 1.47 else 1)" "$ours_best"
note "  goal shakespeare-gpu wall time below PyTorch's: $ours_s s vs $ref_s s: $( (( ours_s < ref_s )) && echo PASS || echo MISS)"
local best=$runs/shakespeare-gpu/best.safetensors
check "train eval on the best checkpoint" bash -c "'$build/train' eval --checkpoint '$best' 2>&1 | tail -2 | tr '\n' ' '"
check "train sample (cuda)" bash -c "'$build/train' sample --checkpoint '$best' --prompt 'ROMEO:' --tokens 200 --seed 1 --device cuda 2>&1 | head -c 400"
check "the checkpoint in PyTorch" python3 scripts/load_checkpoint_torch.py "$best" --device cuda
# GPT-2 124M, 50 steps: a CUDA graph (the config) and eager must end with the same bits.
for mode in graph eager; do
  local g=true; [[ $mode == eager ]] && g=false
  timeout 600 "$build/train" --config configs/gpt2-124m.yaml --set optim.steps=50 --set eval.every=50 \
    --set checkpoint.every=50 --set cuda_graph=$g --set checkpoint.dir="$runs/gpt2-$mode" >"$logs/gpt2-$mode.log" 2>&1
  rc=$?
  note "gpt2-124m 50 steps, $mode (rc $rc): $(grep -E 'step +1/|step +50/' "$logs/gpt2-$mode.log" | cut -c1-160 | tr '\n' ' ')"
  (( rc == 0 )) || fail "train gpt2-124m $mode (rc $rc, see $logs/gpt2-$mode.log)"
done
check "gpt2-124m graph vs eager, final weights" python3 scripts/same_weights.py \
  "$runs/gpt2-graph/step-000050.safetensors" "$runs/gpt2-eager/step-000050.safetensors"
}

run_mutate() {
local only=()
[[ -n ${MT_MUTATE_ONLY:-} ]] && only=(--only "$MT_MUTATE_ONLY")
rm -f "$logs/mutations-cuda.md"  # its last line is this run's summary, or nothing
python3 scripts/mutate.py --cuda "${only[@]}" --markdown "$logs/mutations-cuda.md" \
  >"$logs/mutate.log" 2>&1
local rc=$?
note "mutate.py --cuda (rc $rc): $(tail -n 1 "$logs/mutations-cuda.md" 2>/dev/null)"
# Each survivor or stale entry once (its progress line), and the audit's own verdicts.
grep -E '^\[[0-9]+/[0-9]+\] [^:]*: (SURVIVED|skipped)|^FAILED|^--cuda' "$logs/mutate.log" |
  while IFS= read -r l; do note "  $l"; done
(( rc == 0 )) || fail "mutate.py --cuda (rc $rc, see $logs/mutate.log)"
}

want tests && run_tests
want bench && run_bench
want train && run_train
want step && run_step
want gpt && run_gpt
want lm && run_lm
want attention && run_attention
want mutate && run_mutate
completed=1
exit 0  # the summary (trap finish) decides the status
