#!/usr/bin/env bash
# The train-step benchmark beside PyTorch (docs/perf.md): runs `train_step --export`, which times
# minitrain and writes its initial weights, batch, first losses and times, then
# bench/torch_reference.py on those files on the same GPU, and prints both tables and a summary.
# Builds nothing: pass a CUDA build directory.
#
#   scripts/bench-train-step.sh [BUILD_DIR [OUT_DIR]]
#     BUILD_DIR  default $MT_BUILD_DIR, else build-gpu
#     OUT_DIR    default BUILD_DIR/train-step (about 1.1 GB for the large size)
# Exit status: train_step's if it failed, else torch_reference.py's (1 if the losses disagree).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-${MT_BUILD_DIR:-build-gpu}}
out=${2:-$build/train-step}
bin=$build/train_step

if [[ ! -x $bin ]]; then
  echo "bench-train-step: $bin not found: build with -DMT_CUDA=ON first (scripts/gpu-test.sh does)" >&2
  exit 1
fi
mkdir -p "$out" || exit 1

timeout 600 "$bin" --export "$out" 2>&1 | tee "$out/train_step.log"
rc=${PIPESTATUS[0]}
if (( rc != 0 )); then
  echo "bench-train-step: train_step failed (rc $rc); the PyTorch side was not run" >&2
  exit "$rc"
fi

echo
# max-autotune compiles for minutes: MT_TORCH_VARIANTS leaves it out where time is short.
timeout 1200 python3 bench/torch_reference.py --dir "$out" 2>&1 | tee "$out/torch_reference.log"
rc=${PIPESTATUS[0]}

echo
echo "================ train step summary ================"
grep -h -E '^(train_step|torch_reference)[ :]' "$out/train_step.log" "$out/torch_reference.log"
(( rc == 0 )) || echo "bench-train-step: torch_reference.py failed (rc $rc)"
exit "$rc"
