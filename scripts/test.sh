#!/usr/bin/env bash
# Builds and runs every test (CUDA tests skip cleanly without a GPU). Extra arguments go to
# cmake's configure step (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir "${MT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
