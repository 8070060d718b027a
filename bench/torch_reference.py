#!/usr/bin/env python3
"""The training step of bench/train_step.cpp in PyTorch: checked against minitrain, then timed
beside it on the same GPU.

    python3 bench/torch_reference.py --dir DIR [--size small|large|all]

DIR is what `train_step --export DIR` wrote: <size>_init.safetensors (the initial weights under
minitrain's state_dict names), <size>_batch.safetensors (x f32, y i64), <size>_losses.txt (the
losses of minitrain's first 20 steps) and <size>_timing.json (minitrain's ms/step, eager and as
a CUDA graph).

The model and dtype policy are minitrain's: the batch cast to bf16 once, outside the step; fp32
parameters; the GEMMs in bf16 through
torch.autocast; RMSNorm by torch.nn.functional.rms_norm in fp32 (y = x * rsqrt(mean(x^2) + 1e-5)
* weight) and returned in bf16; ScaledSiLU as w * x * sigmoid(x) with a scalar parameter w of shape [1], returned in
bf16; cross_entropy with reduction "sum" divided by the step's sample count; clip_grad_norm_(1.0);
fused AdamW that decays only the >= 2-D weights.

1. Check: 20 eager steps from the same weights on the same batch; every step's loss must be within
   a relative LOSS_RTOL of minitrain's, or the script prints both curves and exits 1 (no timing).
2. Time, with torch.cuda.Event around each step and the host waiting for it (as train_step does):
   eager; torch.compile(model) in the default mode, mode="max-autotune" and mode="reduce-overhead"
   (compile + CUDA graphs), each compile time reported separately; and, for the small size, the
   whole eager step captured in one CUDA graph and replayed. A variant that fails says why in the
   table (the exception's first line) and the others still run. MT_TORCH_VARIANTS (a
   comma-separated list of the names in VARIANTS) runs only those.
3. Print the side-by-side table: ratio = ms / minitrain ms, against minitrain eager and against
   minitrain's CUDA graph (> 1: minitrain is faster).
"""
import argparse
import json
import math
import os
import sys
import time

# ---- the run's settings, all here: bench/train_step.cpp has the same values and must match -----
MICROBATCHES = 4
LR = 1e-4
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.1  # Linear weights only (parameters of >= 2 dims); the rest get 0
CLIP_NORM = 1.0
RMS_EPS = 1e-5
WARMUP_STEPS = 3
LOSS_STEPS = 20
# Both sides run bf16 GEMMs, but not the same kernels (PyTorch rounds each microbatch's dW to
# bf16, minitrain accumulates it in fp32), so the curves agree closely, not bitwise.
LOSS_RTOL = 2e-2

SIZES = {
    "small": dict(inp=784, hidden=1024, classes=10, microbatch=128, timed_steps=50),
    "large": dict(inp=4096, hidden=8192, classes=4096, microbatch=8192, timed_steps=10),
}


def die(message, code=1):
    print(f"torch_reference: {message}", file=sys.stderr)
    sys.exit(code)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file
except ImportError as e:
    die(f"needs PyTorch and safetensors ({e})")


# The variants timed, by name (MT_TORCH_VARIANTS selects among them).
VARIANTS = ["eager", "compile", "max-autotune", "reduce-overhead", "eager-graph"]


class RMSNorm(nn.Module):
    """PyTorch's own rms_norm (torch >= 2.4), on the fp32 upcast of x: minitrain's fp32 math."""

    def __init__(self, dim, eps=RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)


class ScaledSiLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        # w (fp32, shape [1]) promotes the product to fp32; rounded once to x's dtype, as ours.
        return (self.w * x * torch.sigmoid(x)).to(x.dtype)


def make_model(cfg):
    # Children 0..6: the state_dict names are minitrain's (0.weight, 0.bias, 1.weight, 2.w, ...).
    h = cfg["hidden"]
    return nn.Sequential(
        nn.Linear(cfg["inp"], h), RMSNorm(h), ScaledSiLU(),
        nn.Linear(h, h), RMSNorm(h), ScaledSiLU(),
        nn.Linear(h, cfg["classes"]))


def make_optimizer(model, capturable=False):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True, capturable=capturable)


def autocast():
    # Each weight is cast once per forward, so autocast's cast cache saves nothing here, and
    # CUDA-graph capture needs it off; one setting for every variant.
    return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


def train_step(model, optimizer, params, x, y, microbatch, zero_grad=True, mark_step=False):
    """One optimizer step; returns its loss (the batch mean) as a device scalar, never read here.
    mark_step: tell torch.compile's CUDA graphs (modes "reduce-overhead" and "max-autotune")
    that each microbatch's forward starts a new replay."""
    normalizer = float(MICROBATCHES * microbatch)
    loss_sum = torch.zeros((), device=x.device)
    for k in range(MICROBATCHES):
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        xk = x[k * microbatch:(k + 1) * microbatch]
        yk = y[k * microbatch:(k + 1) * microbatch]
        with autocast():
            loss = F.cross_entropy(model(xk), yk, reduction="sum") / normalizer
        loss.backward()
        loss_sum += loss.detach()
    torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
    optimizer.step()
    if zero_grad:
        # Under torch.compile's CUDA graphs a gradient set to None would next be taken over from
        # the backward graph's output memory, which the next replay overwrites: keep the buffers
        # and add into them instead.
        optimizer.zero_grad(set_to_none=not mark_step)
    return loss_sum


