#!/usr/bin/env python3
"""nanoGPT's shakespeare_char recipe in PyTorch, on minitrain's data split: the reference that
configs/shakespeare-gpu.yaml is timed against.

    python3 scripts/shakespeare_reference.py [--device cuda] [--steps 5000] [--compile 1]
    python3 scripts/shakespeare_reference.py --device cpu --steps 20 --compile 0 --dtype f32 \\
        --eval-every 10 --eval-windows 64 --batch 8      # a smoke check on a CPU

The recipe (nanoGPT's config/train_shakespeare_char.py with train.py's defaults): a GPT of 6
layers, 6 heads, 384 wide, 256 tokens of context, no biases, dropout 0.2; batches of 64 windows;
AdamW (betas 0.9, 0.99, weight decay 0.1 on the matrices and embeddings, fused on a GPU) at lr
1e-3 with 100 warmup steps and a cosine to 1e-4 at step 5000; gradient clipping at 1.0; bf16
autocast; torch.compile. It prints the validation loss every 250 steps, the best one, and the wall
time of the whole run (compilation and evaluations included, as minitrain's wall time includes
its evaluations).

The data is what minitrain's `data.kind: text, tokenizer: bytes` reads (data/token_windows.h):
the file's bytes as tokens (256 ids), the last round(0.1 · n) of them held out for validation,
training windows of T + 1 tokens drawn uniformly from the first part (another generator than
minitrain's, the same distribution), and validation on eval_windows = 12800 windows (nanoGPT's 200
batches of 64) spread evenly over the held-out part: start i · (N − 1) // (count − 1) of its N
windows, exactly minitrain's. So the two validation losses are over the very same windows.

One difference from nanoGPT, to match minitrain: the tokens are bytes, not nanoGPT's 65
characters (the unused ids get no probability after a few steps). Dropout is nanoGPT's, in its three
places: after the embeddings, on each residual branch, and on the attention probabilities
(scaled_dot_product_attention's dropout_p in training), as minitrain's model applies it;
--attn-dropout sets the last one apart (default: --dropout).

The model (class GPT) has nanoGPT's parameter names, so scripts/load_checkpoint_torch.py loads a
minitrain checkpoint into it. It runs on PyTorch 2.x (GPU or CPU) and, with --compile 0, on 1.13.
"""
import argparse
import inspect
import math
import time

import torch
import torch.nn as nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, bias, dropout, attn_dropout):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.attn_dropout = attn_dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.attn_dropout if self.training else 0.0
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: the fused kernels
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # 1.13
            s = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            y = F.dropout(s.softmax(dim=-1), p) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, n_embd, bias, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))  # GELU, tanh
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias, dropout, attn_dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5, elementwise_affine=True)
        self.attn = CausalSelfAttention(n_embd, n_head, bias, dropout, attn_dropout)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5, elementwise_affine=True)
        self.mlp = MLP(n_embd, bias, dropout)
        if not bias:  # nanoGPT's LayerNorm(bias=False), in a way 1.13 has too
            self.ln_1.bias = self.ln_2.bias = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 as nanoGPT writes it. `vocab_size` real ids; the token table has `padded_vocab_size`
    rows (minitrain pads to a multiple of 64) whose extra logits the loss leaves out."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size=None,
                 bias=True, dropout=0.0, attn_dropout=None):
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout  # nanoGPT: one dropout
        self.vocab_size = vocab_size
        padded = padded_vocab_size or (vocab_size + 63) // 64 * 64
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(padded, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, bias, dropout, attn_dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5)))
        if not bias:
            self.transformer.ln_f.bias = None
        self.lm_head = nn.Linear(n_embd, padded, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        # GPT-2's initialization; the residual projections scaled by 1 / sqrt(2 · n_layer).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        with torch.no_grad():
            self.transformer.wte.weight[vocab_size:] = 0

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))[..., :self.vocab_size]
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


# ---- minitrain's token windows (data/token_windows.cpp) ---------------------------------------

def split_begin(n, val_fraction):
    """The first validation position: n − round(val_fraction · n) (llround: halves away from 0)."""
    return n - int(math.floor(val_fraction * n + 0.5))


def validation_starts(windows, count, T):
    """minitrain's validation windows (data/token_windows.h): `count` spread evenly, or with 0 the
    windows that tile the split, T apart."""
    if count == 0:
        return list(range(0, windows, T))
    if count >= windows:
        return list(range(windows))
    return [0] if count == 1 else [i * (windows - 1) // (count - 1) for i in range(count)]


def window_batch(tokens, starts, T):
    idx = torch.as_tensor(starts).unsqueeze(1) + torch.arange(T + 1).unsqueeze(0)
    w = tokens[idx]
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def validation_loss(model, tokens, begin, T, count, batch, device, autocast):
    """Mean next-token loss over minitrain's validation windows of tokens[begin:] (every window
    has T targets, so the mean of window means is the mean)."""
    was_training = model.training
    model.eval()
    val = tokens[begin:]
    starts = validation_starts(len(val) - T, count, T)
    total = 0.0
    for b in range(0, len(starts), batch):
        x, y = window_batch(val, starts[b:b + batch], T)
        with autocast():
            _, loss = model(x.to(device), y.to(device))
        total += loss.item() * (len(starts[b:b + batch]))
    model.train(was_training)
    return total / len(starts)


def lr_at(step, lr, min_lr, warmup, steps):
    """minitrain's schedule (optim/schedule.cpp): linear warmup from lr / warmup, then a cosine."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= steps:
        return min_lr
    progress = (step - warmup) / (steps - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="assets/tinyshakespeare.txt")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default=None, help="default: bf16 on a GPU, f32 on a CPU")
    ap.add_argument("--compile", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--attn-dropout", type=float, default=None, help="default: --dropout")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=200 * 64)
    ap.add_argument("--eval-batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    dtype = a.dtype or ("bf16" if device.type == "cuda" else "f32")
    torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT's setting; bf16 autocast does the rest
    torch.backends.cudnn.allow_tf32 = True

    with open(a.data, "rb") as f:
        tokens = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to(torch.int64)
    begin = split_begin(len(tokens), 0.1)
    T = a.block_size
    train_windows = begin - T

    model = GPT(a.n_layer, a.n_head, a.n_embd, T, 256, bias=False, dropout=a.dropout,
                attn_dropout=a.attn_dropout).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.99), eps=1e-8, **({"fused": True} if fused else {}))
    step_model = torch.compile(model) if a.compile else model

    def autocast():
        if dtype == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return torch.autocast(device_type=device.type, enabled=False)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    n_params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} on {device} ({dtype}{', compiled' if a.compile else ''}"
          f"{', fused AdamW' if fused else ''}): {n_params} parameters, {a.steps} steps of "
          f"{a.batch} x {T}; {len(tokens)} tokens, validation from {begin}", flush=True)
    best, best_step = float("inf"), 0
    sync()
    t0 = time.time()
    model.train()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.min_lr, a.warmup, a.steps)
        x, y = window_batch(tokens, torch.randint(train_windows, (a.batch,)).tolist(), T)
        with autocast():
            _, loss = step_model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            v = validation_loss(step_model, tokens, begin, T, a.eval_windows, a.eval_batch, device, autocast)
            if v < best:
                best, best_step = v, step + 1
            sync()
            print(f"step {step + 1}/{a.steps} | loss {loss.item():.4f} | val_loss {v:.4f} | "
                  f"best {best:.4f} (step {best_step}) | {time.time() - t0:.1f} s", flush=True)
    sync()
    print(f"best val_loss {best:.4f} at step {best_step}; wall time {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
