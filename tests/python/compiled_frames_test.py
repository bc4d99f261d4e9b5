"""torch.compile's generated frames named by the user's lines
(allocscope/torch/_compiled.py), without torch: the naming of a generated
file from inductor's line map, the wrapper around PyCodeCache's loader and
the import hook that installs it."""

import os
import sys
import tempfile
import textwrap
import types

import pytest

sys.path.insert(0, os.environ.get("ALLOCSCOPE_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "../../tools/python")))
import allocscope  # noqa: E402
import importlib  # noqa: E402

# allocscope.torch's __init__ imports torch: a bare package of its folder
# instead, so that _compiled and what it imports (_params) load alone.
if "allocscope.torch" not in sys.modules:
    _package = types.ModuleType("allocscope.torch")
    _package.__path__ = [os.path.join(os.path.dirname(allocscope.__file__), "torch")]
    sys.modules["allocscope.torch"] = _package
compiled = importlib.import_module("allocscope.torch._compiled")

# The shape of inductor's output (torch 2.11, a LayerNorm's forward graph).
GENERATED = textwrap.dedent(
    """\
    def call(args):
        primals_1, primals_2, primals_3 = args
        args.clear()
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((2, 32, 1), (32, 1, 1), torch.float32)
            buf1 = empty_strided_cuda((2, 32, 1), (32, 1, 64), torch.float32)
            buf3 = reinterpret_tensor(buf1, (2, 32, 1), (32, 1, 1), 0); del buf1  # reuse
            buf4 = empty_strided_cuda((2, 32, 256), (8192, 256, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [layer_norm], Original ATen: [aten.native_layer_norm]
            stream0 = get_raw_stream(0)
            triton_per_fused_native_layer_norm_0.run(buf4, 64, 256, stream=stream0)
            buf5 = buf4; del buf4  # reuse
            buf6 = torch.ops.aten._scaled_mm.default(buf5, primals_2)
            buf7 = empty_strided_cuda((64, ), (1, ), torch.float32)
        return (buf4, primals_1, buf0, buf3, )
    """
).splitlines()

LN_TRACE = (
    'File "/src/train.py", line 400, in main\n    y = model(x)\n'
    'File "/src/model.py", line 269, in forward\n    q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)\n'
)
MM_TRACE = '  File "/src/fp8.py", line 104, in forward\n    y = torch._scaled_mm(xq, wq.t())\n'


def test_the_innermost_frame_of_a_node_stack_trace_is_the_users_line():
    assert compiled.user_frame(LN_TRACE) == ("forward", "/src/model.py", 269)
    assert compiled.user_frame(MM_TRACE) == ("forward", "/src/fp8.py", 104)
    assert compiled.user_frame("") is None
    assert compiled.user_frame("no frames here") is None


def test_each_allocating_line_is_named_after_the_node_whose_code_it_belongs_to():
    linemap = [(5, LN_TRACE), (14, MM_TRACE), (16, None)]
    got = compiled.aliases(GENERATED, linemap)
    assert got == [
        (6, "forward [compiled: buf0]", "/src/model.py", 269),
        (7, "forward [compiled: buf1]", "/src/model.py", 269),
        (9, "forward [compiled: buf4]", "/src/model.py", 269),
        (14, "forward [compiled: buf6]", "/src/fp8.py", 104),
        (15, "forward [compiled: buf7]", "/src/fp8.py", 104),
    ], "views (reinterpret_tensor) and reuses (buf5 = buf4) allocate nothing: %r" % got


def test_lines_before_the_first_mapped_node_keep_their_generated_name():
    assert compiled.aliases(GENERATED, [(10, LN_TRACE)]) == [
        (14, "forward [compiled: buf6]", "/src/model.py", 269),
        (15, "forward [compiled: buf7]", "/src/model.py", 269),
    ]
    assert compiled.aliases(GENERATED, []) == []
    assert compiled.aliases(GENERATED, None) == []


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def recorded(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(compiled._allocscope, "python_frame_alias", recorder)
    return recorder


def _codecache(path_module):
    """A stand-in for torch._inductor.codecache: PyCodeCache.load_by_key_path."""
    module = types.ModuleType("fake_codecache")

    class PyCodeCache:
        loads = []

        @classmethod
        def load_by_key_path(cls, key, path, linemap=None, attrs=None):
            cls.loads.append((key, path, linemap, attrs))
            return path_module

    module.PyCodeCache = PyCodeCache
    return module


def test_the_wrapped_loader_returns_inductors_module_and_names_its_frames(recorded, tmp_path):
    path = tmp_path / "cab.py"
    path.write_text("\n".join(GENERATED) + "\n")
    loaded = object()
    cache = _codecache(loaded)
    compiled._wrap(cache)
    compiled._wrap(cache)  # once only
    got = cache.PyCodeCache.load_by_key_path("k", str(path), [(5, LN_TRACE)], attrs={"a": 1})
    assert got is loaded
    assert cache.PyCodeCache.loads == [("k", str(path), [(5, LN_TRACE)], {"a": 1})]
    assert recorded.calls == [
        (str(path), 6, "forward [compiled: buf0]", "/src/model.py", 269),
        (str(path), 7, "forward [compiled: buf1]", "/src/model.py", 269),
        (str(path), 9, "forward [compiled: buf4]", "/src/model.py", 269),
        (str(path), 14, "forward [compiled: buf6]", "/src/model.py", 269),
        (str(path), 15, "forward [compiled: buf7]", "/src/model.py", 269),
    ]
    # A kernel module loaded without a line map names nothing.
    recorded.calls.clear()
    assert cache.PyCodeCache.load_by_key_path("k2", str(path)) is loaded
    assert recorded.calls == []


def test_a_file_that_cannot_be_read_still_loads(recorded, tmp_path):
    loaded = object()
    cache = _codecache(loaded)
    compiled._wrap(cache)
    missing = str(tmp_path / "gone.py")
    assert cache.PyCodeCache.load_by_key_path("k", missing, [(5, LN_TRACE)]) is loaded
    assert recorded.calls == []


def test_the_import_hook_runs_after_the_module_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "allocscope_fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "codecache.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = compiled._Finder("allocscope_fakepkg.codecache", lambda m: seen.append(m.VALUE))
    sys.meta_path.insert(0, finder)
    try:
        import allocscope_fakepkg.codecache as imported  # noqa: F401
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    assert imported.VALUE == 7
    assert seen == [7], "called once, with the executed module"
    assert finder not in sys.meta_path, "the finder removes itself"
    import allocscope_fakepkg  # noqa: F401  other imports are not its business


def test_dynamo_source_names_give_paths_from_the_compiled_root():
    assert compiled.relative_path("L['self'].ln1") == "ln1"
    assert compiled.relative_path("L['self']") == ""
    assert compiled.relative_path("L['self']._modules['fc1']._parameters['weight']") == "fc1.weight"
    assert compiled.relative_path("L['self'].layers[0].attn") == "layers.0.attn"
    assert compiled.relative_path("getattr(L['self'].blocks, '3').mlp") == "blocks.3.mlp"
    assert compiled.relative_path("L['self']._orig_mod.fc2") == "fc2", "wrappers are not modules"
    assert compiled.relative_path("G['model'].fc") is None, "a global is no local of the frame"
    assert compiled.relative_path("self.fc1") is None


class Node:
    """An FX node's shape, as scopes() reads it."""

    def __init__(self, graph, name, op, target=None, inputs=(), module=None, tensor=True):
        self.graph, self.name, self.op, self.target = graph, name, op, target
        self.all_input_nodes = list(inputs)
        self.meta = {"val": types.SimpleNamespace(dtype="bf16", shape=(4, 4))} if tensor else {}
        if module is not None:
            self.meta["nn_module_stack"] = {"k0": ("L['self']", object), "k1": (module, object)}
        graph.nodes.append(self)


class Graph:
    def __init__(self):
        self.nodes = []


class Buffer:
    def __init__(self, node):
        self.origin_node = node


def _fp8_graph():
    """x, fc1.weight -> weight's FP8 copy (abs, amax, mul, convert) -> mm(x, copy)."""
    g = Graph()
    w = Node(g, "primals_1", "placeholder")
    x = Node(g, "primals_2", "placeholder")
    n = Node(g, "n", "placeholder", tensor=False)  # a SymInt input: no data
    a = Node(g, "abs_1", "call_function", "aten.abs.default", [w], "L['self'].fc1")
    m = Node(g, "amax", "call_function", "aten.amax.default", [a], "L['self'].fc1")
    s = Node(g, "mul", "call_function", "aten.mul.Tensor", [w, m, n], "L['self'].fc1")
    q = Node(g, "cvt", "call_function", "prims.convert_element_type.default", [s], "L['self'].fc1")
    y = Node(g, "mm", "call_function", "aten._scaled_mm.default", [x, q], "L['self'].fc1")
    o = Node(g, "relu", "call_function", "aten.relu.default", [y])  # no module stack
    return g, {"w": w, "x": x, "abs": a, "q": q, "y": y, "o": o}


FP8_SOURCE = [
    "def call(args):",
    "    buf0 = empty_strided_cuda((4, 4), (4, 1), torch.float32)",
    "    buf1 = empty_strided_cuda((4, 4), (4, 1), torch.float8_e4m3fn)",
    "    buf2 = empty_strided_cuda((4, 4), (4, 1), torch.bfloat16)",
    "    buf3 = reinterpret_tensor(buf2, (16, ), (1, ), 0)",
    "    buf4 = empty_strided_cuda((4, 4), (4, 1), torch.bfloat16)",
    "    buf5 = empty_strided_cuda((4, 4), (4, 1), torch.bfloat16)",
]


def test_a_buffer_computed_from_a_parameter_alone_is_derived_from_it_and_tagged_with_its_module():
    g, n = _fp8_graph()
    buffers = {"buf0": Buffer(n["abs"]), "buf1": Buffer(n["q"]), "buf2": Buffer(n["y"]),
               "buf4": Buffer(n["o"]), "buf5": Buffer(None)}
    params = {n["w"]: ("fc1", "weight")}
    got = compiled.scopes(FP8_SOURCE, buffers, g, params, saved={n["q"]})
    assert got == [
        (2, "fc1", "fc1", "weight", "torch.compile'd graph: fc1.weight -> abs"),
        (3, "fc1", "fc1", "weight",
         "torch.compile'd graph: fc1.weight -> mul -> convert_element_type; saved for backward"),
        (4, "fc1", None, None, None),
    ], ("an activation times a weight is an activation (buf2); a node without a module and "
        "not derived (buf4) and a buffer without a node (buf5) are left out: %r" % got)


def test_without_known_parameters_buffers_are_only_tagged():
    g, n = _fp8_graph()
    buffers = {"buf1": Buffer(n["q"])}
    assert compiled.scopes(FP8_SOURCE, buffers, g, {}, saved=set()) == [(3, "fc1", None, None, None)]


def test_a_node_of_another_graph_is_not_trusted():
    g, n = _fp8_graph()
    other, m = _fp8_graph()
    assert compiled.scopes(FP8_SOURCE, {"buf1": Buffer(m["q"])}, g, {m["w"]: ("fc1", "weight")}, set()) == []


class Module:
    """A module's shape as frame_module reads it: its own parameters."""

    def __init__(self, **parameters):
        self._parameters = parameters


class Tensor:
    pass


def _names_of(modules):
    """_naming's table for {name: module}."""
    import weakref

    return {id(m): (weakref.ref(m), name, False, name.encode()) for name, m in modules.items()}


def test_the_compiled_frames_module_is_found_from_the_parameters_it_is_called_with():
    # One generated file for sibling linears of one shape (Dynamo guards on
    # neither): which one ran is known from the parameter passed.
    wq, wk, x = Tensor(), Tensor(), Tensor()
    q, k = Module(weight=wq), Module(weight=wk)
    block = Module()
    names = _names_of({"layers.0": block, "layers.0.wq": q, "layers.0.wk": k})
    inputs = [(0, ("", "weight"))]  # the frame's self is the linear: L['self']._parameters['weight']
    assert compiled.frame_module([wq, x], inputs, names) is q
    assert compiled.frame_module([wk, x], inputs, names) is k
    assert compiled.frame_module([Tensor(), x], inputs, names) is None, "an unknown tensor names nothing"


def test_a_parameter_of_a_module_inside_the_frames_self_leads_up_to_it():
    w1, x = Tensor(), Tensor()
    fc1, mlp = Module(weight=w1), Module()
    names = _names_of({"layers.3.mlp": mlp, "layers.3.mlp.fc1": fc1})
    assert compiled.frame_module([x, w1], [(1, ("fc1", "weight"))], names) is mlp
    # A path that does not end the owner's name is not trusted.
    assert compiled.frame_module([x, w1], [(1, ("fc2", "weight"))], names) is None


def test_a_frame_whose_self_is_the_models_root_enters_nothing():
    w = Tensor()
    fc = Module(weight=w)
    names = _names_of({"": Module(), "fc": fc})
    assert compiled.frame_module([w], [(0, ("fc", "weight"))], names) is None


def test_a_parameter_of_a_module_named_later_is_found_then():
    w, x = Tensor(), Tensor()
    fc = Module(weight=w)
    names = _names_of({"layers.0": Module()})
    inputs = [(0, ("", "weight"))]
    assert compiled.frame_module([w, x], inputs, names) is None, "not named yet"
    names.update(_names_of({"layers.0.fc": fc}))
    assert compiled.frame_module([w, x], inputs, names) is fc


def test_a_parameter_given_as_a_local_names_the_module_that_holds_it():
    # An autograd.Function's forward compiled as a frame of its own takes
    # the weight as an argument ("L['weight']"): no path from a `self`, so
    # the module is the one holding the tensor the call is given.
    wq, wk, x = Tensor(), Tensor(), Tensor()
    q, k = Module(weight=wq), Module(bias=wk)
    names = _names_of({"": Module(), "layers.0": Module(), "layers.0.wq": q, "layers.0.wk": k})
    inputs = [(1, (None, "#1"))]
    assert compiled.frame_module([x, wq], inputs, names) is q
    assert compiled.frame_module([x, wk], inputs, names) is k, "under whatever name it holds it"
    assert compiled.frame_module([x, Tensor()], inputs, names) is None, "an activation names nothing"
    root_weight = Tensor()
    names.update(_names_of({"": Module(weight=root_weight)}))
    assert compiled.frame_module([x, root_weight], inputs, names) is None, "the root's tag is entered"


def test_lines_derived_from_a_local_parameter_are_declared_by_the_name_its_module_holds_it_under(
        monkeypatch):
    declared = []
    monkeypatch.setattr(compiled._allocscope, "python_frame_scope",
                        lambda *a: declared.append(a))
    w, s, x = Tensor(), Tensor(), Tensor()
    fc = Module(weight=w, scale=s)
    at_call = [
        (7, "", None, "#1", "torch.compile'd graph: #1 -> abs -> amax"),
        (9, "", None, "#1", "torch.compile'd graph: #1 -> mul -> convert_element_type"),
        (11, "", None, "#2", "torch.compile'd graph: #2 -> reciprocal"),
    ]
    assert compiled.declare_at_call("gen.py", at_call, [x, w, s], fc)
    assert declared == [
        ("gen.py", 7, "", "", "weight", "torch.compile'd graph: weight -> abs -> amax"),
        ("gen.py", 9, "", "", "weight", "torch.compile'd graph: weight -> mul -> convert_element_type"),
        ("gen.py", 11, "", "", "scale", "torch.compile'd graph: scale -> reciprocal"),
    ], "relative to the module's tag, which the call enters"
    declared.clear()
    other = Module(weight=w)
    assert not compiled.declare_at_call("gen.py", at_call, [x, w, s], other), \
        "a module that does not hold every one of them declares nothing"
    assert not compiled.declare_at_call("gen.py", at_call, [x, w], fc), "nor a call without them"
    assert declared == []


def test_a_parameter_that_is_a_local_of_the_frame_is_known_at_call_time():
    torch = pytest.importorskip("torch")

    class Arg:
        def __init__(self, name):
            self.source = types.SimpleNamespace(name=name)

    g = Graph()
    for i, name in enumerate(["L['x']", "L['weight']", "L['self']._modules['fc']._parameters['bias']"]):
        node = Node(g, "arg%d" % i, "placeholder")
        node.meta["grapharg"] = Arg(name)
    gm = types.SimpleNamespace(graph=g)
    weight = torch.nn.Parameter(torch.zeros(2))
    examples = [torch.zeros(2), weight, torch.zeros(2)]
    assert compiled.param_sources(gm, examples) == [None, (None, "#1"), ("fc", "bias")]


def test_debug_timing_of_the_hooks_stays_out_of_graphs_dynamo_traces(monkeypatch):
    # ALLOCSCOPE_LOG=debug times each hook. Inside a graph Dynamo traces,
    # the timer (time.perf_counter_ns, which Dynamo cannot trace) would
    # break the graph at every module call: a 2-rank FSDP2 run with blocks
    # compiled in place showed 34 graph breaks there, none without
    # allocscope. The hook itself still runs (it does nothing there).
    import time

    cost = importlib.import_module("allocscope.torch._cost")
    monkeypatch.setattr(cost, "_hook_cost", {})
    ticks = []
    monkeypatch.setattr(time, "perf_counter_ns", lambda: ticks.append(1) or len(ticks))
    compiling = [True]
    calls = []

    def hook(*args):
        calls.append(args)

    timed = cost._timed(hook, lambda: compiling[0])
    timed("module", ())
    assert calls == [("module", ())] and ticks == []
    compiling[0] = False
    timed("module", ())
    assert len(calls) == 2 and len(ticks) == 2
    assert cost._hook_cost["hook"][0] == 1