def median(values):
    return sorted(values)[len(values) // 2]  # train_step's definition (the upper middle)


def time_steps(step, warmup, reps):
    """Milliseconds of each of `reps` calls of step(), after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


# ---- inputs ------------------------------------------------------------------------------------

def need(path):
    if not os.path.isfile(path):
        die(f"{path} is missing: run `train_step --export {os.path.dirname(path) or '.'}` first")
    return path


def load_init(model, path):
    """Loads minitrain's initial weights; returns them (on the GPU) for reloading later."""
    state = load_file(need(path), device="cuda")
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        die(f"{path}: the names do not map onto the model: missing {missing}, unexpected {unexpected} "
            f"(the model expects {list(expected)})")
    for k, v in expected.items():
        if state[k].shape != v.shape or state[k].dtype != v.dtype:
            die(f"{path}: '{k}' is {tuple(state[k].shape)} {state[k].dtype} but the model has "
                f"{tuple(v.shape)} {v.dtype}")
    model.load_state_dict(state)
    return state


def load_batch(path, cfg):
    batch = load_file(need(path), device="cuda")
    for k in ("x", "y"):
        if k not in batch:
            die(f"{path}: no tensor '{k}' (has {list(batch)})")
    x, y = batch["x"], batch["y"]
    n = MICROBATCHES * cfg["microbatch"]
    if x.dtype != torch.float32 or tuple(x.shape) != (n, cfg["inp"]):
        die(f"{path}: x is {tuple(x.shape)} {x.dtype}, expected ({n}, {cfg['inp']}) float32")
    if y.dtype != torch.int64 or tuple(y.shape) != (n,):
        die(f"{path}: y is {tuple(y.shape)} {y.dtype}, expected ({n},) int64")
    return x, y


def read_losses(path):
    with open(need(path)) as f:
        losses = [float(line) for line in f if line.strip()]
    if len(losses) != LOSS_STEPS:
        die(f"{path}: {len(losses)} losses, expected {LOSS_STEPS}")
    return losses


def read_ours(path):
    """minitrain's ms/step from train_step's timing file, eager and CUDA graph, or {} if there is
    none."""
    if not os.path.isfile(path):
        print(f"torch_reference: {path} is missing: no minitrain time to compare with")
        return {}
    with open(path) as f:
        timing = json.load(f)
    ours = {"minitrain eager": float(timing["ms_per_step"])}
    if "ms_per_step_graph" in timing:
        ours["minitrain CUDA graph"] = float(timing["ms_per_step_graph"])
    return ours


# ---- one size ----------------------------------------------------------------------------------

def check_losses(name, model, optimizer, params, x, y, cfg, ours):
    """20 eager steps; False (after printing both curves) if any loss is off by more than
    LOSS_RTOL relative to minitrain's, or is not finite."""
    theirs = []
    for _ in range(LOSS_STEPS):
        theirs.append(train_step(model, optimizer, params, x, y, cfg["microbatch"]).item())
    devs = [abs(t - o) / abs(o) if o != 0 else math.inf for t, o in zip(theirs, ours)]
    worst = max(devs)
    ok = all(math.isfinite(v) for v in theirs + ours) and worst <= LOSS_RTOL
    print(f"torch_reference {name}: first {LOSS_STEPS} losses, max relative deviation from minitrain "
          f"{worst:.2e} (step {devs.index(worst) + 1}; tolerance {LOSS_RTOL:.0e}): "
          f"{'agree' if ok else 'DISAGREE'}; minitrain {ours[0]:.6f} -> {ours[-1]:.6f}, "
          f"torch {theirs[0]:.6f} -> {theirs[-1]:.6f}")
    if not ok:
        print(f"{'step':>4} {'minitrain':>12} {'torch':>12} {'rel. dev.':>10}")
        for i, (o, t, d) in enumerate(zip(ours, theirs, devs)):
            print(f"{i + 1:>4} {o:>12.6f} {t:>12.6f} {d:>10.2e}")
    return ok


def capture_step(model, optimizer, params, x, y, microbatch):
    """The whole step (4 microbatches, clip, AdamW) in one CUDA graph, following PyTorch's
    whole-network capture recipe: warm up on a side stream, set the grads to None, capture.
    Each replay's first backward then writes the grads afresh and the next three add to them.
    `optimizer` must be capturable. Returns the graph and its (static) loss tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            train_step(model, optimizer, params, x, y, microbatch)
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = train_step(model, optimizer, params, x, y, microbatch, zero_grad=False)
    return graph, loss


def run_size(name, directory):
    """Checks, then times one size and prints its table; exits 1 if the check fails."""
    cfg = SIZES[name]
    base = os.path.join(directory, name)
    ours_losses = read_losses(base + "_losses.txt")
    ours = read_ours(base + "_timing.json")
    with torch.device("cuda"):
        model = make_model(cfg)
    init = load_init(model, base + "_init.safetensors")
    x, y = load_batch(base + "_batch.safetensors", cfg)
    x = x.to(torch.bfloat16)  # once, before the step, as train_step does (a loader's job)
    params = list(model.parameters())
    mb, reps = cfg["microbatch"], cfg["timed_steps"]
    samples = MICROBATCHES * mb

    if not check_losses(name, model, make_optimizer(model), params, x, y, cfg, ours_losses):
        die(f"{name}: PyTorch's losses do not match minitrain's: not timing anything")

    rows = []  # (variant, median ms or None when it did not run, note)
    last = {}  # the loss tensor of the latest step, read once timing is over
    wanted = os.environ.get("MT_TORCH_VARIANTS", ",".join(VARIANTS)).split(",")

    def fresh_start(capturable=False):
        """The initial weights again (in place: the parameters keep their identity), no grads,
        a new optimizer."""
        model.load_state_dict(init)
        for p in params:
            p.grad = None
        return make_optimizer(model, capturable)

    def attempt(key, label, run):
        """Times one variant (run() -> (ms, note)); a failure becomes its row's reason."""
        if key not in wanted:
            return
        try:
            ms, note = run()
            rows.append((label, ms, note))
        except Exception as e:  # noqa: BLE001: any failure is reported, the rest still runs
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            rows.append((label, None, f"did not run: {type(e).__name__}: {first}"[:160]))
            try:
                torch.cuda.synchronize()  # the failed variant's queued work, before the next
            except Exception:  # noqa: BLE001: the failure is already in its row
                pass

    def eager():
        optimizer = fresh_start()

        def step():
            last["loss"] = train_step(model, optimizer, params, x, y, mb)
        return median(time_steps(step, WARMUP_STEPS, reps)), "F.rms_norm"

    def compiled(mode):
        def run():
            optimizer = fresh_start()
            graphs = mode in ("reduce-overhead", "max-autotune")
            if graphs:  # gradient buffers of their own before the first backward (see train_step)
                for p in params:
                    p.grad = torch.zeros_like(p)
            torch._dynamo.reset()  # each mode compiles afresh
            net = torch.compile(model) if mode is None else torch.compile(model, mode=mode)

            def step():
                last["loss"] = train_step(net, optimizer, params, x, y, mb, mark_step=graphs)
            t0 = time.perf_counter()
            step()  # compiles the forward and the backward: the first of the warm-up steps
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            return (median(time_steps(step, WARMUP_STEPS - 1, reps)),
                    f"compile + first step {compile_s:.1f} s")
        return run

    def eager_graph():
        graph, last["loss"] = capture_step(model, fresh_start(capturable=True), params, x, y, mb)
        return median(time_steps(graph.replay, WARMUP_STEPS, reps)), "whole step captured"

    attempt("eager", "torch eager", eager)
    # Before the compiled variants: a capture after torch.compile's own CUDA graphs fails.
    if name == "small":
        attempt("eager-graph", "torch eager, CUDA graph", eager_graph)
    attempt("compile", "torch.compile default", compiled(None))
    attempt("max-autotune", "compile max-autotune", compiled("max-autotune"))
    attempt("reduce-overhead", "compile reduce-overhead", compiled("reduce-overhead"))
    torch._dynamo.reset()

    if "loss" in last:
        final = float(last["loss"].item())
        if not math.isfinite(final):
            die(f"{name}: the loss after the timed steps is {final}")

    print(f"\n== {name}: {samples} samples per step, median of {reps} steps; ratio = torch ms / "
          f"minitrain ms (> 1: minitrain is faster)")
    names = list(ours)
    print(f"   {'variant':<26} {'ms/step':>9} {'samples/s':>12}  " +
          "  ".join(f"{'vs ' + n.split()[-1]:>9}" for n in names) + "  note")
    for variant, ms, note in [(n, ours[n], "") for n in names] + rows:
        if ms is None:
            print(f"   {variant:<26} {'-':>9} {'-':>12}  " + "  ".join(f"{'-':>9}" for _ in names) +
                  f"  {note}")
            continue
        ratios = "  ".join(f"{ms / ours[n]:>9.2f}" for n in names)
        print(f"   {variant:<26} {ms:>9.3f} {samples / ms * 1e3:>12.0f}  {ratios}  {note}")
    for variant, ms, note in rows:
        if ms is None:
            print(f"torch_reference {name}: {variant} {note}")
            continue
        vs = ", ".join(f"{n} {ours[n]:.3f} ms/step (torch/minitrain {ms / ours[n]:.2f}x)" for n in names)
        print(f"torch_reference {name}: {variant} {ms:.3f} ms/step; {vs or 'no minitrain time'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="what `train_step --export DIR` wrote")
    parser.add_argument("--size", choices=["small", "large", "all"], default="all")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        die("no CUDA device")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    if not hasattr(F, "rms_norm"):
        die(f"torch {torch.__version__} has no torch.nn.functional.rms_norm (torch >= 2.4 does)")
    for name in SIZES:
        if args.size in (name, "all"):
            run_size(name, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
