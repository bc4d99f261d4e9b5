#!/usr/bin/env python3
"""allocscope.torch on the CPU (meson test python_shim_torch; SKIP, exit 77,
where python3 cannot import torch).

An unchanged script runs under `allocscope run` (the shim comes in through
sitecustomize when the script imports torch): a 2-layer model on CPU tensors
whose modules, autograd backward and an optimizer step hook allocate through
the host-memory CUDA runtime (harness/sim_cudart). The trace must show those
allocations under (layers.<i>, forward), (layers.<i>, backward) — the first
layer's input does not require grad, so its backward gets no leave and the
shim keeps its tag; layers.1 and the root share their output tensor, so the
root's backward enters below layers.1's — and (optimizer), the parameters
registered, and one step per optimizer.step().

Environment (tests/meson.build): E2E_CLI, SIM_CUDART.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

try:
    import torch  # noqa: F401
except Exception as e:
    print("SKIP: python3 cannot import torch (%s)" % e)
    sys.exit(77)

CLI = os.environ["E2E_CLI"]
SIM_CUDART = os.environ["SIM_CUDART"]
STEPS = 3

SCRIPT = textwrap.dedent(
    """
    import ctypes, os
    import torch
    import torch.nn as nn

    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    _process = ctypes.CDLL(None)
    _malloc, _free = _process.cudaMalloc, _process.cudaFree
    _malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    _free.argtypes = [ctypes.c_void_p]

    def device_alloc_free(size):
        p = ctypes.c_void_p()
        assert _malloc(ctypes.byref(p), size) == 0
        _free(p)

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            device_alloc_free(12288)
            return g

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            device_alloc_free(8192)
            return Probe.apply(self.fc(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    from torch.optim import optimizer as optim_module
    optim_module.register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: device_alloc_free(16384))
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    for step in range(%d):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print("done")
    """
    % STEPS
)


def main():
    scratch = tempfile.mkdtemp(prefix="allocscope-torchshim-")
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAILED: " + what)

    try:
        script = os.path.join(scratch, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        out = os.path.join(scratch, "out")
        env = dict(os.environ, SIM_CUDART=SIM_CUDART, PYTHONDONTWRITEBYTECODE="1")
        for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT"):
            env.pop(var, None)
        p = subprocess.run([CLI, "run", "--out", out, "--plugins", "none", "--", sys.executable, script],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
        print(p.stderr)
        check(p.returncode == 0 and "done" in p.stdout, "exit status %d" % p.returncode)
        check("hooks not installed" not in p.stderr and "hook failed" not in p.stderr,
              "the shim reported a problem")
        r = subprocess.run([CLI, "report", out, "--format", "json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        check(r.returncode == 0, "report: %s" % r.stderr)
        rank = json.loads(r.stdout)["ranks"][0]
        kinds = rank.get("events_by_kind", {})
        check(kinds.get("param") == 4, "param events: %r (want 4: 2 x weight, bias)" % kinds)
        tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
        print("tags:", sorted(tags))
        for layer in ("layers.0", "layers.1"):
            for phase, size in (("forward", 8192), ("backward", 12288)):
                t = tags.get((layer, phase))
                check(t is not None and t["allocations"] == STEPS and t["allocated_bytes"] == STEPS * size,
                      "%s %s: %r" % (layer, phase, t))
        opt = [t for (layer, phase), t in tags.items() if phase == "optimizer"]
        check(len(opt) == 1 and opt[0]["allocations"] == STEPS, "optimizer tags: %r" % opt)
        steps = sorted(s["step"] for s in rank.get("timeline", {}).get("steps", []))
        check(steps[-STEPS:] == list(range(1, STEPS + 1)), "steps %r" % steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
