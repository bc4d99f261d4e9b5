#!/usr/bin/env python3
"""What the provenance op observer costs a host-bound step, on CPU torch (no
GPU needed): a small training step whose every op is host time, so that
the observer's per-op cost shows in full.

    python3 tests/bench/provenance_cpu.py --cli build/tools/allocscope \
        [--bridge build/tests/libtag_hooks_cpu.so] [--steps 300] [--repeat 5]
        [--layers 8] [--hidden 64] [--tokens 64]

8 layers of LayerNorm -> a linear whose forward quantizes its weight and its
input to int8 (per-tensor scaling, as an FP8 linear does with its casts) and
keeps the weight copy for backward -> GELU -> a plain nn.Linear, a residual
add, MSE loss and AdamW: the shape of tests/gpu/fsdp2_fp8_train.py's step,
on the CPU. Each configuration runs `--repeat` times, interleaved:

  plain                  no allocscope
  allocscope/no-prov     allocscope run --no-provenance --plugins none
  allocscope/open-gate   allocscope run --plugins none --provenance-steps all,
                         ALLOCSCOPE_PROVENANCE_GATE=0 (the observer on for every op
                         of every step)
  allocscope/every-step  allocscope run --plugins none --provenance-steps all
                         (gated, every step)
  allocscope             allocscope run --plugins none (the defaults: gated, the
                         first 4 steps, then 2 in every 100)

Prints each configuration's median step time over runs, its fastest run,
its overhead over plain, and the observer's own counters per step (ops
observed, callbacks' ns per op, ops that took the slow path, storages
declared) from ALLOCSCOPE_LOG=debug.
--bridge names the library with the op observer where the PyTorch bridge is
not built (a CPU-only build: build/tests/libtag_hooks_cpu.so).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys, time
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, H, T, STEPS = (int(a) for a in sys.argv[1:5])
    torch.manual_seed(0)
    torch.set_num_threads(1)

    def quantize(t):
        amax = t.detach().abs().amax().float().clamp(min=1e-12)
        scale = 127.0 / amax
        q = (t.detach().float() * scale).round().clamp(-127, 127).to(torch.int8)
        return q, scale.reciprocal()

    class QLinearFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            xq, xs = quantize(x)
            wq, ws = quantize(w)
            y = (xq.float() @ wq.float().t()) * (xs * ws)
            ctx.save_for_backward(x, wq, ws)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, wq, ws = ctx.saved_tensors
            wt = wq.t().contiguous()
            dx = dy @ (wt.float().t() * ws)
            dw = dy.t() @ x
            return dx, dw

    class QLinear(nn.Module):
        def __init__(self, n, k):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n, k) / k ** 0.5)
        def forward(self, x):
            return QLinearFn.apply(x, self.weight)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(H)
            self.fc1 = QLinear(4 * H, H)
            self.fc2 = nn.Linear(4 * H, H)
        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(L))
        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(T, H)
    target = torch.randn(T, H)
    for step in range(STEPS):
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("STEP_MS %d %.4f" % (step, (time.perf_counter() - t0) * 1e3), flush=True)
    """
)

STEP = re.compile(r"^STEP_MS (\d+) ([0-9.]+)$")
DEBUG = re.compile(r"provenance: (\d+) ops observed, (\d+) ns each, (\d+) on the slow path; "
                   r"\d+ seeds, \d+ derived storages, (\d+) declared")


def one(args, name, script, out):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", ALLOCSCOPE_LOG="debug")
    for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT",
                "ALLOCSCOPE_PROVENANCE", "ALLOCSCOPE_PROVENANCE_GATE"):
        env.pop(var, None)
    if args.bridge:
        env["ALLOCSCOPE_TORCH_BRIDGE"] = os.path.abspath(args.bridge)
    sizes = [str(args.layers), str(args.hidden), str(args.tokens), str(args.steps)]
    cmd = [sys.executable, script] + sizes
    if name == "allocscope/open-gate":
        env["ALLOCSCOPE_PROVENANCE_GATE"] = "0"
    if name != "plain":
        flags = {"allocscope/no-prov": ["--no-provenance"],
                 "allocscope/open-gate": ["--provenance-steps", "all"],
                 "allocscope/every-step": ["--provenance-steps", "all"]}.get(name, [])
        cmd = [args.cli, "run", "--force", "--out", out, "--plugins", "none"] + flags + [
            "--"] + cmd
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s" % (name, p.returncode, p.stderr[-3000:]))
    steps = [float(m.group(2)) for m in map(STEP.match, p.stdout.splitlines())
             if m and int(m.group(1)) >= args.skip]
    d = DEBUG.search(p.stderr)
    return statistics.fmean(steps), d.groups() if d else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--bridge", default="")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    names = ["plain", "allocscope/no-prov", "allocscope/open-gate", "allocscope/every-step",
             "allocscope"]
    means = {n: [] for n in names}
    counters = {}
    with tempfile.TemporaryDirectory(prefix="allocscope-provbench-") as d:
        script = os.path.join(d, "step.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        for _ in range(args.repeat):
            for n in names:
                ms, c = one(args, n, script, os.path.join(d, "out"))
                means[n].append(ms)
                if c:
                    counters[n] = c
    base = statistics.median(means["plain"])
    print("| configuration | median step (ms) | fastest run (ms) | overhead |")
    print("| --- | ---: | ---: | ---: |")
    for n in names:
        med = statistics.median(means[n])
        print("| %s | %.3f | %.3f | %s |" % (n, med, min(means[n]),
                                            "—" if n == "plain" else "%+.1f %%" % (100 * (med / base - 1))))
    print()
    print("| configuration | ops observed a step | callbacks, ns an op | slow path a step | declared a step |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n, (ops, ns, slow, declared) in counters.items():
        print("| %s | %d | %s | %d | %d |" % (n, int(ops) // args.steps, ns, int(slow) // args.steps,
                                            int(declared) // args.steps))


if __name__ == "__main__":
    main()
