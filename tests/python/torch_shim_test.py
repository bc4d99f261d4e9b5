#!/usr/bin/env python3
"""allocscope.torch on the CPU (meson tests python_shim_torch and
python_shim_torch_bridge_hooks; SKIP, exit 77, where no python3 imports
torch). Runs with torch 1.13 (Debian's python3-torch, as in CI) and 2.x.

An unchanged script runs under `allocscope run` (the shim comes in through
sitecustomize when the script imports torch): a model on CPU tensors whose
modules, autograd backward and optimizer step allocate through the
host-memory CUDA runtime (harness/sim_cudart). The trace must show those
allocations under (layers.<i>, forward), (layers.<i>, backward) — the first
layer's input does not require grad, so its backward gets no leave and the
shim keeps its tag — (dict_head, backward) and (dataclass_head, backward),
whose outputs are in a dict and a dataclass (the root returns the
dataclass's tensor, so the root's backward enters below the head's), and
(optimizer) for a subclass's step() that calls super().step() (one step:
torch < 2.0 has no global step hooks, so the shim wraps step() there), the
parameters registered, and one step per optimizer.step().

TORCH_SHIM_HOOKS=ctypes: the hooks tag through ctypes and Python tensor
hooks (ALLOCSCOPE_BRIDGE_HOOKS=0). TORCH_SHIM_HOOKS=bridge: through the C++
tag hooks of the library ALLOCSCOPE_TORCH_BRIDGE names (SKIP without one).

Environment (tests/meson.build): E2E_CLI, SIM_CUDART, TORCH_SHIM_HOOKS,
ALLOCSCOPE_TORCH_BRIDGE.
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
# How the hooks tag: "ctypes" (ALLOCSCOPE_BRIDGE_HOOKS=0), or "bridge": the
# C++ tag hooks of the library ALLOCSCOPE_TORCH_BRIDGE names.
HOOKS = os.environ.get("TORCH_SHIM_HOOKS", "ctypes")
if HOOKS == "bridge" and not os.environ.get("ALLOCSCOPE_TORCH_BRIDGE"):
    print("SKIP: no bridge or tag hooks library built against this torch")
    sys.exit(77)
STEPS = 3

SCRIPT = textwrap.dedent(
    """
    import ctypes, dataclasses, os
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

    class DictHead(nn.Module):  # its output in a dict
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return {"y": Probe.apply(self.fc(x)), "n": 1}

    @dataclasses.dataclass
    class Output:
        value: torch.Tensor
        aux: tuple = ()

    class DataclassHead(nn.Module):  # its output a field of a dataclass
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return Output(value=Probe.apply(self.fc(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])
            self.dict_head = DictHead()
            self.dataclass_head = DataclassHead()

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            x = self.dict_head(x)["y"]
            return self.dataclass_head(x).value

    class ProbedSGD(torch.optim.SGD):
        def step(self, closure=None):
            device_alloc_free(16384)
            return super().step(closure)

    model = Model()
    opt = ProbedSGD(model.parameters(), lr=0.1)
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
        env = dict(os.environ, SIM_CUDART=SIM_CUDART, PYTHONDONTWRITEBYTECODE="1",
                   ALLOCSCOPE_LOG="debug")
        for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT",
                    "ALLOCSCOPE_BRIDGE_HOOKS"):
            env.pop(var, None)
        if HOOKS == "ctypes":
            env["ALLOCSCOPE_BRIDGE_HOOKS"] = "0"
        p = subprocess.run([CLI, "run", "--out", out, "--plugins", "none", "--", sys.executable, script],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
        print(p.stderr)
        check(p.returncode == 0 and "done" in p.stdout, "exit status %d" % p.returncode)
        check("hooks not installed" not in p.stderr and "hook failed" not in p.stderr
              and "hooks failed" not in p.stderr and "cannot be used" not in p.stderr,
              "the shim reported a problem")
        through = "the PyTorch bridge" if HOOKS == "bridge" else "ctypes"
        check("tag calls through %s\n" % through in p.stderr, "tags not through %s" % through)
        r = subprocess.run([CLI, "report", out, "--format", "json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        check(r.returncode == 0, "report: %s" % r.stderr)
        if r.returncode != 0:
            return 1
        rank = json.loads(r.stdout)["ranks"][0]
        kinds = rank.get("events_by_kind", {})
        check(kinds.get("param") == 8, "param events: %r (want 8: 4 x weight, bias)" % kinds)
        tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
        print("tags:", sorted(tags))
        for layer in ("layers.0", "layers.1"):
            for phase, size in (("forward", 8192), ("backward", 12288)):
                t = tags.get((layer, phase))
                check(t is not None and t["allocations"] == STEPS and t["allocated_bytes"] == STEPS * size,
                      "%s %s: %r" % (layer, phase, t))
        for layer in ("dict_head", "dataclass_head"):
            t = tags.get((layer, "backward"))
            check(t is not None and t["allocations"] == STEPS and t["allocated_bytes"] == STEPS * 12288,
                  "%s backward (output inside a container): %r" % (layer, t))
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
