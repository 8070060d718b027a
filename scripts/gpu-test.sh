#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build for sm_90, run every test (the CUDA ones included), the
# kernel benchmarks and the default training run on the GPU, then print a short summary last.
# Logs go to $MT_LOG_DIR (default build-gpu/logs).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0  # never use NVLink multicast
build=${MT_BUILD_DIR:-build-gpu}
logs=${MT_LOG_DIR:-$build/logs}
mkdir -p "$logs"
summary=()
note() { summary+=("$*"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
if ! MT_BUILD_DIR=$build bash scripts/build.sh -DMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$logs/build.log" 2>&1; then
  tail -40 "$logs/build.log"
  echo "SUMMARY build FAILED"
  exit 1
fi
note "build ok ($(grep -c 'Building' "$logs/build.log") objects)"

# Every test in one process (the CUDA ones included; the CPU ones are cheap), then the example.
"$build/mt_tests" >"$logs/tests.log" 2>&1
note "all tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/tests.log" | tr '\n' ' ')"
note "CUDA tests: $(grep -cE '^\[       OK \] Cuda' "$logs/tests.log") passed, $(grep -cE '^\[  FAILED  \] Cuda' "$logs/tests.log") failed"
grep -E '^\[  FAILED  \]|Failure$|error' "$logs/tests.log" | head -30
ctest --test-dir "$build" -R example >"$logs/example.log" 2>&1
note "example: $(grep -E 'tests passed|tests failed' "$logs/example.log")"

for b in "$build"/bench_*; do
  [[ -x $b ]] || continue
  name=$(basename "$b")
  timeout 300 "$b" >"$logs/$name.log" 2>&1
  note "$name (rc $?):"
  while IFS= read -r line; do note "  $line"; done < <(tail -n 12 "$logs/$name.log")
done

for dt in f32 bf16 f16; do
  timeout 300 "$build/train" --config configs/mlp.yaml --device cuda \
    --set precision.compute_dtype=$dt --set checkpoint.dir="$build/run-mlp-$dt" \
    >"$logs/train-$dt.log" 2>&1
  note "train configs/mlp.yaml --device cuda, $dt (rc $?):"
  while IFS= read -r line; do note "  $line"; done < <(grep -E 'step +300/|test:' "$logs/train-$dt.log")
done

echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
