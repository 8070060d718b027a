#!/usr/bin/env bash
# configs/shakespeare.yaml end to end on the CPU, as a user runs it: trains the byte-level GPT on
# both cores (--nproc 2: two ranks that together train like one, docs/distributed.md), checks that
# it reached its stated validation loss, evaluates the checkpoint and samples text from it.
#   bash scripts/shakespeare-check.sh [BUILD_DIR]      (default build; its train must be built)
# The stated loss: 2.144 nats per byte (val_bpb 3.09) after 350 steps; the check allows 2.20.
set -euo pipefail
cd "$(dirname "$0")/.."
train=${1:-build}/train
limit=2.20
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
"$train" --config configs/shakespeare.yaml --device cpu --nproc 2 --set checkpoint.dir="$run/shakespeare"
loss=$(sed -n 's/.*"val_loss":\([-0-9.e+]*\).*/\1/p' "$run/shakespeare/metrics.jsonl" | tail -n 1)
echo "shakespeare: final val_loss $loss (stated 2.144, must be <= $limit)"
awk -v l="$loss" -v m="$limit" 'BEGIN { exit !(l != "" && l <= m) }' || {
  echo "shakespeare: val_loss $loss is above $limit" >&2
  exit 1
}
"$train" eval --checkpoint "$run/shakespeare"
text=$("$train" sample --checkpoint "$run/shakespeare" --prompt "ROMEO:" --tokens 300 --top-k 40 --seed 1)
printf '%s\n' "$text"
# Recognisable: Shakespeare's shape at this loss (2.14 nats per byte): the prompt, speakers' names
# in capitals on lines of their own, and some of the English words a byte model learns first.
[[ $text == ROMEO:* ]] || { echo "shakespeare: the sample does not start with the prompt" >&2; exit 1; }
speakers=$(printf '%s\n' "$text" | tail -n +2 | grep -cE '^[A-Z][A-Z ]+:$' || true)
words=$(printf '%s\n' "$text" | grep -oiwE 'the|and|to|of|i|you|my|that|a|is|in|not|me|with|be|his' | wc -l)
echo "shakespeare: $speakers speakers' names and $words common English words in the sample"
((speakers >= 1 && words >= 5)) || { echo "shakespeare: the sample is not recognisable text" >&2; exit 1; }
