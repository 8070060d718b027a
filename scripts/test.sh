#!/usr/bin/env bash
# Builds everything and runs every test (CUDA tests skip cleanly without a GPU). Extra arguments
# go to cmake's configure step (scripts/build.sh).
#
# Where nvcc is installed the CUDA backend is built, GPU or not (scripts/run.sh leaves it out
# without a GPU): its kernels must still compile and link, and CI runs this script. MT_CUDA=OFF,
# or -DMT_CUDA=OFF among the arguments, builds without it.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=()
if [[ -n ${MT_CUDA:-} ]]; then
  cuda=(-DMT_CUDA="$MT_CUDA")
elif [[ " $* " != *" -DMT_CUDA="* ]] && { command -v nvcc || [[ -x /usr/local/cuda/bin/nvcc ]]; } >/dev/null; then
  cuda=(-DMT_CUDA=ON)
fi
bash scripts/build.sh "${cuda[@]}" "$@"
# --timeout: a per-test limit no machine comes near (the longest test takes about 20 s on two busy
# cores), so a test that hangs fails instead of holding the run.
ctest --test-dir "${MT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 600
