#!/usr/bin/env python3
"""Provenance for PyTorch on the CPU (meson test python_torch_provenance,
pytest through tests/python/run_pytest.py; SKIP, exit 77, where no python3
imports torch or no library with the op observer is built): the bridge's
ATen op observer
(tools/torch_bridge/provenance.cpp) under `allocscope run`, where it is on
by default.

An unchanged script trains two layers whose forward quantizes the weight to
int8 (per-tensor scaling) through (a) an autograd.Function on plain tensors
and (b) a __torch_dispatch__ tensor subclass holding _data and _scale, and
either keeps the quantized copy for backward, where it builds the
transposed copy and keeps it in a module-level cache until the next forward
(seed), or keeps nothing and quantizes again in backward (fixed); the
lifecycles of tests/gpu/fsdp2_fp8_train.py. The activations have the
weights' shape (T == H == 16) and are quantized by the same code: only the
seed rule (a leaf that requires grad, inside the module's tag) tells them
apart. A third module multiplies its weight ten times (a chain long enough
to be cut).

The trace's derived events are read back with a test plugin
(tests/python/derived_plugin.c: one finding per event) through `allocscope
replay`. Checks, per run of STEPS steps:
  * each layer's int8 weight copy is declared once per quantization (the
    forward, and the backward in fixed mode) with the chain
    "layers.N.weight -> mul -> round -> clamp -> _to_copy", tagged
    (layers.N, forward) or (layers.N, backward): exactly that many, so an
    activation's int8 copy (the same chain from the same shape) taken for
    the weight's would show
  * the transposed copy, "... -> _to_copy -> clone" (contiguous() inside
    _to_copy's copy_ is named after clone), once per step and layer, in
    (layers.N, backward)
  * no declaration names a bias (every use of it adds an activation)
  * a long chain is cut: the 9th and 10th multiplications are "chain.weight
    -> mul -> mul -> mul -> mul -> … -> mul -> mul -> mul -> mul", the 8th
    has its 8 ops
  * 3 seeds in all (2 x weight and chain.weight), however many steps: a
    seed is its storage, found once, and a bias, only ever added to an
    activation, derives nothing and is never looked up
  * the trace says provenance was on (a mark, ALLOCSCOPE_PROVENANCE_ON)
With --no-provenance (or ALLOCSCOPE_PROVENANCE=0) the trace holds no
derived event, the findings file says why provenance was off, and the
run's summary line says which layers the weight detectors matched by size
alone.

Environment (tests/meson.build): E2E_CLI, SIM_CUDART, ALLOCSCOPE_TORCH_BRIDGE
(the library with the op observer), DERIVED_PLUGIN.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

try:
    import torch  # noqa: F401
except Exception as e:
    pytest.skip("python3 cannot import torch (%s)" % e, allow_module_level=True)

CLI = os.environ["E2E_CLI"]
SIM_CUDART = os.environ["SIM_CUDART"]
BRIDGE = os.environ.get("ALLOCSCOPE_TORCH_BRIDGE", "")
PLUGIN = os.environ["DERIVED_PLUGIN"]
if not BRIDGE:
    pytest.skip("no bridge or tag hooks library built against this torch", allow_module_level=True)
STEPS = 3
LAYERS = 2

SCRIPT = textwrap.dedent(
    """
    import ctypes, os
    import torch
    import torch.nn as nn

    IMPL = os.environ["FP8_IMPL"]   # "function" or "subclass"
    MODE = os.environ["FP8_MODE"]   # "seed" or "fixed"
    H = 16
    T = 16  # tokens: the activations have the weights' shape
    aten = torch.ops.aten

    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    _process = ctypes.CDLL(None)
    _malloc, _free = _process.cudaMalloc, _process.cudaFree
    _malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    _free.argtypes = [ctypes.c_void_p]

    def device_alloc_free(size):
        p = ctypes.c_void_p()
        assert _malloc(ctypes.byref(p), size) == 0
        _free(p)

    def quantize(t):
        # Per-tensor scaling to int8: (copy, scale_inv).
        amax = t.detach().abs().amax().float().clamp(min=1e-12)
        scale = 127.0 / amax
        q = (t.detach().float() * scale).round().clamp(-127, 127).to(torch.int8)
        return q, scale.reciprocal()

    _TRANSPOSE_CACHE = {}

    class FunctionLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, key):
            xq, xs = quantize(x)
            wq, ws = quantize(weight)
            y = (xq.float() * xs).mm((wq.float() * ws).t())
            if MODE == "seed":
                ctx.save_for_backward(x, wq, ws)
            else:
                ctx.save_for_backward(x, weight)
            ctx.key = key
            return y

        @staticmethod
        def backward(ctx, dy):
            if MODE == "seed":
                x, wq, ws = ctx.saved_tensors
            else:
                x, weight = ctx.saved_tensors
                wq, ws = quantize(weight)
            wt = wq.t().contiguous()
            dx = dy.mm((wt.float() * ws).t())
            if MODE == "seed":
                _TRANSPOSE_CACHE[ctx.key] = wt
            return dx, dy.t().mm(x), None

    class Int8Tensor(torch.Tensor):
        # An int8 tensor with a scale, dequantized by its own matmul.
        @staticmethod
        def __new__(cls, data, scale):
            return torch.Tensor._make_wrapper_subclass(
                cls, data.shape, strides=data.stride(), dtype=torch.float32,
                device=data.device, requires_grad=False)

        def __init__(self, data, scale):
            self._data = data
            self._scale = scale

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def quantize(cls, t):
            return cls(*quantize(t))

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is aten.t.default:
                return Int8Tensor(args[0]._data.t(), args[0]._scale)
            if func is aten.clone.default:
                return Int8Tensor(args[0]._data.clone(**kwargs), args[0]._scale)
            if func is aten.detach.default:
                return Int8Tensor(args[0]._data.detach(), args[0]._scale)
            if func is aten.mm.default:
                a, b = (v._data.float() * v._scale if isinstance(v, Int8Tensor) else v
                        for v in args)
                return torch.mm(a, b)
            raise NotImplementedError("Int8Tensor: %s" % func)

    class SubclassLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, key):
            wq = Int8Tensor.quantize(weight)
            y = torch.mm(Int8Tensor.quantize(x), wq.t())
            ctx.save_for_backward(x, weight)
            ctx.wq = wq if MODE == "seed" else None
            ctx.key = key
            return y

        @staticmethod
        def backward(ctx, dy):
            x, weight = ctx.saved_tensors
            wq = ctx.wq if MODE == "seed" else Int8Tensor.quantize(weight)
            ctx.wq = None
            wt = wq.t().contiguous()
            dx = torch.mm(dy, wt.t())
            if MODE == "seed":
                _TRANSPOSE_CACHE[ctx.key] = wt
            return dx, dy.t().mm(x), None

    LINEAR = FunctionLinear if IMPL == "function" else SubclassLinear

    class QLinear(nn.Module):
        def __init__(self, key):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(H, H) / 4)
            self.bias = nn.Parameter(torch.zeros(H))
            self.key = key

        def forward(self, x):
            device_alloc_free(8192)
            _TRANSPOSE_CACHE.pop(self.key, None)
            return LINEAR.apply(x, self.weight, self.key) + self.bias

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(H, H))

        def forward(self, x):
            v = self.weight
            for _ in range(10):
                v = v.mul(1.0)
            return x + x.mm(v) * 0.0

    SCOPE = os.environ.get("FP8_SCOPE", "module")  # "module", "block" or "twins"

    class Block(nn.Module):
        # The linear's own forward (and its module hooks) never runs: its
        # parameters are used in the block's scope, as in a block compiled
        # in place whose quantization runs eagerly. "twins": a second
        # linear of the same shape, used alike.
        def __init__(self, key):
            super().__init__()
            self.lin = QLinear(key)
            self.twin = QLinear(key + 100) if SCOPE == "twins" else None

        def forward(self, x):
            y = 0
            for lin in (self.lin, self.twin):
                if lin is not None:
                    _TRANSPOSE_CACHE.pop(lin.key, None)
                    y = y + LINEAR.apply(x, lin.weight, lin.key) + lin.bias
            return y

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            layer = QLinear if SCOPE == "module" else Block
            self.layers = nn.ModuleList(layer(i) for i in range(LAYERS))
            self.chain = Chain()

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.chain(x)

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(T, H)
    for step in range(STEPS):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    print("done")
    """
).replace("LAYERS", str(LAYERS)).replace("STEPS", str(STEPS))


def run(script, out, extra_env, flags=(), plugins="none"):
    """`script` under `allocscope run FLAGS`: (process, derived declarations
    as dicts, events_by_kind of rank 0)."""
    env = dict(os.environ, SIM_CUDART=SIM_CUDART, PYTHONDONTWRITEBYTECODE="1",
               ALLOCSCOPE_LOG="debug", ALLOCSCOPE_TORCH_BRIDGE=BRIDGE)
    for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT",
                "ALLOCSCOPE_PROVENANCE", "ALLOCSCOPE_PYTHON_MODULES"):
        env.pop(var, None)
    env.update(extra_env)
    cmd = [CLI, "run", "--out", out] + (["--plugins", plugins] if plugins else []) + list(flags)
    p = subprocess.run(cmd + ["--", sys.executable, script], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    print(p.stderr)
    r = subprocess.run([CLI, "replay", out, "--plugins", PLUGIN, "-o", "-"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=120)
    derived = []
    if r.returncode != 0:
        print("replay: %s" % r.stderr)
        return p, None, None
    for f in json.loads(r.stdout).get("findings", []):
        m = re.match(r"derived (.*)\|(.*)\|(.*)\|0x([0-9a-f]+)$", f.get("summary", ""))
        if m:
            derived.append({"layer": m.group(1), "name": m.group(2), "how": m.group(3),
                            "address": int(m.group(4), 16), "tag_layer": f.get("layer"),
                            "tag_phase": f.get("phase")})
    rep = subprocess.run([CLI, "report", out, "--format", "json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    kinds = None
    if rep.returncode == 0:
        kinds = json.loads(rep.stdout)["ranks"][0].get("events_by_kind", {})
    return p, derived, kinds


QUANTIZED = "layers.%d.weight -> mul -> round -> clamp -> _to_copy"
TRANSPOSED = QUANTIZED + " -> clone"
LONG_CHAIN = "chain.weight -> mul -> mul -> mul -> mul -> … -> mul -> mul -> mul -> mul"


@pytest.fixture(scope="module")
def script():
    """The training script (SCRIPT) in a directory for the module's runs,
    removed after them."""
    scratch = tempfile.mkdtemp(prefix="allocscope-provenance-")
    path = os.path.join(scratch, "train.py")
    with open(path, "w") as f:
        f.write(SCRIPT)
    yield path
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("mode", ["seed", "fixed"])
@pytest.mark.parametrize("impl", ["function", "subclass"])
def test_each_weight_copy_is_declared_with_its_chain_of_ops(script, impl, mode):
    label = "%s/%s" % (impl, mode)
    out = os.path.join(os.path.dirname(script), "out-%s-%s" % (impl, mode))
    p, derived, kinds = run(script, out, {"FP8_IMPL": impl, "FP8_MODE": mode})  # no flag
    assert p.returncode == 0 and "done" in p.stdout, "%s: exit status %d" % (label, p.returncode)
    assert "provenance is off" not in p.stderr, "%s: provenance not installed" % label
    m = re.search(r"provenance: \d+ ops observed, \d+ ns each, \d+ on the slow path; (\d+) "
                  r"seeds, (\d+) derived storages, (\d+) declared", p.stderr)
    assert m is not None and int(m.group(1)) == LAYERS + 1, (
        "%s: seeds: %s" % (label, m.group(0) if m else "no debug line")
    )
    # ALLOCSCOPE_LOG=debug: what the observer and the Python hooks cost a step.
    assert re.search(r"provenance: .* declared; \d+ us a step over %d steps\n" % STEPS, p.stderr), (
        "%s: no per-step cost of the observer" % label)
    assert re.search(r"Python hooks: \d+ us a step over %d steps\n" % STEPS, p.stderr), (
        "%s: no per-step cost of the hooks" % label)
    if derived is None:
        pytest.fail("%s: no replay" % label)
    assert kinds is not None and kinds.get("derived") == len(derived), (
        "%s: %d declarations read back, report counts %r" % (label, len(derived), kinds)
    )
    assert kinds.get("mark") == 1, "%s: the provenance mark: %r" % (label, kinds)
    print("%s: %d declarations, e.g. %s" % (label, len(derived), sorted({d["how"] for d in derived})))
    assert all(d["address"] for d in derived), "%s: a declaration without address" % label
    assert not [d for d in derived if d["name"] != "weight"], (
        "%s: declarations of %r" % (label, sorted({d["name"] for d in derived}))
    )
    per_step = 2 if mode == "fixed" else 1  # fixed quantizes again in backward
    for i in range(LAYERS):
        layer = "layers.%d" % i
        copies = [d for d in derived if d["how"] == QUANTIZED % i]
        assert len(copies) == STEPS * per_step, (
            "%s: %d int8 copies of %s.weight (want %d)" % (label, len(copies), layer, STEPS * per_step)
        )
        assert all(d["layer"] == layer and d["tag_layer"] == layer for d in copies), (
            "%s: %s copies named %r" % (label, layer, [(d["layer"], d["tag_layer"]) for d in copies])
        )
        forward = [d for d in copies if d["tag_phase"] == "forward"]
        assert len(forward) == STEPS, "%s: %s forward copies: %d" % (label, layer, len(forward))
        transposes = [d for d in derived if d["how"] == TRANSPOSED % i]
        assert (len(transposes) == STEPS
                and all(d["tag_layer"] == layer and d["tag_phase"] == "backward" for d in transposes)), (
            "%s: %s transposes %r" % (label, layer, transposes)
        )
    # Multiplications 9 and 10 are cut (4 first, 4 last), 8 is not.
    chain = [d for d in derived if d["layer"] == "chain"]
    assert (sum(1 for d in chain if d["how"] == LONG_CHAIN) == 2 * STEPS
            and sum(1 for d in chain if d["how"] == "chain.weight" + " -> mul" * 8) == STEPS), (
        "%s: long chains %r" % (label, sorted({d["how"] for d in chain}))
    )
    assert len(chain) == 10 * STEPS, "%s: %d chain declarations" % (label, len(chain))


@pytest.mark.parametrize("impl", ["function", "subclass"])
def test_a_childs_weight_used_in_its_blocks_scope_is_declared_as_the_childs(script, impl):
    # Block: the linears' forwards never run, so the tag is the block's
    # (layers.N), which has no parameters of its own; the weight is its
    # child's, layers.N.lin.weight, the only parameter of that shape inside.
    label = "block/%s" % impl
    out = os.path.join(os.path.dirname(script), "out-block-%s" % impl)
    p, derived, kinds = run(script, out, {"FP8_IMPL": impl, "FP8_MODE": "seed", "FP8_SCOPE": "block"})
    assert p.returncode == 0 and "done" in p.stdout, "%s: exit status %d" % (label, p.returncode)
    assert derived is not None, "%s: no replay" % label
    m = re.search(r"provenance: .*; (\d+) seeds,", p.stderr)
    assert m is not None and int(m.group(1)) == LAYERS + 1, "%s: seeds: %s" % (label, m and m.group(0))
    for i in range(LAYERS):
        layer = "layers.%d" % i
        how = "%s.lin.weight -> mul -> round -> clamp -> _to_copy" % layer
        copies = [d for d in derived if d["how"] == how]
        assert len(copies) == STEPS and all(
            d["layer"] == layer + ".lin" and d["name"] == "weight" and d["tag_layer"] == layer
            and d["tag_phase"] == "forward" for d in copies), (
            "%s: %s copies %r" % (label, layer, copies))
        transposes = [d for d in derived if d["how"] == how + " -> clone"]
        assert len(transposes) == STEPS and all(
            d["tag_layer"] == layer and d["tag_phase"] == "backward" for d in transposes), (
            "%s: %s transposes %r" % (label, layer, transposes))
    assert not [d for d in derived if d["name"] != "weight"], (
        "%s: declarations of %r" % (label, sorted({d["name"] for d in derived})))


def test_two_weights_of_one_shape_in_a_blocks_scope_are_not_guessed(script):
    # twins: layers.N.lin.weight and layers.N.twin.weight have one shape and
    # are both used in the block's scope: neither is a seed, nothing of
    # them is declared; the chain module's own weight still is.
    out = os.path.join(os.path.dirname(script), "out-twins")
    p, derived, kinds = run(script, out, {"FP8_IMPL": "function", "FP8_MODE": "seed",
                                          "FP8_SCOPE": "twins"})
    assert p.returncode == 0 and "done" in p.stdout, "twins: exit status %d" % p.returncode
    assert derived is not None, "twins: no replay"
    m = re.search(r"provenance: .*; (\d+) seeds,", p.stderr)
    assert m is not None and int(m.group(1)) == 1, "twins: seeds: %s" % (m and m.group(0))
    assert [d for d in derived if d["layer"].startswith("layers.")] == [], (
        "twins: guessed %r" % sorted({d["how"] for d in derived if d["layer"].startswith("layers.")}))
    assert len([d for d in derived if d["layer"] == "chain"]) == 10 * STEPS


# A compiled forward's weight copy read by an eager backward: an
# autograd.Function whose forward Dynamo compiled as a frame of its own
# saves the FP8 weight its generated code allocated, and its backward,
# eager, transposes it. The observer sees no op make the copy; it knows it
# from the frame scope's declaration (allocscope_set_scope_listener). Here
# the generated code is a line registered with allocscope.python_frame_scope
# that hands out a caching-allocator block; the tensor is that memory. In
# layers.1 a copy is declared and freed first, then a block at its address
# is handed out again from a plain line: a freed declaration never makes
# that tensor derived.
COMPILED_COPY_SCRIPT = textwrap.dedent(
    """
    import ctypes
    import torch
    import torch.nn as nn
    import allocscope

    H = 16
    _MEMORY = []

    def memory(size):
        _MEMORY.append(ctypes.create_string_buffer(size))
        return ctypes.addressof(_MEMORY[-1])

    def generated(size):  # inductor's `buf0 = empty_strided_cuda(...)`
        address = memory(size)
        allocscope.block_alloc(address, size)
        return address

    def plain(address, size):
        allocscope.block_alloc(address, size)

    allocscope.python_frame_scope(__file__, generated.__code__.co_firstlineno + 2, "", "",
                                  "weight", "torch.compile'd graph: weight -> convert_element_type")

    def as_tensor(address):
        return torch.frombuffer((ctypes.c_char * (H * H)).from_address(address),
                                dtype=torch.int8).view(H, H)

    _TRANSPOSE_CACHE = {}

    class CompiledFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, key):
            address = generated(H * H)
            if key == 1:
                allocscope.block_free(address)
                plain(address, H * H)
            ctx.save_for_backward(x)
            ctx.address = address
            ctx.key = key
            return x * 1.0

        @staticmethod
        def backward(ctx, dy):
            wq = as_tensor(ctx.address)
            _TRANSPOSE_CACHE[ctx.key] = wq.t().contiguous()
            del wq
            allocscope.block_free(ctx.address)
            return dy, None, None

    class QLinear(nn.Module):
        def __init__(self, key):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(H, H))
            self.key = key

        def forward(self, x):
            _TRANSPOSE_CACHE.pop(self.key, None)
            return CompiledFn.apply(x, self.weight, self.key)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(QLinear(i) for i in range(2))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = Model()
    x = torch.randn(H, H, requires_grad=True)
    for step in range(STEPS):
        model(x).sum().backward()
    print("done")
    """
).replace("STEPS", str(STEPS))


def test_a_compiled_graphs_weight_copy_transposed_in_eager_backward_is_declared(script):
    path = os.path.join(os.path.dirname(script), "compiled_copy.py")
    with open(path, "w") as f:
        f.write(COMPILED_COPY_SCRIPT)
    p, derived, kinds = run(path, os.path.join(os.path.dirname(script), "out-compiled-copy"), {})
    assert p.returncode == 0 and "done" in p.stdout, "exit status %d" % p.returncode
    assert derived is not None, "no replay"
    assert re.search(r"provenance: %d storages of compiled graphs' weight copies read by "
                     r"observed ops" % STEPS, p.stderr), "no adoption counted"
    copies = [d for d in derived if d["how"].startswith("torch.compile'd graph")]
    assert len(copies) == 2 * STEPS, "%d frame-scope declarations" % len(copies)
    transposes = [d for d in derived if d["tag_phase"] == "backward"]
    assert len(transposes) == STEPS and all(
        d["how"] == "layers.0.weight -> torch.compile'd graph -> clone" and d["layer"] == "layers.0"
        and d["name"] == "weight" and d["tag_layer"] == "layers.0" for d in transposes), (
        "transposes %r" % transposes)


@pytest.mark.parametrize("how", ["--no-provenance", "ALLOCSCOPE_PROVENANCE=0"])
def test_without_provenance_the_summary_says_so(script, how):
    out = os.path.join(os.path.dirname(script), "out-off-%s" % how.strip("-").split("=")[0])
    env = {"FP8_IMPL": "function", "FP8_MODE": "seed"}
    flags = [how] if how.startswith("--") else []
    if not flags:
        env["ALLOCSCOPE_PROVENANCE"] = "0"
    p, derived, kinds = run(script, out, env, flags, plugins=None)
    assert p.returncode == 0 and "done" in p.stdout, "off: exit status %d" % p.returncode
    assert derived == [] and kinds is not None and "derived" not in kinds, (
        "off: declarations %r, events %r" % (derived, kinds)
    )
    assert "provenance: " not in p.stderr and "provenance is off" not in p.stderr, (
        "off: the observer spoke, or the shim said more than the summary"
    )
    with open(os.path.join(out, "findings.json")) as f:
        findings = json.load(f)
    assert [r.get("provenance") for r in findings["ranks"]] == [
        "off: turned off (ALLOCSCOPE_PROVENANCE=0, or allocscope run --no-provenance)"
    ], findings["ranks"]
    # The tensors are CPU tensors, no allocations of the trace: the
    # detectors had nothing to match (tests/harness/harness_run_test.cpp
    # has a run whose layers match by size), and the line says so.
    assert not [f for f in findings["findings"] if f["plugin"] in (
        "weight-copy-accumulation", "transpose-cache-retention") and f["severity"] != "info"]
    lines = [l for l in p.stderr.splitlines() if "had sizes only" in l]
    assert lines == [
        "allocscope: provenance was off: turned off (ALLOCSCOPE_PROVENANCE=0, or allocscope run "
        "--no-provenance); the weight-copy and transpose detectors had sizes only, and no layer "
        "matched their patterns"], p.stderr
    report = open(os.path.join(out, "report.txt")).read()
    assert lines[0][len("allocscope: "):] in report, "report.txt lacks the line"


def test_with_provenance_the_findings_file_says_it_was_on(script):
    out = os.path.join(os.path.dirname(script), "out-on-findings")
    p, derived, kinds = run(script, out, {"FP8_IMPL": "function", "FP8_MODE": "fixed"},
                            plugins=None)
    assert p.returncode == 0 and "done" in p.stdout, "on: exit status %d" % p.returncode
    with open(os.path.join(out, "findings.json")) as f:
        findings = json.load(f)
    assert [r.get("provenance") for r in findings["ranks"]] == ["on"], findings["ranks"]
    assert "had sizes only" not in p.stderr, p.stderr


def test_provenance_observes_the_steps_its_schedule_names(script):
    # first=1,every=2,window=1: steps 0 and 2 of 0-2 observed, step 1 not;
    # the trace marks the pause and the resumption, the findings file and
    # the run's summary name the steps observed.
    out = os.path.join(os.path.dirname(script), "out-steps")
    p, derived, kinds = run(script, out, {"FP8_IMPL": "function", "FP8_MODE": "seed"},
                            flags=["--provenance-steps", "first=1,every=2,window=1"], plugins=None)
    assert p.returncode == 0 and "done" in p.stdout, "steps: exit status %d" % p.returncode
    assert derived is not None, "steps: no replay"
    assert "provenance: paused 1 times (steps the first 1, then 1 in every 2)" in p.stderr, p.stderr
    assert kinds.get("mark") == 3, "steps: on, paused, resumed: %r" % kinds
    for i in range(LAYERS):
        copies = [d for d in derived if d["how"] == QUANTIZED % i]
        transposes = [d for d in derived if d["how"] == TRANSPOSED % i]
        assert len(copies) == 2 and len(transposes) == 2, (
            "steps: layers.%d: %d copies, %d transposes (want 2 and 2: steps 0 and 2)"
            % (i, len(copies), len(transposes)))
    with open(os.path.join(out, "findings.json")) as f:
        findings = json.load(f)
    assert [r.get("provenance") for r in findings["ranks"]] == ["on in steps 0, 2 of 0–2"], (
        findings["ranks"])
    lines = [l for l in p.stderr.splitlines() if "provenance observed steps" in l]
    assert lines == [
        "allocscope: provenance observed steps 0, 2 of 0–2 (ALLOCSCOPE_PROVENANCE_STEPS, by "
        "default the first 4 steps, then 2 in every 100): the weight detectors judged those "
        "steps; --provenance-steps all observes every step"], p.stderr
    assert "had sizes only" not in p.stderr, p.stderr


@pytest.mark.parametrize("value", ["bogus", "first=0", "every=4,window=5", "first=2,first=3"])
def test_a_bad_steps_value_is_named_in_one_line_and_the_default_kept(script, value):
    out = os.path.join(os.path.dirname(script), "out-bad-steps-%s" % re.sub(r"\W", "_", value))
    p, derived, kinds = run(script, out, {"FP8_IMPL": "function", "FP8_MODE": "fixed",
                                          "ALLOCSCOPE_PROVENANCE_STEPS": value}, plugins=None)
    assert p.returncode == 0 and "done" in p.stdout, "bad steps: exit status %d" % p.returncode
    said = [l for l in p.stderr.splitlines() if "ALLOCSCOPE_PROVENANCE_STEPS=" in l]
    assert len(said) == 1 and ("%r" % value) in said[0] and "the default is used" in said[0], (
        p.stderr)
    # The default observes the first 4 steps: all 3 of this run.
    with open(os.path.join(out, "findings.json")) as f:
        assert [r.get("provenance") for r in json.load(f)["ranks"]] == ["on"]


@pytest.mark.parametrize("value", ["bogus", "first=0", "every=4,window=5", "window=x"])
def test_run_refuses_a_bad_provenance_steps_flag(script, value):
    p = subprocess.run([CLI, "run", "--out", os.path.join(os.path.dirname(script), "out-refused"),
                        "--provenance-steps", value, "--", sys.executable, "-c", "pass"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "allocscope: --provenance-steps '%s': " % value), p.stderr
