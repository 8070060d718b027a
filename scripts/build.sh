#!/usr/bin/env bash
# Configures and builds minitrain into build/ (CUDA on when nvcc is found). Extra arguments go
# to cmake's configure step, e.g. scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${MT_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[[ -f $build/CMakeCache.txt ]] && generator=()
cmake -S . -B "$build" "${generator[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
