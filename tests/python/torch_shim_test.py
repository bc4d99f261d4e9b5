#!/usr/bin/env python3
"""allocscope.torch on the CPU (meson tests python_shim_torch and
python_shim_torch_bridge_hooks, pytest through tests/python/run_pytest.py;
SKIP, exit 77, where no python3 imports torch). Runs with torch 1.13
(Debian's python3-torch, as in CI) and 2.x.

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

With activation checkpointing on layers.1 (reentrant and not), its forward
runs again in backward: those allocations are (layers.1,
backward/recompute), the first forward's stay (layers.1, forward), and
nothing else changes. With a reentrant checkpoint of the whole model, every
layer's forward runs again in backward before any module backward has
begun: (layers.0 and layers.1, backward/recompute) too.

Wrapped modules keep their names: layers.1 wrapped by checkpoint_wrapper
(its module is "layers.1._checkpoint_wrapped_module" to named_modules) and,
where torch has torch.compile, every layer compiled on its own
(torch.compile(layer, backend="aot_eager"): "layers.N._orig_mod") tag as
layers.1 and layers.N, with the same allocations as unwrapped; no tag names
a wrapper component, and torch's warning about global hooks on compiled
modules is not shown.

A generated module's call (the shape of inductor's `call(args)`), shared
by two sibling linears of one shape whose own hooks did not run, allocates
under the tag of the linear whose parameter it is given, and under the
block's when it is given no module's parameter.

Then the measuring switches: with ALLOCSCOPE_PYTHON_MODULES=0 the same
script gets no layer tags and no parameters, but its optimizer tags and
steps; with ALLOCSCOPE_TORCH_BLOCKS=0, attach_bridge() succeeds without
attaching and says so.

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

import pytest

try:
    import torch
except Exception as e:
    pytest.skip("python3 cannot import torch (%s)" % e, allow_module_level=True)

CLI = os.environ["E2E_CLI"]
SIM_CUDART = os.environ["SIM_CUDART"]
# How the hooks tag: "ctypes" (ALLOCSCOPE_BRIDGE_HOOKS=0), or "bridge": the
# C++ tag hooks of the library ALLOCSCOPE_TORCH_BRIDGE names.
HOOKS = os.environ.get("TORCH_SHIM_HOOKS", "ctypes")
if HOOKS == "bridge" and not os.environ.get("ALLOCSCOPE_TORCH_BRIDGE"):
    pytest.skip("no bridge or tag hooks library built against this torch", allow_module_level=True)
STEPS = 3

# Device memory for the scripts below: cudaMalloc and cudaFree of the
# host-memory runtime (SIM_CUDART), which the interposer records.
DEVICE_ALLOC = textwrap.dedent(
    """
    import ctypes, os
    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    _process = ctypes.CDLL(None)
    _malloc, _free = _process.cudaMalloc, _process.cudaFree
    _malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    _free.argtypes = [ctypes.c_void_p]

    def device_alloc_free(size):
        p = ctypes.c_void_p()
        assert _malloc(ctypes.byref(p), size) == 0
        _free(p)
    """
)

SCRIPT = DEVICE_ALLOC + textwrap.dedent(
    """
    import dataclasses
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    # "", "reentrant", "non-reentrant" (layers.1), "root-reentrant" (the model)
    CHECKPOINT = os.environ.get("CHECKPOINT", "")

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
            for i, layer in enumerate(self.layers):
                if i == 1 and CHECKPOINT in ("reentrant", "non-reentrant"):  # recomputed in backward
                    x = checkpoint(layer, x, use_reentrant=CHECKPOINT == "reentrant")
                else:
                    x = layer(x)
            x = self.dict_head(x)["y"]
            return self.dataclass_head(x).value

    WRAP = os.environ.get("WRAP", "")  # "", "checkpoint_wrapper", "compile"

    def wrap(model):
        if WRAP == "checkpoint_wrapper":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl, checkpoint_wrapper)
            model.layers[1] = checkpoint_wrapper(model.layers[1],
                                                 checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        elif WRAP == "compile":
            for i in range(len(model.layers)):
                model.layers[i] = torch.compile(model.layers[i], backend="aot_eager")
        return model

    class ProbedSGD(torch.optim.SGD):
        def step(self, closure=None):
            device_alloc_free(16384)
            return super().step(closure)

    model = wrap(Model())
    opt = ProbedSGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    if CHECKPOINT == "root-reentrant":
        x.requires_grad_()  # a reentrant checkpoint needs an input that requires grad
    for step in range(%d):
        if CHECKPOINT == "root-reentrant":
            loss = checkpoint(model, x, use_reentrant=True).square().mean()
        else:
            loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print("done")
    """
    % STEPS
)


def run_traced(script, out, extra_env):
    """`script` under `allocscope run`: (the process, rank 0 of its report or None)."""
    env = dict(os.environ, SIM_CUDART=SIM_CUDART, PYTHONDONTWRITEBYTECODE="1",
               ALLOCSCOPE_LOG="debug")
    for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT",
                "ALLOCSCOPE_BRIDGE_HOOKS", "ALLOCSCOPE_PYTHON_MODULES", "ALLOCSCOPE_TORCH_BLOCKS"):
        env.pop(var, None)
    if HOOKS == "ctypes":
        env["ALLOCSCOPE_BRIDGE_HOOKS"] = "0"
    env.update(extra_env)
    p = subprocess.run([CLI, "run", "--out", out, "--plugins", "none", "--", sys.executable, script],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    print(p.stderr)
    r = subprocess.run([CLI, "report", out, "--format", "json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    if r.returncode != 0:
        print("report: %s" % r.stderr)
        return p, None
    return p, json.loads(r.stdout)["ranks"][0]


# (layer, phase) -> bytes a step, in every run with module hooks.
BASE_TAGS = {
    ("layers.0", "forward"): 8192,
    ("layers.1", "forward"): 8192,
    ("layers.0", "backward"): 12288,
    ("layers.1", "backward"): 12288,
    ("dict_head", "backward"): 12288,
    ("dataclass_head", "backward"): 12288,
}


@pytest.fixture(scope="module")
def scratch():
    """A directory for the module's runs, removed after them."""
    path = tempfile.mkdtemp(prefix="allocscope-torchshim-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def script(scratch):
    """The training script (SCRIPT), written once."""
    path = os.path.join(scratch, "train.py")
    with open(path, "w") as f:
        f.write(SCRIPT)
    return path


def assert_tags(label, rank, extra):
    """Each of BASE_TAGS and `extra` holds STEPS allocations of its
    bytes; returns the tags by (layer, phase)."""
    tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
    print("tags with %s:" % label, sorted(k for k, t in tags.items() if t["allocations"]))
    for key, size in list(BASE_TAGS.items()) + list(extra.items()):
        t = tags.get(key)
        assert t is not None and t["allocations"] == STEPS and t["allocated_bytes"] == STEPS * size, (
            "%s: %s %s: %r" % (label, key[0], key[1], t)
        )
    return tags


def steps_of(rank):
    return sorted(s["step"] for s in rank.get("timeline", {}).get("steps", []))


def test_an_unchanged_script_is_tagged_by_module_phase_optimizer_and_step(script, scratch):
    p, rank = run_traced(script, os.path.join(scratch, "out"), {})
    assert p.returncode == 0 and "done" in p.stdout, "exit status %d" % p.returncode
    assert ("hooks not installed" not in p.stderr and "hook failed" not in p.stderr
            and "hooks failed" not in p.stderr and "cannot be used" not in p.stderr), (
        "the shim reported a problem"
    )
    through = "the PyTorch bridge" if HOOKS == "bridge" else "ctypes"
    assert "tag calls through %s\n" % through in p.stderr, "tags not through %s" % through
    assert rank is not None, "no report"
    kinds = rank.get("events_by_kind", {})
    assert kinds.get("param") == 8, "param events: %r (want 8: 4 x weight, bias)" % kinds
    # dict_head and dataclass_head: outputs inside a container.
    tags = assert_tags("no checkpointing", rank, {})
    opt = [t for (layer, phase), t in tags.items() if phase == "optimizer"]
    assert len(opt) == 1 and opt[0]["allocations"] == STEPS, "optimizer tags: %r" % opt
    assert steps_of(rank)[-STEPS:] == list(range(1, STEPS + 1)), "steps %r" % steps_of(rank)
    recomputed = [k for k, t in tags.items() if k[1] == "backward/recompute" and t["allocations"]]
    assert not recomputed, "recomputation without checkpointing: %r" % recomputed


# Activation checkpointing: layers.1's forward again inside backward, or the
# whole model's.
@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant", "root-reentrant"])
def test_a_checkpointed_forward_run_again_in_backward_is_tagged_recompute(script, scratch, mode):
    p, rank = run_traced(script, os.path.join(scratch, "out-" + mode), {"CHECKPOINT": mode})
    assert p.returncode == 0 and "done" in p.stdout, (
        "%s checkpoint: exit status %d" % (mode, p.returncode)
    )
    if rank is None:
        pytest.fail("%s checkpoint: no report" % mode)
    extra = {("layers.1", "backward/recompute"): 8192}
    if mode == "root-reentrant":
        extra[("layers.0", "backward/recompute")] = 8192
    tags = assert_tags(mode + " checkpointing", rank, extra)
    if mode != "root-reentrant":
        t = tags.get(("layers.0", "backward/recompute"))
        assert t is None or t["allocations"] == 0, (
            "%s checkpoint: layers.0 (not checkpointed) recomputed: %r" % (mode, t)
        )
    assert steps_of(rank)[-STEPS:] == list(range(1, STEPS + 1)), (
        "%s checkpoint: steps %r" % (mode, steps_of(rank))
    )


# Wrappers: checkpoint_wrapper everywhere, torch.compile where torch has it.
@pytest.mark.parametrize("wrapper", ["checkpoint_wrapper", "compile"])
def test_wrapped_modules_keep_their_names_and_allocations(script, scratch, wrapper):
    if wrapper == "compile" and not hasattr(torch, "compile"):
        pytest.skip("torch %s has no torch.compile: compiled layers not tested" % torch.__version__)
    p, rank = run_traced(script, os.path.join(scratch, "out-" + wrapper), {"WRAP": wrapper})
    assert p.returncode == 0 and "done" in p.stdout, "%s: exit status %d" % (wrapper, p.returncode)
    assert "global hooks" not in p.stderr, "%s: torch's global-hooks warning shown" % wrapper
    if rank is None:
        pytest.fail("%s: no report" % wrapper)
    extra = {}
    if wrapper == "checkpoint_wrapper":
        extra[("layers.1", "backward/recompute")] = 8192
    tags = assert_tags(wrapper, rank, extra)
    wrapped = [k for k in tags if "_orig_mod" in k[0] or "_wrapped_module" in k[0]]
    assert not wrapped, "%s: tags name a wrapper: %r" % (wrapper, wrapped)
    assert rank.get("events_by_kind", {}).get("param") == 8, (
        "%s: param events: %r" % (wrapper, rank.get("events_by_kind"))
    )


# A model of one Block (defined by the script before it), run STEPS steps.
ONE_BLOCK_MODEL = textwrap.dedent(
    """
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block()])

        def forward(self, x):
            return self.layers[0](x)

    model = Model()
    for step in range(%d):
        model(torch.randn(4, 16)).sum()
    print("done")
    """
    % STEPS
)


def _tags_after(scratch, name, text, want):
    """Runs script `text` traced; asserts each (layer, phase) of `want` was
    allocated its bytes a step."""
    path = os.path.join(scratch, name + ".py")
    with open(path, "w") as f:
        f.write(text)
    p, rank = run_traced(path, os.path.join(scratch, "out-" + name), {})
    assert p.returncode == 0 and "done" in p.stdout, (p.stdout, p.stderr)
    assert rank is not None
    tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
    print("tags:", sorted((k, t["allocated_bytes"]) for k, t in tags.items() if t["allocations"]))
    for key, size in want.items():
        t = tags.get(key)
        assert t is not None and t["allocated_bytes"] == STEPS * size, (key, t)


# A graph Dynamo compiled from an autograd.Function's forward, a frame of its
# own after a graph break: the weight is its argument ("L['weight']"), not
# a parameter reached from a `self`, so the call names the module that
# holds the tensor it is given.
COMPILED_FUNCTION_FRAME = DEVICE_ALLOC + textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from allocscope.torch import _compiled

    class Generated:
        @staticmethod
        def call(args):
            x, weight = args
            args.clear()
            device_alloc_free(4096 if weight.shape[0] == 16 else 2048)
            return (x,)

    generated = Generated()
    _compiled._enter_frame_module(generated, [(1, (None, "#1"))])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(16, 16)
            self.wk = nn.Linear(16, 8, bias=False)

        def forward(self, x):
            device_alloc_free(1024)
            x = generated.call([x, self.wq.weight])[0]
            x = generated.call([x, self.wk.weight])[0]
            x = generated.call([x, self.wq.bias])[0]  # held under another name: the same module
            x = generated.call([x, torch.zeros(8, 8)])[0]  # no parameter: the block's
            return x

    """
) + ONE_BLOCK_MODEL


def test_a_compiled_frame_given_a_parameter_as_an_argument_is_tagged_with_the_module_holding_it(
        scratch):
    _tags_after(scratch, "compiled_function_frame", COMPILED_FUNCTION_FRAME, {
        ("layers.0.wq", "forward"): 4096 + 4096,  # its weight and its bias (16 wide each)
        ("layers.0.wk", "forward"): 2048,
        ("layers.0", "forward"): 1024 + 2048,  # its own, and the call given no parameter
    })


def test_without_module_hooks_only_optimizer_tags_and_steps_remain(script, scratch):
    # ALLOCSCOPE_PYTHON_MODULES=0: steps and optimizer tags, nothing per module.
    p, rank = run_traced(script, os.path.join(scratch, "out-nomodules"),
                         {"ALLOCSCOPE_PYTHON_MODULES": "0"})
    assert p.returncode == 0 and "done" in p.stdout, "modules off: exit status %d" % p.returncode
    assert "module hooks left out (ALLOCSCOPE_PYTHON_MODULES=0)" in p.stderr, "modules off: not said"
    if rank is None:
        pytest.fail("modules off: no report")
    tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
    print("tags without module hooks:", sorted(tags))
    assert not [k for k in tags if k[1] in ("forward", "backward")], (
        "modules off: module tags %r" % sorted(tags)
    )
    assert "param" not in rank.get("events_by_kind", {}), "modules off: parameters registered"
    opt = [t for (layer, phase), t in tags.items() if phase == "optimizer"]
    assert len(opt) == 1 and opt[0]["allocations"] == STEPS, "modules off: optimizer tags %r" % opt
    assert steps_of(rank)[-STEPS:] == list(range(1, STEPS + 1)), (
        "modules off: steps %r" % steps_of(rank)
    )


def test_without_blocks_attach_bridge_succeeds_without_attaching_and_says_so(scratch):
    # ALLOCSCOPE_TORCH_BLOCKS=0: the bridge is not attached, and that is said.
    probe = os.path.join(scratch, "attach.py")
    with open(probe, "w") as f:
        f.write("import torch\nimport allocscope.torch as ast\nprint('attach', ast.attach_bridge())\n")
    p, _ = run_traced(probe, os.path.join(scratch, "out-noblocks"), {"ALLOCSCOPE_TORCH_BLOCKS": "0"})
    assert p.returncode == 0 and "attach True" in p.stdout, "blocks off: attach_bridge() %r" % p.stdout
    assert "not attached (ALLOCSCOPE_TORCH_BLOCKS=0)" in p.stderr, "blocks off: not said"


def test_importing_allocscope_torch_before_torch_still_enables_the_hooks(scratch):
    probe = os.path.join(scratch, "import_order.py")
    with open(probe, "w") as f:
        f.write("import allocscope.torch\nimport torch\n"
                "from allocscope.torch import _enable\nprint('enabled', _enable._enabled)\n")
    p, _ = run_traced(probe, os.path.join(scratch, "out-import-order"), {})
    assert p.returncode == 0 and "enabled True" in p.stdout, (p.stdout, p.stderr)
    assert "hooks not installed" not in p.stderr, p.stderr


# A generated module's shape (inductor's `call(args)`) serving two sibling
# linears of one shape, whose own hooks did not run (compiled away): the
# shim's wrapper (allocscope/torch/_compiled.py) enters the tag of the
# module whose parameter each call is given.
COMPILED_FRAME = DEVICE_ALLOC + textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from allocscope.torch import _compiled

    class Generated:  # one file for both linears: `self` is the linear
        @staticmethod
        def call(args):
            weight, x = args
            args.clear()
            device_alloc_free(4096 if weight.shape[0] == 16 else 2048)
            return (x,)

    generated = Generated()
    _compiled._enter_frame_module(generated, [(0, ("", "weight"))])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = nn.Linear(16, 16)
            self.wk = nn.Linear(16, 16)
            self.other = nn.Linear(16, 8)

        def forward(self, x):
            # The linears' own forwards are not called: as compiled frames
            # whose hooks were traced away, the generated call runs instead.
            device_alloc_free(1024)
            x = generated.call([self.wq.weight, x])[0]
            x = generated.call([self.wk.weight, x])[0]
            x = generated.call([self.other.weight, x])[0]
            x = generated.call([torch.zeros(3), x])[0]  # no module's parameter: the block's
            return x

    """
) + ONE_BLOCK_MODEL


def test_a_compiled_frames_call_is_tagged_with_the_module_whose_parameters_it_is_given(scratch):
    _tags_after(scratch, "compiled_frame", COMPILED_FRAME, {
        ("layers.0.wq", "forward"): 4096,
        ("layers.0.wk", "forward"): 4096,
        ("layers.0.other", "forward"): 2048,
        ("layers.0", "forward"): 1024 + 2048,  # its own, and the call given no parameter
    })
