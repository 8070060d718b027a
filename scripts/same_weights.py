#!/usr/bin/env python3
"""Exits 0 when two minitrain model checkpoints hold bitwise-identical tensors (the metadata,
which records the run's own paths, may differ). Needs the `safetensors` and `numpy` packages.

    same_weights.py A.safetensors B.safetensors
"""
import sys

from safetensors.numpy import load_file

a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
if a.keys() != b.keys():
    print(f"different tensor names: {sorted(a.keys() ^ b.keys())}")
    sys.exit(1)
diff = [k for k in a if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
print(f"{len(a)} tensors, {sum(v.size for v in a.values())} values: "
      + ("bitwise identical" if not diff else f"{len(diff)} differ: {diff[:5]}"))
sys.exit(1 if diff else 0)
