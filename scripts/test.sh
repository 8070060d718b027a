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
# --timeout: a limit per ctest entry (mt_tests runs as 8 shards) that no machine comes near (the
# longest shard takes about a minute under the sanitizer on two busy cores), so a test that hangs
# fails instead of holding the run.
build=${MT_BUILD_DIR:-build}
rc=0
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 600 || rc=$?
# mt_tests runs as shards (CMakeLists.txt: MT_TEST_SHARDS): add up what its shards reported. A
# shard that crashed or hung reports nothing, so the count of shards that finished is printed too.
awk '/^\[  PASSED  \] [0-9]+ test/ { p += $4 } /^\[  SKIPPED \] [0-9]+ test/ { s += $4 }
     /^\[  FAILED  \] [0-9]+ test/ { f += $4 } /^\[==========\] [0-9]+ tests? from .* ran\./ { r++ }
     END { if (r) printf "mt_tests: %d passed, %d skipped, %d failed (%d shards finished)\n", p, s, f, r }' \
  "$build/Testing/Temporary/LastTest.log" 2>/dev/null || true
exit "$rc"
