#!/usr/bin/env bash
# Fuzzes the file parsers: builds the libFuzzer harnesses in fuzz/ with clang, AddressSanitizer
# and UndefinedBehaviorSanitizer into build-fuzz/, then runs each for SECONDS (default 60),
# starting from its seed corpus in fuzz/corpus/<target>/. Fails on any crash, leak, timeout or
# sanitizer report, leaving the input that caused it in build-fuzz/artifacts/. Prints the
# executions per target and in total.
#
#   scripts/fuzz.sh [SECONDS]
#
# Without clang's libFuzzer runtime (`scripts/setup.sh --fuzz` installs it when it can) it says so and
# skips, successfully: the fuzzers are an extra check, not a build requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${MT_FUZZ_BUILD_DIR:-build-fuzz}
targets=(config safetensors data)

bash scripts/setup.sh --fuzz
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>/dev/null; then
  echo "fuzz: SKIPPED: clang++ with libFuzzer is not available (Debian/Ubuntu: apt-get install" \
       "clang libclang-rt-dev, or run scripts/setup.sh online)"
  exit 0
fi

generator=()
command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]] && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DMT_CUDA=OFF -DMT_BUILD_FUZZERS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

mkdir -p "$build/artifacts"
total=0
failed=()
report=()
for t in "${targets[@]}"; do
  # New inputs go to the first directory (scratch, kept between runs); the committed seeds are
  # only read.
  mkdir -p "$build/corpus/$t"
  log=$build/fuzz_$t.log
  echo "fuzz: fuzz_$t for ${seconds} s"
  rc=0
  "$build/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  runs=${runs:-0}
  total=$((total + runs))
  if ((rc != 0)); then
    failed+=("$t")
    report+=("$(printf '  %-12s %10s executions  FAILED (exit %d, log %s)' "$t" "$runs" "$rc" "$log")")
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|artifact_prefix|Test unit written)' "$log" | head -20
  else
    report+=("$(printf '  %-12s %10s executions  ok' "$t" "$runs")")
  fi
done
echo "fuzz: ${seconds} s per target"
printf '%s\n' "${report[@]}"
printf '  %-12s %10s executions\n' total "$total"
if ((${#failed[@]} > 0)); then
  echo "fuzz: FAILED: ${failed[*]}; the inputs are in $build/artifacts/"
  exit 1
fi
