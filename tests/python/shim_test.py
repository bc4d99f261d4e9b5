#!/usr/bin/env python3
"""The Python shim without torch and without a GPU (meson test python_shim,
pytest through tests/python/run_pytest.py).

* the allocscope package, preloaded interposer, host-memory CUDA runtime
  (harness/sim_cudart): tags, steps, params and notes reach the trace, and
  the keyed tags allocscope.torch uses work through its ctypes bindings;
* without the interposer every call is a no-op with one warning;
* tools/python/sitecustomize.py: nothing without ALLOCSCOPE_PYTHON=1, chains
  to the sitecustomize it shadows, never imports torch itself and runs its
  setup right after the program imports torch (a stand-in torch package);
* `allocscope run` gives the child ALLOCSCOPE_PYTHON=1 and PYTHONPATH, and,
  where the PyTorch bridge is not built, PYTORCH_CUDA_ALLOC_CONF with
  backend:cudaMallocAsync plus one line saying so (--no-python: none of it).

Environment (tests/meson.build): E2E_CLI, SIM_CUDART, ALLOCSCOPE_PYTHON_DIR,
HAVE_TORCH_BRIDGE (1 when the bridge was built).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

CLI = os.environ["E2E_CLI"]
SIM_CUDART = os.environ["SIM_CUDART"]
PYDIR = os.environ["ALLOCSCOPE_PYTHON_DIR"]
HAVE_BRIDGE = os.environ.get("HAVE_TORCH_BRIDGE") == "1"
PY = sys.executable


def clean_env(**extra):
    env = dict(os.environ)
    for var in ("ALLOCSCOPE_PYTHON", "PYTHONPATH", "LD_PRELOAD", "ALLOCSCOPE_OUT", "ALLOCSCOPE_LIB",
                "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "ALLOCSCOPE_TORCH_BRIDGE",
                "ALLOCSCOPE_PLUGINS", "PYTHONSTARTUP", "PYTHONNOUSERSITE"):
        env.pop(var, None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run(cmd, env, cwd=None):
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    return p


def report_rank(out):
    """Rank 0 of `allocscope report OUT --format json`; fails the test when
    the report fails or holds no rank."""
    r = run([CLI, "report", out, "--format", "json"], clean_env())
    assert r.returncode == 0, "report failed: %s" % r.stderr
    try:
        return json.loads(r.stdout)["ranks"][0]
    except (ValueError, KeyError, IndexError) as e:
        pytest.fail("no rank in the JSON report (%s): %r" % (e, r.stdout[:500]))


@pytest.fixture
def scratch():
    """A fresh directory, removed after the test."""
    path = tempfile.mkdtemp(prefix="allocscope-pyshim-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ the package

TAGGED_PROGRAM = textwrap.dedent(
    """
    import ctypes, os, sys
    import allocscope
    assert allocscope.available(), "interposer not found"
    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    process = ctypes.CDLL(None)
    malloc, free = process.cudaMalloc, process.cudaFree
    malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    allocscope.register_param("layers.1.fc1", "weight", 262144, "bf16", 131072)
    held = []
    for step in range(2):
        allocscope.step(step)
        with allocscope.scope("layers.1", "forward"):
            with allocscope.scope("layers.1.fc1", "forward"):
                p = ctypes.c_void_p()
                assert malloc(ctypes.byref(p), 262144) == 0
                held.append(p.value)
        allocscope.mark("python-mark-%d" % step)
        with allocscope.scope(None, "backward"):
            p = ctypes.c_void_p()
            assert malloc(ctypes.byref(p), 4096) == 0
            free(p)
    for ptr in held:
        free(ctypes.c_void_p(ptr))
    print("layer path:", allocscope.library_path())
    """
)


def test_package_tags_reach_the_trace(scratch):
    out = os.path.join(scratch, "out")
    env = clean_env(SIM_CUDART=SIM_CUDART)
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--", PY, "-c", TAGGED_PROGRAM], env)
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    assert "liballocscope.so" in p.stdout, (
        "library_path() did not find liballocscope.so: %r" % p.stdout
    )
    traces = [f for f in os.listdir(out) if f.endswith(".trace")] if os.path.isdir(out) else []
    assert len(traces) == 1, "one trace expected, found %s" % traces
    rank = report_rank(out)
    kinds = rank.get("events_by_kind", {})
    assert kinds.get("param") == 1, "param events: %r" % kinds
    assert kinds.get("mark") == 2, "mark events: %r" % kinds
    assert kinds.get("tag_push") == 6 and kinds.get("tag_pop") == 6, "tag events: %r" % kinds
    tags = {(t["layer"], t["phase"]): t for t in rank.get("tags", [])}
    fc1 = tags.get(("layers.1.fc1", "forward"))
    assert fc1 is not None and fc1["allocations"] == 2 and fc1["allocated_bytes"] == 2 * 262144, (
        "layers.1.fc1 forward: %r (tags %r)" % (fc1, sorted(tags))
    )
    bwd = [t for (layer, phase), t in tags.items() if phase == "backward"]
    assert len(bwd) == 1 and bwd[0]["allocations"] == 2, "backward tag: %r" % sorted(tags)
    steps = [s["step"] for s in rank.get("timeline", {}).get("steps", [])]
    assert 1 in steps, "steps %r" % steps


OOM_PROGRAM = textwrap.dedent(
    """
    import ctypes, os
    import allocscope
    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    process = ctypes.CDLL(None)
    malloc = process.cudaMalloc
    malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    allocscope.register_param("layers.0.qkv", "weight", 4096, "bf16", 2048)
    allocscope.step(0)
    with allocscope.scope(None, "optimizer"):
        p = ctypes.c_void_p()
        assert malloc(ctypes.byref(p), 8192) == 0
        allocscope.block_oom(1 << 20, 0, None, 4096)   # the allocator gives up
        allocscope.oom_parameter("layers.0.qkv", "weight")
        assert malloc(ctypes.byref(p), 8192) == 0     # caught: the program goes on
    allocscope.step(1)
    with allocscope.scope(None, "optimizer"):
        allocscope.block_oom(1 << 20, 0, None, 4096)
        allocscope.oom_parameter("layers.9.mlp", "bias", 12)  # never registered
    print("oom ok")
    """
)


def test_an_oom_moment_names_the_parameter_the_program_said_it_was_processing(scratch):
    out = os.path.join(scratch, "out")
    env = clean_env(SIM_CUDART=SIM_CUDART)
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--", PY, "-c", OOM_PROGRAM], env)
    assert "oom ok" in p.stdout, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    moments = report_moments(out)
    assert [(m["parameter"], m["parameter_count"]) for m in moments] == [
        ("layers.0.qkv.weight", 1),
        ("layers.9.mlp.bias", 12),
    ], moments
    assert all(m["phase"] == "optimizer" and m["requested"] == 1 << 20 for m in moments)
    text = run([CLI, "report", out], clean_env())
    assert "processing parameter layers.0.qkv.weight" in text.stdout, text.stdout[:2000]


def report_moments(out):
    r = run([CLI, "report", out, "--format", "json"], clean_env())
    assert r.returncode == 0, "report failed: %s" % r.stderr
    return json.loads(r.stdout)["out_of_memory"]


KEYED_PROGRAM = textwrap.dedent(
    """
    import ctypes, os
    import allocscope
    api = allocscope._get()
    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    process = ctypes.CDLL(None)
    malloc, free = process.cudaMalloc, process.cudaFree
    malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]

    def alloc(size):
        p = ctypes.c_void_p()
        assert malloc(ctypes.byref(p), size) == 0
        free(p)

    F, B = 1, 2
    assert api.enter(10, F, 3, b"", b"forward") == 0
    assert api.enter(11, F, 3, b"layers.0", b"forward") == 1
    assert api.keyed_depth() == 2
    assert api.keyed_kind_depth(F) == 2 and api.keyed_kind_depth(B) == 0
    buf = ctypes.create_string_buffer(64)
    assert api.current_layer(buf, 64) == len(b"layers.0") and buf.value == b"layers.0"
    alloc(30001)
    assert api.leave(10, F, None) == 3      # pops layers.0 too
    assert api.leave(11, F, None) == -1     # gone with it
    assert api.keyed_depth() == 0
    assert api.enter_nested(11, B, 3, b"layers.0", b"backward") == 1
    assert api.enter_nested(12, B, 3, b"layers.1", b"backward") == 1   # layers.0 is over
    alloc(30002)
    assert api.keyed_depth() == 1
    assert api.keyed_kind_depth(B) == 1 and api.keyed_kind_depth(F) == 0
    api.leave_kind(B, (1 << 64) - 1)
    assert api.keyed_depth() == 0
    alloc(30003)
    print("keyed ok")
    """
)


def test_keyed_tags_through_the_package(scratch):
    out = os.path.join(scratch, "out")
    env = clean_env(SIM_CUDART=SIM_CUDART)
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--", PY, "-c", KEYED_PROGRAM], env)
    assert p.returncode == 0 and "keyed ok" in p.stdout, (
        "exit status %d; stdout %r; stderr:\n%s" % (p.returncode, p.stdout, p.stderr)
    )
    rank = report_rank(out)
    tags = {(t["layer"], t["phase"]): t["allocations"] for t in rank.get("tags", [])}
    assert tags.get(("layers.0", "forward")) == 1, "layers.0 forward: %r" % tags
    assert tags.get(("layers.1", "backward")) == 1, "layers.1 backward: %r" % tags
    assert tags.get(("layers.0", "backward"), 0) == 0, "layers.0's backward was over: %r" % tags
    kinds = rank.get("events_by_kind", {})
    assert kinds.get("tag_push") == kinds.get("tag_pop") == 4, "tag events: %r" % kinds


# The C API's frame naming and block allocation with frames, through ctypes.
BLOCK_FRAMES_API = textwrap.dedent(
    """
    import ctypes
    process = ctypes.CDLL(None)
    frame = process.allocscope_python_frame
    frame.restype = ctypes.c_uint64
    frame.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    alloc = process.allocscope_block_alloc_frames
    alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                      ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    """
)


FRAMES_PROGRAM = BLOCK_FRAMES_API + textwrap.dedent(
    """
    inner = frame(b"Block.forward", b"/src/model.py", 42)
    outer = frame(b"train_step", b"/src/train.py", 7)
    assert inner and outer and inner != outer
    assert frame(b"Block.forward", b"/src/model.py", 42) == inner  # named once
    frames = (ctypes.c_uint64 * 2)(inner, outer)
    alloc(ctypes.c_void_p(0x7f0000100000), 1 << 20, 0, None, frames, 2)  # kept until exit
    """
)


PROVIDER_PROGRAM = textwrap.dedent(
    """
    import ctypes, os
    ctypes.CDLL(os.environ["SIM_CUDART"], mode=os.RTLD_GLOBAL)
    process = ctypes.CDLL(None)
    malloc = process.cudaMalloc
    malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    frame = process.allocscope_python_frame
    frame.restype = ctypes.c_uint64
    frame.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    calls = []

    # What a bridge registers: the thread's Python frames, named from
    # inside the interposer's hook (allocscope_python_frame works there).
    @ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    def provider(out, max_frames):
        calls.append(max_frames)
        names = [frame(b"Model.forward", b"/src/model.py", 11), frame(b"main", b"/src/train.py", 3)]
        for i, address in enumerate(names[:max_frames]):
            out[i] = address
        return len(names)

    process.allocscope_set_outer_frames.argtypes = [ctypes.c_void_p]
    process.allocscope_set_outer_frames(ctypes.cast(provider, ctypes.c_void_p))
    held = ctypes.c_void_p()
    assert malloc(ctypes.byref(held), 3 << 20) == 0  # kept until exit
    process.allocscope_set_outer_frames(None)
    plain = ctypes.c_void_p()
    assert malloc(ctypes.byref(plain), 5 << 20) == 0  # after unregistering: no frames
    assert calls == [32], calls
    """
)


def test_a_registered_provider_appends_python_frames_to_runtime_allocations(scratch):
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--no-python", "--", PY, "-c",
             PROVIDER_PROGRAM], clean_env(SIM_CUDART=SIM_CUDART))
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    rank = report_rank(out)
    sites = {s["bytes"]: s["frames"] for s in rank.get("sites_at_exit", [])}
    assert set(sites) >= {3 << 20, 5 << 20}, "the 3 MiB and 5 MiB segments at exit: %r" % sites
    with_provider = sites.get(3 << 20, [])
    assert (with_provider[-2:] == ["Model.forward (/src/model.py:11)", "main (/src/train.py:3)"]
            and len(with_provider) > 2), (
        "native frames, then the provider's, innermost first: %r" % with_provider
    )
    assert not any(".py:" in f for f in sites.get(5 << 20, [])), (
        "no Python frames once unregistered: %r" % sites.get(5 << 20)
    )


ALTERNATING_FRAMES_PROGRAM = BLOCK_FRAMES_API + textwrap.dedent(
    """
    first = (ctypes.c_uint64 * 1)(frame(b"first", b"/src/a.py", 1))
    second = (ctypes.c_uint64 * 1)(frame(b"second", b"/src/b.py", 2))
    for i in range(8):  # one call site: the same native stack every time
        frames, size = (first, 1 << 20) if i % 2 == 0 else (second, 2 << 20)
        alloc(ctypes.c_void_p(0x7f0000000000 + (i << 24)), size, 0, None, frames, 1)
    """
)


def test_one_native_stack_with_alternating_python_frames_gives_two_sites(scratch):
    # The native walk is replayed from the second call on; the stack id kept
    # with it must still follow the Python frames.
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--no-python", "--", PY, "-c",
             ALTERNATING_FRAMES_PROGRAM], clean_env(ALLOCSCOPE_LOG="debug"))
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    rank = report_rank(out)
    sites = {s["frames"][-1]: s["bytes"] for s in rank.get("sites_at_exit", []) if s["frames"]}
    assert sites.get("first (/src/a.py:1)") == 4 << 20 and sites.get("second (/src/b.py:2)") == 8 << 20, (
        "4 MiB under first, 8 MiB under second: %r" % sites
    )


def test_python_frames_follow_the_native_stack_in_reports(scratch):
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--no-python", "--", PY, "-c",
             FRAMES_PROGRAM], clean_env())
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    rank = report_rank(out)
    sites = rank.get("sites_at_exit")
    assert sites is not None, "no sites_at_exit in the JSON report"
    block = [s for s in sites if s["bytes"] == 1 << 20]
    assert len(block) == 1, "the 1 MiB block at exit: %r" % sites
    frames = block[0]["frames"]
    assert len(frames) >= 3, "native frames and two Python frames: %r" % frames
    assert frames[-2:] == ["Block.forward (/src/model.py:42)", "train_step (/src/train.py:7)"], (
        "Python frames last, innermost first: %r" % frames
    )
    assert not any("python+0x" in f for f in frames[:-2]), "native frames: %r" % frames
    text = run([CLI, "report", out], clean_env())
    lines = [l.strip() for l in text.stdout.splitlines()]
    at = lines.index("Block.forward (/src/model.py:42)") if "Block.forward (/src/model.py:42)" in lines else -1
    assert at > 0 and lines[at + 1] == "train_step (/src/train.py:7)", (
        "the text report's site shows both Python frames in order:\n%s" % text.stdout[-3000:]
    )


ALIAS_PROGRAM = BLOCK_FRAMES_API + textwrap.dedent(
    """
    alias = process.allocscope_python_frame_alias
    alias.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    generated = b"/tmp/torchinductor_me/ab/cabcdef.py"
    early = frame(b"call", generated, 9)  # named before any alias: keeps its name
    alias(generated, 12, b"forward [compiled: buf4]", b"/src/model.py", 269)
    alias(generated, 9, b"forward [compiled: buf1]", b"/src/model.py", 269)
    named = frame(b"call", generated, 12)
    other = frame(b"call", generated, 13)  # a line without an alias
    assert frame(b"call", generated, 9) != early, "named again after its alias"
    outer = frame(b"train_step", b"/src/train.py", 7)
    for i, first in enumerate((named, other, early)):
        frames = (ctypes.c_uint64 * 2)(first, outer)
        alloc(ctypes.c_void_p(0x7f0000100000 + (i << 24)), (i + 1) << 20, 0, None, frames, 2)
    """
)


def test_generated_frames_are_named_after_the_source_line_they_were_generated_from(scratch):
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--no-python", "--", PY, "-c",
             ALIAS_PROGRAM], clean_env())
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    sites = {s["bytes"]: s["frames"] for s in report_rank(out).get("sites_at_exit", [])}
    assert sites[1 << 20][-2:] == ["forward [compiled: buf4] (/src/model.py:269)",
                                   "train_step (/src/train.py:7)"], sites
    assert sites[2 << 20][-2:] == ["call (/tmp/torchinductor_me/ab/cabcdef.py:13)",
                                   "train_step (/src/train.py:7)"], sites
    assert sites[3 << 20][-2:] == ["call (/tmp/torchinductor_me/ab/cabcdef.py:9)",
                                   "train_step (/src/train.py:7)"], sites


SCOPE_PROGRAM = BLOCK_FRAMES_API + textwrap.dedent(
    """
    scope = process.allocscope_python_frame_scope
    scope.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                      ctypes.c_char_p, ctypes.c_char_p]
    process.allocscope_push.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    process.allocscope_register_param.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                                  ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64]
    process.allocscope_register_param(b"layers.0.fc1", b"weight", 65536, b"bf16", 65536)
    generated = b"/tmp/torchinductor_me/cd/ccompiled.py"
    scope(generated, 20, b"fc1", b"fc1", b"weight", b"compiled graph: fc1.weight -> _to_copy")
    scope(generated, 21, b"fc2", None, None, None)
    lines = {n: frame(b"call", generated, n) for n in (20, 21, 22)}
    process.allocscope_push(b"layers.0", b"forward")
    for i, n in enumerate((20, 21, 22, 20)):
        frames = (ctypes.c_uint64 * 1)(lines[n])
        alloc(ctypes.c_void_p(0x7f0000100000 + (i << 24)), 1 << 20, 0, None, frames, 1)
    process.allocscope_pop()
    frames = (ctypes.c_uint64 * 1)(lines[21])  # outside any layer: the module alone
    alloc(ctypes.c_void_p(0x7f0010000000), 1 << 20, 0, None, frames, 1)
    """
)


def test_generated_lines_tag_their_module_and_declare_what_derives_from_a_parameter(scratch):
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--no-python", "--", PY, "-c",
             SCOPE_PROGRAM], clean_env())
    assert p.returncode == 0, "run exit status %d; stderr:\n%s" % (p.returncode, p.stderr)
    rank = report_rank(out)
    tags = {(t["layer"], t["phase"]): t["allocations"] for t in rank.get("tags", [])}
    assert tags.get(("layers.0.fc1", "forward")) == 2, tags
    assert tags.get(("layers.0.fc2", "forward")) == 1, tags
    assert tags.get(("layers.0", "forward")) == 1, "a line without a scope keeps the layer: %r" % tags
    assert [n for (layer, _), n in tags.items() if layer == "fc2"] == [1], tags
    assert rank.get("events_by_kind", {}).get("derived") == 2, (
        "each allocation of the fc1.weight line is declared derived: %r" % rank.get("events_by_kind"))


def test_package_without_interposer_is_a_noop_with_one_warning(scratch):
    code = textwrap.dedent(
        """
        import allocscope
        assert not allocscope.available()
        for i in range(3):
            allocscope.push("layers.0", "forward")
            allocscope.register_param("layers.0", "weight", 10, "bf16")
            allocscope.step(i)
            allocscope.mark("x")
            with allocscope.scope("a", "b"):
                pass
            allocscope.pop()
        print("ok")
        """
    )
    p = run([PY, "-c", code], clean_env(PYTHONPATH=PYDIR))
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    assert p.stdout.strip() == "ok", "stdout %r" % p.stdout
    lines = [l for l in p.stderr.splitlines() if l.startswith("allocscope:")]
    assert len(lines) == 1 and "not loaded" in lines[0], "want one warning, got %r" % p.stderr


# ------------------------------------------------------------------ sitecustomize

PROBE = textwrap.dedent(
    """
    import sys
    names = [type(f).__name__ for f in sys.meta_path]
    print("finder=%s" % ("_AllocscopeTorchFinder" in names))
    print("torch=%s" % ("torch" in sys.modules))
    print("allocscope=%s" % ("allocscope" in sys.modules or "allocscope.torch" in sys.modules))
    import builtins
    print("chained=%s" % getattr(builtins, "CHAINED_SITECUSTOMIZE", False))
    sc = sys.modules.get("sitecustomize")
    print("sitecustomize=%s" % (getattr(sc, "__file__", None),))
    """
)


def probe(env):
    p = run([PY, "-c", PROBE], env)
    values = dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)
    return p, values


def write_other_sitecustomize(scratch):
    other = os.path.join(scratch, "other")
    os.makedirs(other)
    path = os.path.join(other, "sitecustomize.py")
    with open(path, "w") as f:
        f.write("import builtins\nbuiltins.CHAINED_SITECUSTOMIZE = True\n")
    return other, path


def test_sitecustomize_does_nothing_without_ALLOCSCOPE_PYTHON(scratch):
    p, v = probe(clean_env(PYTHONPATH=PYDIR))
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    assert v.get("finder") == "False", "a finder was installed: %r" % p.stdout
    assert v.get("allocscope") == "False", "allocscope was imported: %r" % p.stdout
    assert p.stderr == "", "stderr: %r" % p.stderr


def test_sitecustomize_chains_to_the_one_it_shadows(scratch):
    other, path = write_other_sitecustomize(scratch)
    for flag in ("0", "1"):
        p, v = probe(clean_env(PYTHONPATH=PYDIR + os.pathsep + other, ALLOCSCOPE_PYTHON=flag))
        assert p.returncode == 0, (
            "ALLOCSCOPE_PYTHON=%s: exit status %d: %s" % (flag, p.returncode, p.stderr)
        )
        assert v.get("chained") == "True", (
            "ALLOCSCOPE_PYTHON=%s: the other sitecustomize did not run: %r" % (flag, p.stdout)
        )
        assert v.get("sitecustomize") == path, (
            "ALLOCSCOPE_PYTHON=%s: sys.modules['sitecustomize'] is %r, want %r" % (flag, v.get("sitecustomize"), path)
        )
        assert v.get("finder") == ("True" if flag == "1" else "False"), (
            "ALLOCSCOPE_PYTHON=%s: finder=%r" % (flag, v.get("finder"))
        )


def test_sitecustomize_waits_for_the_programs_import_torch(scratch):
    fake = os.path.join(scratch, "fake")
    os.makedirs(os.path.join(fake, "torch"))
    with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
        f.write("import sys\nsys.stdout.write('fake torch imported\\n')\nsys.stdout.flush()\n")
    code = textwrap.dedent(
        """
        import sys
        print("before: torch=%s finder=%s" % ("torch" in sys.modules,
              any(type(f).__name__ == "_AllocscopeTorchFinder" for f in sys.meta_path)))
        sys.stdout.flush()
        import torch
        print("after: finder=%s loader=%s" % (
              any(type(f).__name__ == "_AllocscopeTorchFinder" for f in sys.meta_path),
              type(torch.__loader__).__name__))
        sys.stdout.flush()
        """
    )
    env = clean_env(PYTHONPATH=os.pathsep.join([PYDIR, fake]), ALLOCSCOPE_PYTHON="1")
    p = run([PY, "-u", "-c", code], env)
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    lines = p.stdout.splitlines()
    assert lines[:1] == ["before: torch=False finder=True"], "stdout %r" % p.stdout
    assert "fake torch imported" in lines, (
        "the program's import torch did not run torch: %r" % p.stdout
    )
    assert any(l.startswith("after: finder=False loader=") and "Allocscope" not in l for l in lines), (
        "finder left behind or loader not restored: %r" % p.stdout
    )
    # The stand-in torch has nothing allocscope.torch needs: the setup ran
    # (after the import) and said so in one line; the program went on.
    said = [l for l in p.stderr.splitlines() if l.startswith("allocscope:")]
    assert len(said) == 1, "want one allocscope line after import torch, got %r" % p.stderr


def test_sitecustomize_costs_a_non_torch_program_nothing(scratch):
    code = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.startswith(('torch', 'allocscope')))))"
    p = run([PY, "-c", code], clean_env(PYTHONPATH=PYDIR, ALLOCSCOPE_PYTHON="1"))
    assert p.returncode == 0 and p.stdout.strip() == "[]", (
        "modules %r stderr %r" % (p.stdout, p.stderr)
    )


# ------------------------------------------------------------------ allocscope run


PRINT_ENV = "import os\nfor k, v in os.environ.items(): print(k + '=' + v)"


def run_env(scratch, extra_args=(), command=None, **env_extra):
    out = os.path.join(scratch, "out-%d" % len(os.listdir(scratch)))
    command = command or [PY, "-c", PRINT_ENV]
    p = run([CLI, "run", "--out", out, "--plugins", "none"] + list(extra_args) + ["--"] + command,
            clean_env(**env_extra))
    child = dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)
    return p, child


def fallback_lines(stderr):
    return [l for l in stderr.splitlines() if "PyTorch bridge is not built" in l]


def test_the_fallback_line_is_said_only_for_python_programs(scratch):
    if HAVE_BRIDGE:
        pytest.skip("bridge built: no fallback to check")
    p, child = run_env(scratch, command=["env"])
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    assert child.get("PYTORCH_CUDA_ALLOC_CONF") == "backend:cudaMallocAsync", (
        "the setting still reaches the child: %r" % child.get("PYTORCH_CUDA_ALLOC_CONF")
    )
    assert not fallback_lines(p.stderr), "a fallback line for `env`: %r" % p.stderr


def test_run_sets_python_environment(scratch):
    p, child = run_env(scratch)
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    assert child.get("ALLOCSCOPE_PYTHON") == "1", (
        "ALLOCSCOPE_PYTHON=%r" % child.get("ALLOCSCOPE_PYTHON")
    )
    pp = child.get("PYTHONPATH", "")
    first = pp.split(os.pathsep)[0]
    assert os.path.exists(os.path.join(first, "sitecustomize.py")) and os.path.isdir(os.path.join(first, "allocscope")), (
        "PYTHONPATH %r does not start with the shim's directory" % pp
    )
    p2, child2 = run_env(scratch, PYTHONPATH="/some/where")
    assert child2.get("PYTHONPATH") == first + os.pathsep + "/some/where", (
        "PYTHONPATH not prepended: %r" % child2.get("PYTHONPATH")
    )
    if HAVE_BRIDGE:
        assert os.path.exists(child.get("ALLOCSCOPE_TORCH_BRIDGE", "")), (
            "ALLOCSCOPE_TORCH_BRIDGE=%r" % child.get("ALLOCSCOPE_TORCH_BRIDGE")
        )
        assert "PYTORCH_CUDA_ALLOC_CONF" not in child, (
            "allocator changed although the bridge is built"
        )
        assert not fallback_lines(p.stderr), "fallback line although the bridge is built"
    else:
        assert child.get("PYTORCH_CUDA_ALLOC_CONF") == "backend:cudaMallocAsync", (
            "PYTORCH_CUDA_ALLOC_CONF=%r" % child.get("PYTORCH_CUDA_ALLOC_CONF")
        )
        assert len(fallback_lines(p.stderr)) == 1, "want one fallback line: %r" % p.stderr
        assert "ALLOCSCOPE_TORCH_BRIDGE" not in child, (
            "ALLOCSCOPE_TORCH_BRIDGE set without a bridge"
        )


def test_run_merges_the_fallback_with_the_users_allocator_settings(scratch):
    if HAVE_BRIDGE:
        pytest.skip("bridge built: no fallback to check")
    p, child = run_env(scratch, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert child.get("PYTORCH_CUDA_ALLOC_CONF") == "backend:cudaMallocAsync,expandable_segments:True", (
        "merged: %r" % child.get("PYTORCH_CUDA_ALLOC_CONF")
    )
    assert len(fallback_lines(p.stderr)) == 1, "want one fallback line: %r" % p.stderr
    p, child = run_env(scratch, PYTORCH_ALLOC_CONF="max_split_size_mb:64")
    assert child.get("PYTORCH_ALLOC_CONF") == "backend:cudaMallocAsync,max_split_size_mb:64", (
        "PYTORCH_ALLOC_CONF merged: %r" % child.get("PYTORCH_ALLOC_CONF")
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in child, (
        "PYTORCH_CUDA_ALLOC_CONF added next to PYTORCH_ALLOC_CONF"
    )
    for var, value in (("PYTORCH_CUDA_ALLOC_CONF", "backend:native"),
                       ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True, backend : native"),
                       ("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")):
        p, child = run_env(scratch, **{var: value})
        assert child.get(var) == value, "%s=%r was changed to %r" % (var, value, child.get(var))
        assert not fallback_lines(p.stderr), "fallback line although %s sets a backend" % var


def test_run_no_python_leaves_python_alone(scratch):
    p, child = run_env(scratch, ["--no-python"], PYTHONPATH="/some/where")
    assert p.returncode == 0, "exit status %d: %s" % (p.returncode, p.stderr)
    assert "ALLOCSCOPE_PYTHON" not in child, "ALLOCSCOPE_PYTHON set"
    assert child.get("PYTHONPATH") == "/some/where", "PYTHONPATH=%r" % child.get("PYTHONPATH")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in child and not fallback_lines(p.stderr), (
        "allocator changed"
    )
    h = run([CLI, "run", "--help"], clean_env())
    assert "--no-python" in h.stdout and "PYTORCH_CUDA_ALLOC_CONF" in h.stdout, (
        "usage text lacks the Python part"
    )


def test_python_under_run_is_tagged_without_changes(scratch):
    # sitecustomize under `allocscope run` in a process that never imports
    # torch: nothing of the shim is imported, the program is unchanged.
    out = os.path.join(scratch, "out")
    p = run([CLI, "run", "--out", out, "--plugins", "none", "--", PY, "-c",
             "import sys; print(sorted(m for m in sys.modules if m.startswith('allocscope')))"],
            clean_env())
    assert p.returncode == 0 and p.stdout.strip() == "[]", (
        "stdout %r stderr %r" % (p.stdout, p.stderr)
    )

