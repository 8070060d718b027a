#!/usr/bin/env bash
# Checks minitrain as a library (docs/library.md):
#  1. install: installs BUILD_DIR (already built; default $MT_BUILD_DIR, else build) into a temp
#     prefix, checks every header of every area (but the tests' *_testing.h, which must be
#     absent) and bin/train are there, then builds examples/consumer against it with
#     find_package and runs it: a tiny model trained through "minitrain.h", and the op
#     registry asked for every kernel the sources register (MT_REGISTER_KERNEL), CUDA ones too
#     when the build has CUDA.
#  2. subproject: tests/subproject pulls the source tree in with add_subdirectory (CPU only,
#     Debug): it must build only the libraries and leave the parent's build type alone.
#
#   scripts/check-package.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-${MT_BUILD_DIR:-build}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
fail() { echo "check-package: FAILED: $*" >&2; exit 1; }

# ---- 1. install + find_package ---------------------------------------------------------------
[[ -f $build/CMakeCache.txt ]] || fail "$build is not a build directory (run scripts/build.sh first)"
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
config=$(find "$prefix" -name minitrainConfig.cmake | head -1)
[[ -n $config ]] || fail "no minitrainConfig.cmake under $prefix"
with_cuda=$(sed -n 's/^set(minitrain_WITH_CUDA \(.*\))$/\1/p' "$config")

# Every header of every area, at its repo-rooted path (the CUDA ones only in a CUDA build).
missing=0
while IFS= read -r h; do
  [[ $with_cuda != ON && ( $h == */cuda/* || $h == *_cuda.h || $h == *.cuh ) ]] && continue
  if [[ $h == *_testing.h ]]; then  # the tests' hooks: never installed
    [[ ! -e $prefix/include/minitrain/$h ]] || { echo "check-package: installed: $h" >&2; missing=1; }
    continue
  fi
  [[ -f $prefix/include/minitrain/$h ]] || { echo "check-package: not installed: $h" >&2; missing=1; }
done < <(find core ops check nn optim parallel data train app \( -name '*.h' -o -name '*.cuh' \) | sort)
[[ -f $prefix/include/minitrain/minitrain.h ]] || { echo "check-package: not installed: minitrain.h" >&2; missing=1; }
(( missing == 0 )) || fail "the install lacks headers"
# The program, installed and runnable from the prefix.
"$prefix/bin/train" --version >"$tmp/version.txt" || { cat "$tmp/version.txt"; fail "bin/train --version"; }

cmake -S examples/consumer -B "$tmp/consumer" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "consumer configure"; }
cmake --build "$tmp/consumer" -j "$(nproc)" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "consumer build"; }
"$tmp/consumer/consumer_train" || fail "consumer_train"
"$tmp/consumer/consumer_residual" || fail "consumer_residual"

# op:Phase:Device for each MT_REGISTER_KERNEL in the sources.
kernels=()
while IFS= read -r k; do
  [[ $with_cuda != ON && $k == *:CUDA ]] && continue
  kernels+=("$k")
done < <(grep -rhoE 'MT_REGISTER_KERNEL\([a-z_0-9]+, *[A-Za-z]+, *[A-Z]+' core ops nn optim parallel data train app |
         sed -E 's/MT_REGISTER_KERNEL\(([a-z_0-9]+), *([A-Za-z]+), *([A-Z]+)/\1:\2:\3/' | sort -u)
(( ${#kernels[@]} > 0 )) || fail "no MT_REGISTER_KERNEL found in the sources"
"$tmp/consumer/consumer_registry" "${kernels[@]}" || fail "consumer_registry"
echo "check-package: install + find_package ok (CUDA $with_cuda)"

# An op of the user's own (examples/swiglu, docs/first_op.md): the op check on it, the check's own
# test (broken copies of the op must fail it), and a model using the op trained by the trainer.
cmake -S examples/swiglu -B "$tmp/swiglu" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/swiglu.log" 2>&1 || { cat "$tmp/swiglu.log"; fail "swiglu configure"; }
cmake --build "$tmp/swiglu" -j "$(nproc)" >>"$tmp/swiglu.log" 2>&1 || { cat "$tmp/swiglu.log"; fail "swiglu build"; }
"$tmp/swiglu/test_swiglu" >"$tmp/swiglu-test.log" 2>&1 || { cat "$tmp/swiglu-test.log"; fail "test_swiglu"; }
grep -E '^(op_check|as expected|\[  PASSED)' "$tmp/swiglu-test.log"
"$tmp/swiglu/train_swiglu" | tail -1 || fail "train_swiglu"
echo "check-package: the out-of-tree op (examples/swiglu) ok"

# ---- 2. add_subdirectory ---------------------------------------------------------------------
sub=${MT_SUBPROJECT_BUILD_DIR:-build-subproject}
# Left empty, the parent's build type must stay empty (configure only).
cmake -S tests/subproject -B "$tmp/sub-empty" "${generator[@]}" -DMINITRAIN_DIR="$root" \
  -DMT_CUDA=OFF >"$tmp/sub-empty.log" 2>&1 || { cat "$tmp/sub-empty.log"; fail "subproject configure (no build type)"; }
grep -q "parent: CMAKE_BUILD_TYPE is ''" "$tmp/sub-empty.log" || fail "subproject: build type not left empty"
# Debug, configured and built.
cmake -S tests/subproject -B "$sub" "${generator[@]}" -DMINITRAIN_DIR="$root" -DMT_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Debug >"$tmp/sub.log" 2>&1 || { cat "$tmp/sub.log"; fail "subproject configure"; }
grep -q "parent: CMAKE_BUILD_TYPE is 'Debug'" "$tmp/sub.log" || fail "subproject: build type not Debug"
cmake --build "$sub" -j "$(nproc)" >>"$tmp/sub.log" 2>&1 || { cat "$tmp/sub.log"; fail "subproject build"; }
"$sub/parent_app" || fail "parent_app"
for f in mt_tests train train_mlp crossover bench_kernels train_step; do
  [[ ! -e $sub/minitrain/$f ]] || fail "subproject built $f"
done
[[ ! -e $sub/minitrain/CTestTestfile.cmake ]] || fail "subproject registered tests with ctest"
echo "check-package: add_subdirectory ok"
