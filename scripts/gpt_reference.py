#!/usr/bin/env python3
"""The GPT of nn/gpt.cpp, written again in PyTorch: the reference minitrain's GPT is checked against.

    python3 scripts/gpt_reference.py INIT OUT [--device cpu|cuda]

INIT is a safetensors file minitrain wrote (tests/test_gpt_parity.cpp, the disabled test
GptParity.WriteInit): the GPT's initial parameters under their checkpoint names, the token batch
`tokens` [B, T + 1] (inputs are tokens[:, :-1], targets tokens[:, 1:]), and in its metadata the
model's shape (n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size) and the AdamW
settings (lr, beta1, beta2, eps, weight_decay, steps). OUT receives, in float32:

    param.<name>   the initial parameters (INIT's, copied, so OUT stands alone)
    tokens         the batch
    logits         [B, T, padded_vocab_size] of the first forward pass
    loss           the mean next-token cross-entropy over the B·T targets (vocab_size classes)
    grad.<name>    every parameter's gradient of that loss
    losses         [steps]: the loss before each of `steps` AdamW updates on the same batch

This is what llm.c's test_gpt2 does with GPT-2's weights; here the model is tiny so the file can be
committed (tests/data/gpt_reference.safetensors) and checked on every CPU test run.

The math is spelled out with plain tensor ops (no fused attention, no torch.compile) so the script
runs unchanged on PyTorch 1.13 (CPU) and 2.x (CPU or GPU). Matmuls are forced to full fp32 (no
TF32) so a GPU run writes the same reference as a CPU run within f32 rounding.

Architecture (GPT-2's, as in nanoGPT): learned token and position embeddings; n_layer pre-LayerNorm
blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)); a final LayerNorm; logits = x · wteᵀ (the head
is tied to the token embedding, so it has no parameter of its own). Attention is causal over a
[B, T, 3C] projection split into q, k, v and n_head heads of C / n_head; the MLP is
Linear(C, 4C) → GELU (tanh approximation) → Linear(4C, C). LayerNorm eps is 1e-5. The padded
vocabulary's extra logits (ids ≥ vocab_size) are left out of the loss, as llm.c does, so they get
no gradient.
"""
import argparse
import json
import math
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata). The format: u64 header length, JSON header, bytes."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        raw = bytearray(blob[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(e["shape"]).clone()
    return tensors, metadata


def write_safetensors(path, tensors, metadata):
    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        data = t.numpy().tobytes()  # little-endian on every machine PyTorch runs on
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


class GPT(torch.nn.Module):
    """Parameters under nanoGPT's names; the head reuses transformer.wte.weight."""

    def __init__(self, n_layer, n_head, n_embd, block_size, padded_vocab_size):
        super().__init__()
        self.n_layer, self.n_head = n_layer, n_head
        C = n_embd
        p = {"transformer.wte.weight": (padded_vocab_size, C), "transformer.wpe.weight": (block_size, C)}
        for i in range(n_layer):
            h = f"transformer.h.{i}."
            p.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                      h + "attn.c_attn.weight": (3 * C, C), h + "attn.c_attn.bias": (3 * C,),
                      h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                      h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                      h + "mlp.c_fc.weight": (4 * C, C), h + "mlp.c_fc.bias": (4 * C,),
                      h + "mlp.c_proj.weight": (C, 4 * C), h + "mlp.c_proj.bias": (C,)})
        p.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
        self.shapes = p
        self.params = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(torch.zeros(s))
                                              for k, s in p.items()})

    def w(self, name):
        return self.params[name.replace(".", "__")]

    def named(self):
        return [(k, self.w(k)) for k in self.shapes]

    def forward(self, idx):
        B, T = idx.shape
        C = self.w("transformer.wte.weight").shape[1]
        H, d = self.n_head, C // self.n_head
        F = torch.nn.functional
        x = self.w("transformer.wte.weight")[idx] + self.w("transformer.wpe.weight")[:T]
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
        for i in range(self.n_layer):
            h = f"transformer.h.{i}."
            a = F.layer_norm(x, (C,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), 1e-5)
            qkv = F.linear(a, self.w(h + "attn.c_attn.weight"), self.w(h + "attn.c_attn.bias"))
            q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in qkv.split(C, dim=2))
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
            s = s.masked_fill(~mask, float("-inf"))
            y = (s.softmax(dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.linear(y, self.w(h + "attn.c_proj.weight"), self.w(h + "attn.c_proj.bias"))
            m = F.layer_norm(x, (C,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), 1e-5)
            m = gelu_tanh(F.linear(m, self.w(h + "mlp.c_fc.weight"), self.w(h + "mlp.c_fc.bias")))
            x = x + F.linear(m, self.w(h + "mlp.c_proj.weight"), self.w(h + "mlp.c_proj.bias"))
        x = F.layer_norm(x, (C,), self.w("transformer.ln_f.weight"), self.w("transformer.ln_f.bias"), 1e-5)
        return x @ self.w("transformer.wte.weight").t()


def gelu_tanh(x):
    """GPT-2's GELU, F.gelu(x, approximate="tanh") written out (that argument is new in 1.12)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def lm_loss(logits, targets, vocab_size):
    V = vocab_size
    return torch.nn.functional.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("init")
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    tensors, meta = read_safetensors(args.init)
    cfg = {k: int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                                      "padded_vocab_size", "steps")}
    opt = {k: float(meta[k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay")}
    dev = torch.device(args.device)
    model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"],
                cfg["padded_vocab_size"]).to(dev)
    missing = [k for k in model.shapes if k not in tensors]
    if missing:
        sys.exit(f"{args.init}: no parameter {missing[0]}")
    with torch.no_grad():
        for name, p in model.named():
            p.copy_(tensors[name].to(torch.float32))
    tokens = tensors["tokens"].to(torch.int64).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]

    out = {"param." + k: p.detach().clone() for k, p in model.named()}
    out["tokens"] = tokens
    logits = model(x)
    loss = lm_loss(logits, y, cfg["vocab_size"])
    loss.backward()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(())
    for k, p in model.named():
        out["grad." + k] = p.grad.detach().clone()

    # AdamW on the same batch, weight decay on parameters of 2 or more dimensions.
    params = [p for _, p in model.named()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": opt["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    losses = []
    for step in range(cfg["steps"]):
        adamw.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y, cfg["vocab_size"])
        loss.backward()
        adamw.step()
        losses.append(loss.item())
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    meta = dict(meta, reference=f"scripts/gpt_reference.py, PyTorch {torch.__version__}, {args.device}")
    write_safetensors(args.out, out, meta)
    print(f"{args.out}: loss {out['loss'].item():.6f}, after {cfg['steps']} AdamW steps "
          f"{losses[-1]:.6f} (PyTorch {torch.__version__}, {args.device})")


if __name__ == "__main__":
    main()
