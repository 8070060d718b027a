"""PyTorch's F.scaled_dot_product_attention (causal, bf16, the backend it picks) timed on the
shapes bench_attention times, with the same FLOP convention (fwd 4*B*H*T^2*d/2, bwd 2.5x fwd)
and the same method: 3 warm-up calls, then 20 calls back to back, each between two CUDA events,
the host waiting only after the last, and the median of the 20. The host issues the next call
while the GPU runs this one, so no call waits for Python to launch it (waiting for each call
would add the host's dispatch time to the GPU's: 16-25 us to the forward's 85 us at
[16, 12, 1024, 64] on an H200, 65-70 us to the backward's 275).

    python3 bench/attention_sdpa.py [--ours BENCH_ATTENTION_LOG]

--ours takes the output of a bench_attention run just before this one and prints the goal at
GPT-2's shape, forward and backward each at least SDPA's TFLOP/s, with PASS or MISS, and the ratio
at the other shapes. Ours are the plain causal rows, not the packed or dropout ones."""
import argparse
import re
import sys

WARMUP, REPS = 3, 20
SHAPES = [(16, 12, 1024, 64), (4, 16, 4096, 128), (16, 12, 1024, 32), (8, 12, 2048, 64)]
GOAL_SHAPE = (16, 12, 1024, 64)
OURS_RE = re.compile(r"^\[(\d+), (\d+), (\d+), (\d+)\] bf16 causal\s+\([^)]*\) fwd\s+[\d.]+ ms\s+"
                     r"([\d.]+) TFLOP/s\s+bwd\s+[\d.]+ ms\s+([\d.]+) TFLOP/s", re.M)


def read_ours(text):
    """{shape: (fwd, bwd) TFLOP/s} from bench_attention's output."""
    return {tuple(int(x) for x in m.groups()[:4]): (float(m.group(5)), float(m.group(6)))
            for m in OURS_RE.finditer(text)}


def goal_lines(ours, sdpa):
    """A line for each shape and direction both measured: PASS or MISS at GOAL_SHAPE."""
    lines = []
    for shape in SHAPES:
        if shape not in ours or shape not in sdpa:
            continue
        for i, direction in enumerate(("fwd", "bwd")):
            a, b = ours[shape][i], sdpa[shape][i]
            figures = f"{a:.1f} vs {b:.1f} TFLOP/s ({a / b:.3f}x)"
            if shape == GOAL_SHAPE:
                verdict = "PASS" if a >= b else "MISS"
                lines.append(f"attention goal {list(shape)} {direction} >= SDPA: {figures} "
                             f"{verdict}")
            else:
                lines.append(f"attention {list(shape)} {direction} vs SDPA: {figures}")
    return lines


def median_ms(torch, fn):
    for _ in range(WARMUP):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPS)]
    for a, b in events:
        a.record()
        fn()
        b.record()
    events[-1][1].synchronize()
    return sorted(a.elapsed_time(b) for a, b in events)[REPS // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="bench_attention's output, to print the goals against")
    args = ap.parse_args()
    ours = None
    if args.ours:
        with open(args.ours, encoding="utf-8") as f:
            ours = read_ours(f.read())
        if GOAL_SHAPE not in ours:
            sys.exit(f"--ours: {args.ours} has no plain causal row at {list(GOAL_SHAPE)}")
    import torch  # here, so that the parsing above can be used without it
    import torch.nn.functional as F
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    sdpa = {}
    for B, H, T, d in SHAPES:
        q, k, v, do = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=i < 3) for i in range(4))
        fwd_flops = 4 * B * H * T * T * d / 2
        f_ms = median_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b_ms = median_ms(torch,
                         lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
        sdpa[(B, H, T, d)] = (fwd_flops / f_ms / 1e9, 2.5 * fwd_flops / b_ms / 1e9)
        print(f"[{B}, {H}, {T}, {d}] bf16 causal SDPA   fwd {f_ms:7.3f} ms "
              f"{sdpa[(B, H, T, d)][0]:6.1f} TFLOP/s   bwd {b_ms:7.3f} ms "
              f"{sdpa[(B, H, T, d)][1]:6.1f} TFLOP/s")
    if ours is not None:
        print("\n".join(goal_lines(ours, sdpa)))


if __name__ == "__main__":
    main()
