#!/usr/bin/env python3
"""The GPT-2 124M step of bench/gpt_step.cpp in PyTorch: checked against minitrain, then timed
beside it on the same GPU, and the issue's goals printed with PASS or MISS.

    python3 bench/gpt_torch.py --dir DIR [--batch 16|64|all]

DIR is what `gpt_step --export DIR` wrote: gpt_init.safetensors (the initial parameters under
nanoGPT's names), gpt_b<B>_tokens.safetensors (tokens i64 [B, 1025]), gpt_b<B>_losses.txt
(minitrain's first 20 losses) and gpt_b<B>_timing.json (minitrain's figures).

The peer is nanoGPT's model, written here afresh as PyTorch users run it at its fastest: nn.Linear
and nn.LayerNorm modules, F.scaled_dot_product_attention(is_causal=True) (flash attention), GELU
with the tanh approximation, the head tied to the token embedding; fp32 parameters and bf16
autocast; loss = mean cross-entropy over the first 50257 of the 50304 padded logits (minitrain's
and llm.c's rule); clip_grad_norm_(1.0); fused AdamW (lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on every parameter of >= 2 dims). The whole batch is one forward and backward (B = 64:
one batch of 64, PyTorch's fastest; minitrain runs it the same way by default, or as microbatches
with gpt_step --microbatch, whose gradients add up to the same).

1. Check: 20 eager steps from minitrain's initial weights on the same tokens; each loss must be
   within LOSS_ATOL of minitrain's, or the script prints both curves and exits 1 (no timing).
2. Time, with torch.cuda.Event around each step and the host waiting for it (as gpt_step does):
   eager, torch.compile(model) default, and mode="max-autotune" (its CUDA graphs included);
   compile times reported apart. MT_TORCH_VARIANTS (comma-separated names of VARIANTS) runs only
   those: max-autotune compiles for minutes.
3. Print the table and the goals: minitrain's best step against the fastest compiled variant
   (tokens/s, >= 1.10x) and peak memory against torch.compile's (<=).
"""
import argparse
import json
import math
import os
import sys
import time

# ---- the run's settings: bench/gpt_step.cpp has the same values and must match ------------------
N_LAYER, N_HEAD, N_EMBD, T = 12, 12, 768, 1024
VOCAB, PADDED_VOCAB = 50257, 50304
LR, BETAS, EPS, WEIGHT_DECAY, CLIP_NORM = 1e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
WARMUP_STEPS, LOSS_STEPS = 3, 20
# Both sides run bf16 GEMMs and attention, but not the same kernels nor the same reduction orders,
# so the curves agree closely, not bitwise: a loss near ln(50257) = 10.8 within 0.02.
LOSS_ATOL = 0.02
TIMED = {16: 20, 64: 10}
VARIANTS = ["eager", "compile", "max-autotune"]
SPEEDUP_GOAL = 1.10


def die(message, code=1):
    print(f"gpt_torch: {message}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file
except ImportError as e:
    die(f"needs PyTorch and safetensors ({e})")
# The MLP step's timing, shared: the upper-middle median, and CUDA events around each step.
from torch_reference import median, time_steps  # noqa: E402 (bench/ is this script's directory)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        C = N_EMBD
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T_, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        heads = lambda t: t.view(B, T_, N_HEAD, C // N_HEAD).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(PADDED_VOCAB, N_EMBD), wpe=nn.Embedding(T, N_EMBD),
            h=nn.ModuleList(Block() for _ in range(N_LAYER)), ln_f=nn.LayerNorm(N_EMBD)))

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)  # the tied head
        # Autocast runs cross_entropy in fp32; torch.compile fuses the slice into it.
        return F.cross_entropy(logits[..., :VOCAB].reshape(-1, VOCAB), targets.reshape(-1))


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS, fused=True)


def train_step(model, optimizer, params, x, y, mark_step=False):
    """One optimizer step; returns its loss as a device scalar, never read here. mark_step: tell
    max-autotune's CUDA graphs that a new step begins."""
    if mark_step:
        torch.compiler.cudagraph_mark_step_begin()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=not mark_step)
    return loss.detach()


def need(path):
    if not os.path.isfile(path):
        die(f"{path} is missing: run `gpt_step --export {os.path.dirname(path) or '.'}` first")
    return path


