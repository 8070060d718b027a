#!/usr/bin/env python3
"""Compares the training-loss curves of two runs (their metrics.jsonl files).

    compare_metrics.py REFERENCE.jsonl OTHER.jsonl [--tolerance 0.05] [--last]

Prints, for every logged step both runs have, the two losses and their relative difference, and
the largest one; exits 1 when that exceeds the tolerance. Used to check that bf16 and f16 runs
track the f32 run of the same config. --last judges only the last common step: for a run that
skipped steps on purpose (an f16 loss scale that starts far too high), which lags the reference
early on and must end where it ends.
"""
import argparse
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                out[r["step"]] = r["loss"]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("reference")
    p.add_argument("other")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--last", action="store_true", help="judge only the last common logged step")
    a = p.parse_args()
    ref, oth = losses(a.reference), losses(a.other)
    steps = sorted(set(ref) & set(oth))
    if not steps:
        print("compare_metrics: no common logged steps", file=sys.stderr)
        return 1
    worst = 0.0
    for s in steps[-1:] if a.last else steps:
        rel = abs(oth[s] - ref[s]) / max(abs(ref[s]), 1e-12)
        worst = max(worst, rel)
    print(f"{len(steps)} logged steps (up to step {steps[-1]}): largest relative loss difference "
          f"{'at the last step ' if a.last else ''}{worst:.4f} (tolerance {a.tolerance}); final losses {ref[steps[-1]]:.5f} vs {oth[steps[-1]]:.5f}")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
