#!/usr/bin/env python3
"""What allocscope.torch's hooks cost per training step, on CPU tensors: the
Python-side part of allocscope's overhead on a PyTorch run (module hooks,
tensor hooks for backward, optimizer hooks, the tag calls), measured without
a GPU. Needs a python3 that imports torch (Debian's python3-torch will do).

    python3 tests/bench/torch_hooks_cpu.py --cli build/tools/allocscope \
        [--hooks-lib build/tests/libtag_hooks_cpu.so] [--steps 200] [--repeat 5]
        [--layers 8] [--hidden 64]

The workload (run as a child process, this file with --child) is a model of
--layers transformer-like blocks (layer norms, q/k/v/o projections, an MLP:
12 modules per block) on a small CPU batch, so that a step is mostly
PyTorch's per-op and per-module overhead, the regime where hooks show most.
Configurations, interleaved over --repeat runs:
  plain                 no allocscope
  noop-hooks            no allocscope; global forward pre/post hooks and
                        optimizer hooks that do nothing (PyTorch's own cost
                        of having hooks at all)
  allocscope/no-python  allocscope run --no-python (interposer only, no tags)
  allocscope/ctypes     allocscope run, ALLOCSCOPE_BRIDGE_HOOKS=0
  allocscope/bridge     allocscope run with ALLOCSCOPE_TORCH_BRIDGE=--hooks-lib
                        (the C++ tag hooks), when given
A run's step time is the median of its steps after the first 20; a
configuration's is the median over its runs. Then one run per allocscope
configuration with ALLOCSCOPE_LOG=debug prints each hook's calls and
average time (the timing itself adds to those).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SKIP = 20


def child(args):
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    h = args.hidden

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(h, 4 * h)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(4 * h, h)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(h, h)
            self.k = nn.Linear(h, h)
            self.v = nn.Linear(h, h)
            self.o = nn.Linear(h, h)

        def forward(self, x):
            a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), -1)
            return self.o(a @ self.v(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(h)
            self.attn = Attention()
            self.norm2 = nn.LayerNorm(h)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block() for _ in range(args.layers)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    if args.noop_hooks:
        from torch.nn.modules import module as nn_module

        nn_module.register_module_forward_pre_hook(lambda m, a: None)
        nn_module.register_module_forward_hook(lambda m, a, o: None)
        from torch.optim import optimizer as optim_module

        if hasattr(optim_module, "register_optimizer_step_pre_hook"):
            optim_module.register_optimizer_step_pre_hook(lambda o, a, k: None)
            optim_module.register_optimizer_step_post_hook(lambda o, a, k: None)

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, h)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    print("STEP_MS_MEDIAN %.4f" % (statistics.median(times[SKIP:]) * 1e3))


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("%s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
    return p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli")
    ap.add_argument("--hooks-lib")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--noop-hooks", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if not args.cli:
        ap.error("--cli is required")
    if args.steps <= SKIP:
        ap.error("--steps must be more than %d" % SKIP)
    me = [sys.executable, os.path.abspath(__file__), "--child", "--steps", str(args.steps),
          "--layers", str(args.layers), "--hidden", str(args.hidden)]
    scratch = tempfile.mkdtemp(prefix="allocscope-hookbench-")
    base = dict(os.environ)
    for var in ("LD_PRELOAD", "ALLOCSCOPE_LOG", "ALLOCSCOPE_BRIDGE_HOOKS", "ALLOCSCOPE_TORCH_BRIDGE"):
        base.pop(var, None)

    def under_allocscope(extra):
        return [args.cli, "run", "--out", os.path.join(scratch, "out"), "--force",
                "--plugins", "none"] + extra + ["--"] + me

    configs = [
        ("plain", me, {}),
        ("noop-hooks", me + ["--noop-hooks"], {}),
        ("allocscope/no-python", under_allocscope(["--no-python"]), {}),
        ("allocscope/ctypes", under_allocscope([]), {"ALLOCSCOPE_BRIDGE_HOOKS": "0"}),
    ]
    if args.hooks_lib:
        configs.append(("allocscope/bridge", under_allocscope([]),
                        {"ALLOCSCOPE_TORCH_BRIDGE": os.path.abspath(args.hooks_lib)}))
    results = {name: [] for name, _, _ in configs}
    try:
        for _ in range(args.repeat):
            for name, cmd, extra in configs:
                out, _ = run(cmd, dict(base, **extra))
                m = re.search(r"STEP_MS_MEDIAN ([0-9.]+)", out)
                if not m:
                    raise RuntimeError("%s: no step time in its output" % name)
                results[name].append(float(m.group(1)))
        plain = statistics.median(results["plain"])
        print("%d layers (%d modules), hidden %d, %d steps per run, %d runs per configuration"
              % (args.layers, 12 * args.layers + 1, args.hidden, args.steps, args.repeat))
        print("| configuration | step, median of runs (ms) | fastest run (ms) | overhead |")
        print("| --- | --- | --- | --- |")
        for name, _, _ in configs:
            med = statistics.median(results[name])
            print("| %s | %.3f | %.3f | %+.1f %% |"
                  % (name, med, min(results[name]), 100.0 * (med / plain - 1.0)))
        print()
        print("Per hook call, one run each with ALLOCSCOPE_LOG=debug:")
        for name, cmd, extra in configs:
            if not name.startswith("allocscope/") or name == "allocscope/no-python":
                continue
            _, err = run(cmd, dict(base, ALLOCSCOPE_LOG="debug", **extra))
            for line in err.splitlines():
                if "hook " in line and " calls, " in line:
                    print("  %s: %s" % (name, line.split(": ", 1)[1]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