def run_batch(B, directory):
    base = os.path.join(directory, f"gpt_b{B}")
    ours = json.load(open(need(base + "_timing.json")))
    ours_losses = [float(v) for v in open(need(base + "_losses.txt")).read().split()]
    init = load_file(need(os.path.join(directory, "gpt_init.safetensors")), device="cuda")
    tokens = load_file(need(base + "_tokens.safetensors"), device="cuda")["tokens"]
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    with torch.device("cuda"):
        model = GPT()
    missing, unexpected = model.load_state_dict(init, strict=False)
    if missing or unexpected:
        die(f"the initial weights do not fit the model: missing {missing}, unexpected {unexpected}")
    params = list(model.parameters())

    def fresh_start():
        model.load_state_dict(init, strict=False)
        for p in params:
            p.grad = None
        return make_optimizer(model)

    optimizer = fresh_start()
    theirs = [float(train_step(model, optimizer, params, x, y)) for _ in range(LOSS_STEPS)]
    worst = max(abs(a - b) for a, b in zip(theirs, ours_losses))
    print(f"\n== B={B}: the first {LOSS_STEPS} losses, PyTorch eager vs minitrain: max |diff| "
          f"{worst:.2e} (tolerance {LOSS_ATOL})")
    if not worst <= LOSS_ATOL:
        for i, (a, b) in enumerate(zip(theirs, ours_losses)):
            print(f"   step {i:2d}: torch {a:.6f}  minitrain {b:.6f}")
        die(f"B={B}: PyTorch's losses do not match minitrain's: not timing anything")
    print(f"gpt_torch B={B} loss check: PASS ({theirs[0]:.6f} ... {theirs[-1]:.6f} vs minitrain "
          f"{ours_losses[0]:.6f} ... {ours_losses[-1]:.6f})")

    wanted = os.environ.get("MT_TORCH_VARIANTS", ",".join(VARIANTS)).split(",")
    rows = {}  # variant -> (ms, peak bytes, note)
    for variant in VARIANTS:
        if variant not in wanted:
            continue
        try:
            optimizer = fresh_start()
            torch._dynamo.reset()
            graphs = variant == "max-autotune"
            if graphs:  # gradient buffers of their own before the first backward (see train_step)
                for p in params:
                    p.grad = torch.zeros_like(p)
            net = model if variant == "eager" else (
                torch.compile(model) if variant == "compile" else torch.compile(model, mode=variant))
            step = lambda: train_step(net, optimizer, params, x, y, mark_step=graphs)  # noqa: E731
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            torch.cuda.reset_peak_memory_stats()
            ms = median(time_steps(step, WARMUP_STEPS - 1, TIMED[B]))
            rows[variant] = (ms, torch.cuda.max_memory_allocated(), f"first step {first_s:.1f} s")
        except Exception as e:  # noqa: BLE001: a failure is reported, the others still run
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"gpt_torch B={B}: {variant} did not run: {type(e).__name__}: {first}"[:200])
        torch.cuda.synchronize()
    torch._dynamo.reset()

    tokens_per_step = B * T
    print(f"   {'variant':<22} {'ms/step':>9} {'tok/s':>10} {'peak GiB':>9}  note")
    microbatch = ours["microbatch"]
    print(f"   minitrain: {B // microbatch} microbatch(es) of {microbatch}; PyTorch: one batch of {B}")
    table = [("minitrain eager", ours["ms_per_step"], ours["peak_bytes_eager"], ""),
             ("minitrain CUDA graph", ours["ms_per_step_graph"], ours["peak_bytes_graph"],
              f"{ours['graph_losses_equal']} of {ours['loss_steps']} losses = eager")]
    table += [(f"torch {v}", ms, peak, note) for v, (ms, peak, note) in rows.items()]
    for name, ms, peak, note in table:
        print(f"   {name:<22} {ms:>9.2f} {tokens_per_step / ms * 1e3:>10.0f} {peak / 2**30:>9.2f}  {note}")
        print(f"gpt_torch B={B} {name}: {ms:.2f} ms/step, {tokens_per_step / ms * 1e3:.0f} tok/s, "
              f"peak {peak / 2**30:.2f} GiB")

    best_ours = min(ours["ms_per_step"], ours["ms_per_step_graph"])
    compiled = {v: rows[v] for v in ("compile", "max-autotune") if v in rows}
    if compiled:
        v, (ms, _, _) = min(compiled.items(), key=lambda kv: kv[1][0])
        ratio = ms / best_ours
        print(f"gpt_torch goal B={B} tokens/s vs the fastest torch.compile ({v}): {ratio:.3f}x "
              f"(target >= {SPEEDUP_GOAL:.2f}x): {'PASS' if ratio >= SPEEDUP_GOAL else 'MISS'}")
    if "compile" in rows:
        ours_peak = ours["peak_bytes_graph"] if ours["ms_per_step_graph"] <= ours["ms_per_step"] \
            else ours["peak_bytes_eager"]
        theirs_peak = rows["compile"][1]
        print(f"gpt_torch goal B={B} peak memory vs torch.compile: {ours_peak / 2**30:.2f} GiB vs "
              f"{theirs_peak / 2**30:.2f} GiB (target <=): "
              f"{'PASS' if ours_peak <= theirs_peak else 'MISS'}")
    n = ours["params"]
    mfu_den = ours["cublas_bf16_tflops"]
    print(f"gpt_torch B={B} MFU (6N + 6LCT per token over the bare bf16 GEMM {mfu_den:.0f} TFLOP/s): "
          f"minitrain {ours['flop_per_token'] * tokens_per_step / best_ours / 1e9 / mfu_den:.1%}" +
          "".join(f", torch {v} {ours['flop_per_token'] * tokens_per_step / ms / 1e9 / mfu_den:.1%}"
                  for v, (ms, _, _) in rows.items()) + f" (N = {n:.0f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="what `gpt_step --export DIR` wrote")
    parser.add_argument("--batch", choices=["16", "64", "all"], default="all")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        die("no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for B in (16, 64):
        if args.batch in (str(B), "all"):
            run_batch(B, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
