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

# The card's SM clock and power while train_step runs, sampled every 250 ms: a GEMM-bound step
# holds the card at its power limit, and the clock it then runs at is what the GEMMs get.
clocks=$out/clocks.csv
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader,nounits \
  -lms 250 >"$clocks" 2>/dev/null &
sampler=$!
timeout 600 "$bin" --export "$out" 2>&1 | tee "$out/train_step.log"
rc=${PIPESTATUS[0]}
kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
# Samples at or above 300 W: the busy ones (an idle H200 draws under 100 W).
python3 - "$clocks" <<'PY' | tee -a "$out/train_step.log"
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append([float(v) for v in line.split(",")])
    except ValueError:
        pass  # a "[N/A]" field or a line cut short by the kill
busy = [r for r in rows if len(r) == 4 and r[2] >= 300]
if not busy:
    print("train_step clocks: no busy samples")
else:
    clk = [r[0] for r in busy]
    print(f"train_step clocks: {len(busy)} busy samples (>= 300 W): SM clock median "
          f"{statistics.median(clk):.0f} MHz (min {min(clk):.0f}, max {max(clk):.0f}; the card's "
          f"max {busy[0][1]:.0f}), mean power {statistics.mean(r[2] for r in busy):.0f} W of a "
          f"{busy[0][3]:.0f} W limit")
PY
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
