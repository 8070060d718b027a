"""PyTorch's F.scaled_dot_product_attention (causal, bf16, the backend it picks) timed on the
shapes bench_attention times, with the same FLOP convention (fwd 4*B*H*T^2*d/2, bwd 2.5x fwd)
and the same method: 3 warm-up calls, then 20 calls back to back, each between two CUDA events,
the host waiting only after the last, and the median of the 20. The host issues the next call
while the GPU runs this one, so no call waits for Python to launch it (waiting for each call
would add the host's dispatch time to the GPU's: 16-25 us to the forward's 85 us at
[16, 12, 1024, 64] on an H200, 65-70 us to the backward's 275)."""
import torch
import torch.nn.functional as F

WARMUP, REPS = 3, 20
SHAPES = [(16, 12, 1024, 64), (4, 16, 4096, 128), (16, 12, 1024, 32), (8, 12, 2048, 64)]


def median_ms(fn):
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
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for B, H, T, d in SHAPES:
        q, k, v, do = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=i < 3) for i in range(4))
        fwd_flops = 4 * B * H * T * T * d / 2
        f_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
        print(f"[{B}, {H}, {T}, {d}] bf16 causal SDPA   fwd {f_ms:7.3f} ms "
              f"{fwd_flops / f_ms / 1e9:6.1f} TFLOP/s   bwd {b_ms:7.3f} ms "
              f"{2.5 * fwd_flops / b_ms / 1e9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
