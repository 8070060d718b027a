#!/usr/bin/env bash
# Configures and builds minitrain into build/ (CUDA on when nvcc is found, for the visible GPU's
# architecture, or sm_80 and sm_90a when no GPU is visible). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90a. MT_BUILD_TARGETS="a b"
# builds only those targets (and what they need); everything otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${MT_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[[ -f $build/CMakeCache.txt ]] && generator=()
cmake -S . -B "$build" "${generator[@]}" "$@"
targets=()
for t in ${MT_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
