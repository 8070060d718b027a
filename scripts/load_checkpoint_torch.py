#!/usr/bin/env python3
"""Loads a minitrain GPT checkpoint into the PyTorch GPT of scripts/shakespeare_reference.py and
prints its validation loss on the run's own validation windows: `train eval` in PyTorch.

    python3 scripts/load_checkpoint_torch.py CHECKPOINT [--data FILE] [--device cpu|cuda]
    val: loss 2.14398324 (128 windows)

CHECKPOINT is a model file (runs/x/step-000350.safetensors, runs/x/best.safetensors) or a run
folder (its newest step-N.safetensors; unlike `train`, this script verifies no checksums). The
file's metadata holds the run's config, which gives the model's shape and the data: data.kind
text with tokenizer bytes (data.path read as bytes) or data.kind tokens (an llm.c shard);
--data replaces data.path (a relative one is relative to this process's working directory, as
for `train`). The validation windows are minitrain's (data/token_windows.h): eval_windows windows
of T + 1 tokens spread evenly over the last round(val_fraction · n) tokens, or with 0 the windows
that tile them, T apart.

The checkpoint's tensors carry nanoGPT's names (docs/gpt.md has the table), so they load into the
nn.Module with load_state_dict, after adding nanoGPT's second name of the tied table,
lm_head.weight = transformer.wte.weight. The loss leaves out the padded vocabulary's logits (ids
≥ vocab_size), as minitrain's does. The test GptTorch.CheckpointLoadsIntoPyTorchWithTheSameValLoss
trains a tiny GPT, runs `train eval` and this script, and compares the two.
"""
import argparse
import os
import re
import sys

import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import read_safetensors  # noqa: E402
from shakespeare_reference import GPT, split_begin, validation_loss, validation_starts  # noqa: E402


def model_file(path):
    if not os.path.isdir(path):
        return path
    steps = [(int(m.group(1)), f) for f in os.listdir(path) if (m := re.fullmatch(r"step-(\d+)\.safetensors", f))]
    if not steps:
        sys.exit(f"{path}: no step-*.safetensors checkpoint in it")
    return os.path.join(path, max(steps)[1])


def read_tokens(data, path):
    if data.get("kind") == "tokens":
        with open(path, "rb") as f:
            blob = f.read()
        header = torch.frombuffer(bytearray(blob[:1024]), dtype=torch.int32)
        if header[0].item() != 20240520 or header[1].item() != 1:
            sys.exit(f"{path}: not an llm.c token shard of version 1")
        return torch.frombuffer(bytearray(blob[1024:]), dtype=torch.int16).to(torch.int64) & 0xFFFF
    if data.get("tokenizer", "bytes") != "bytes":
        sys.exit(f"data.tokenizer {data.get('tokenizer')}: this script reads bytes; write the tokens as a "
                 "shard with `train tokenize` and pass a run of data.kind tokens")
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).to(torch.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--data", help="the text or shard, instead of the config's data.path")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    path = model_file(a.checkpoint)
    tensors, meta = read_safetensors(path)
    if "config" not in meta:
        sys.exit(f"{path}: no 'config' in its metadata: not a model file `train` saved")
    cfg = yaml.safe_load(meta["config"])
    m, data = cfg["model"], cfg["data"]
    if m.get("kind") != "gpt":
        sys.exit(f"{path}: model.kind is {m.get('kind')}, not gpt")

    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["block_size"], m["vocab_size"],
                m.get("padded_vocab_size", 0), bias=m.get("bias", True))
    state = {k: v.to(torch.float32) for k, v in tensors.items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # nanoGPT's second name of the tied table
    model.load_state_dict(state, strict=True)
    device = torch.device(a.device)
    model.to(device)

    tokens = read_tokens(data, a.data or data["path"])
    T = data.get("block_size", 0) or m["block_size"]
    count = data.get("eval_windows", 256)
    begin = split_begin(len(tokens), data.get("val_fraction", 0.1))
    windows = len(validation_starts(len(tokens) - begin - T, count, T))
    loss = validation_loss(model, tokens, begin, T, count, cfg.get("eval", {}).get("batch_size", 1024), device,
                           lambda: torch.autocast(device_type=device.type, enabled=False))
    print(f"val: loss {loss:.8f} ({windows} windows)")


if __name__ == "__main__":
    main()
