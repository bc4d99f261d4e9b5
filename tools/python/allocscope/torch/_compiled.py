"""torch.compile's generated code named by the user's lines.

Inductor writes each compiled graph as a Python file whose `call` allocates
the graph's buffers (`buf3 = empty_strided_cuda(...)`) and runs its
kernels. An allocation made there has that generated line as its innermost
Python frame, which says nothing to the user. Inductor loads every such
file, on a fresh compile and on a cache hit alike, through
`PyCodeCache.load_by_key_path(key, path, linemap)`, where `linemap` pairs
lines of the file with the stack trace of the FX node whose code starts
there (inductor's own map for rewriting tracebacks). This module wraps that
call: each line of the file that binds a buffer to a new tensor is named,
through allocscope_python_frame_alias, as the user's source line of the
node whose code it belongs to (the nearest line of the map at or before
it), e.g. `forward [compiled: buf4] (model.py:269)`.

On a fresh compile, inductor's GraphLowering knows more: each buffer's FX
node (the node it was lowered from, not the transitive `origins`), whose
`nn_module_stack` names the module of the user's that made it, relative to
the compiled root; and the graph, a data flow from the graph's inputs.
After GraphLowering.compile_to_module, each allocating line is registered
with allocscope_python_frame_scope: its allocations are tagged
"<enclosing layer>.<module>" (the block's tag, from the hooks around the
compiled call, plus the module inside it), and when the node is computed
from parameters alone (every graph input it depends on is a parameter, the
eager op observer's rule) it is declared derived from the first one, with
"saved for backward" when the forward graph returns it for backward.
Parameters are known by the Dynamo graph's input sources
("L['self']._modules['fc1']._parameters['weight']"), recorded when Dynamo
calls inductor's compile_fx. Inductor's FX graph and AOT autograd caches
skip GraphLowering, so allocscope turns them off by default
(TORCHINDUCTOR_FX_GRAPH_CACHE=0, TORCHINDUCTOR_AUTOGRAD_CACHE=0 unless the
program's environment sets them), saying so once.

A module compiled in place (module.compile()) runs its whole _call_impl,
the global module hooks included, as compiled code, where the hooks do
nothing: its hooks are called around the compiled call instead.

Nothing of the program changes: every wrapper calls the original first and
returns its result; any failure of its own leaves frames and tags as they
were."""

import bisect
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
import weakref

import allocscope as _allocscope

from ._params import WRAPPER_COMPONENTS

_CODECACHE = "torch._inductor.codecache"

# A buffer (or a memory-planning pool) bound to a new tensor: not an alias
# of another buffer ("buf5 = buf3; del buf3  # reuse") and not a view of one
# (reinterpret_tensor), which allocate nothing.
_ALLOCATING = re.compile(
    r"\s+((?:buf|pool)\d+)\s*=\s*(?!reinterpret_tensor\()(?!(?:buf|pool)\d+\s*(?:;|#|$))\S"
)
_TRACE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def user_frame(stack_trace):
    """(function, file, line) of the innermost frame of an FX node's
    stack_trace (the user's line that made the node), or None."""
    if not stack_trace:
        return None
    frames = _TRACE_FRAME.findall(stack_trace)
    if not frames:
        return None
    file, line, function = frames[-1]
    return function, file, int(line)


def aliases(source_lines, linemap):
    """(line, function, as_file, as_line) for every line of generated
    `source_lines` (line 1 first) that allocates a buffer, named after the
    node of the nearest `linemap` entry (line, stack_trace) at or before
    it; lines before the first entry, or whose entry has no stack, are left
    out."""
    marks = sorted((int(line), trace) for line, trace in linemap or () if trace)
    starts = [line for line, _ in marks]
    out = []
    for number, text in enumerate(source_lines, 1):
        match = _ALLOCATING.match(text)
        if not match:
            continue
        at = bisect.bisect_right(starts, number) - 1
        if at < 0:
            continue
        frame = user_frame(marks[at][1])
        if frame is None:
            continue
        function, file, line = frame
        out.append((number, "%s [compiled: %s]" % (function, match.group(1)), file, line))
    return out


_GETATTR = re.compile(r"getattr\(([^()]*?),\s*['\"]([^'\"]+)['\"]\)")
_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\]")
_SUBSCRIPT = re.compile(r"\.?_(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]|\[['\"]?([^'\"\]]+)['\"]?\]")


def relative_path(source):
    """The dotted path, from the compiled root, of a Dynamo source name or
    nn_module_stack path: "L['self'].layers[0]._modules['fc1']" ->
    "layers.0.fc1", "L['self']" -> "", "getattr(L['self'].blocks, '3').mlp" ->
    "blocks.3.mlp". None when it does not start at a local of the frame."""
    text = source
    while True:
        m = _GETATTR.search(text)
        if not m:
            break
        text = text[: m.start()] + m.group(1) + "." + m.group(2) + text[m.end():]
    m = _ROOT.match(text)
    if not m:
        return None
    rest = _SUBSCRIPT.sub(lambda g: "." + (g.group(1) or g.group(2)), text[m.end():])
    return ".".join(c for c in rest.split(".") if c and c not in WRAPPER_COMPONENTS)


def node_module(node):
    """The relative path of the innermost module of an FX node (its
    nn_module_stack, or for a backward node the forward's), or None."""
    meta = getattr(node, "meta", None) or {}
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    try:
        last = list(stack.values())[-1]
    except Exception:
        return None
    path = last[0] if isinstance(last, tuple) else last
    return relative_path(path) if isinstance(path, str) else None


def _op_name(node):
    """"abs" for aten.abs.default, "convert_element_type" for prims'."""
    target = getattr(node, "target", None)
    parts = str(target).split(".")
    if len(parts) > 1 and parts[0] in ("aten", "prims", "torch"):
        return parts[1] if parts[0] != "torch" else parts[-1]
    return getattr(target, "__name__", None) or str(target)


def _is_tensor_node(node):
    val = (getattr(node, "meta", None) or {}).get("val")
    return val is not None and hasattr(val, "dtype") and hasattr(val, "shape")


class _Sources:
    """Per FX node, the graph inputs (placeholders) it is computed from."""

    def __init__(self):
        self.memo = {}

    def __call__(self, node):
        got = self.memo.get(node)
        if got is not None:
            return got
        # Iterative: graphs are deep.
        stack = [node]
        while stack:
            n = stack[-1]
            if n in self.memo:
                stack.pop()
                continue
            if n.op == "placeholder":
                self.memo[n] = frozenset((n,)) if _is_tensor_node(n) else frozenset()
                stack.pop()
                continue
            pending = [i for i in n.all_input_nodes if i not in self.memo]
            if pending:
                stack.extend(pending)
                continue
            out = frozenset()
            for i in n.all_input_nodes:
                out |= self.memo[i]
            self.memo[n] = out
            stack.pop()
        return self.memo[node]


def _chain(node):
    """The ops from a graph input to `node` along first inputs, and that
    input (None when the walk stops elsewhere)."""
    ops = []
    n = node
    while n is not None and n.op != "placeholder" and len(ops) < 64:
        ops.append(_op_name(n))
        inputs = n.all_input_nodes
        n = inputs[0] if inputs else None
    ops.reverse()
    if len(ops) > 6:
        ops = ops[:3] + ["\u2026"] + ops[-2:]
    return ops, (n if n is not None and n.op == "placeholder" else None)


def scopes(source_lines, name_to_buffer, graph, params, saved):
    """(line, module, param_module, param, how) for each allocating line of
    generated `source_lines` whose buffer's FX node is known: `params` maps
    placeholder nodes to (module, name) of a parameter, `saved` is the set
    of nodes the forward graph returns for backward."""
    sources = _Sources()
    order = {n: i for i, n in enumerate(graph.nodes) if n.op == "placeholder"}
    out = []
    for number, text in enumerate(source_lines, 1):
        match = _ALLOCATING.match(text)
        if not match:
            continue
        buffer = name_to_buffer.get(match.group(1))
        node = getattr(buffer, "origin_node", None) if buffer is not None else None
        if node is None and buffer is not None:
            try:
                node = getattr(buffer.get_defining_op(), "origin_node", None)
            except Exception:
                node = None
        if node is None or getattr(node, "graph", None) is not graph:
            continue
        module = node_module(node)
        param_module = param = how = None
        inputs = sources(node)
        if params and inputs and all(i in params for i in inputs):
            # The parameter the first inputs lead to (eager provenance names
            # the first input's), else the first in the graph's order.
            ops, first = _chain(node)
            if first not in params:
                first = min(inputs, key=lambda i: order.get(i, 0))
            param_module, param = params[first]
            how = " -> ".join([".".join(p for p in (param_module, param) if p)] + ops)
            how = "torch.compile'd graph: %s%s" % (how, "; saved for backward" if node in saved else "")
        if module is None and param is None:
            continue
        out.append((number, module or "", param_module, param, how))
    return out


def _name_frames(path, linemap):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for number, function, file, line in aliases(lines, linemap):
        _allocscope.python_frame_alias(path, number, function, file, line)


def _wrap(codecache):
    """Wraps codecache.PyCodeCache.load_by_key_path once."""
    cache = getattr(codecache, "PyCodeCache", None)
    original = getattr(cache, "load_by_key_path", None) if cache is not None else None
    if original is None or getattr(original, "_allocscope", False):
        return
    function = getattr(original, "__func__", None)  # a classmethod's function
    if function is None:
        return

    def load_by_key_path(cls, key, path, linemap=None, *args, **kwargs):
        module = function(cls, key, path, linemap, *args, **kwargs)
        if linemap:
            try:
                _name_frames(path, linemap)
            except Exception:  # never break the program's compile
                pass
        return module

    load_by_key_path._allocscope = True
    cache.load_by_key_path = classmethod(load_by_key_path)


# --- what Dynamo and inductor say, at compile time ---------------------------

_local = threading.local()  # .sources: per compile_fx call, innermost last


def param_sources(gm, example_inputs):
    """Per placeholder of a Dynamo graph: (module, name) of the parameter it
    is, from its source ("L['self']._modules['fc1']._parameters['weight']" ->
    ("fc1", "weight")), or None. A parameter the frame was given as a local
    (an argument of an autograd.Function's forward compiled as a frame of
    its own, "L['weight']") is (None, "#<placeholder index>"): whose it is,
    and its name, are known only from the tensor each call is given
    (_enter_frame_module)."""
    import torch

    out = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = list(example_inputs) if example_inputs is not None else []
    for i, node in enumerate(placeholders):
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None) if arg is not None else None
        name = getattr(source, "name", None)
        if callable(name):
            name = name()
        example = examples[i] if i < len(examples) else None
        is_param = isinstance(example, torch.nn.Parameter) or (
            isinstance(name, str) and "_parameters[" in name
        )
        path = relative_path(name) if is_param and isinstance(name, str) else None
        if path:
            module, _, pname = path.rpartition(".")
            out.append((module, pname))
        elif isinstance(example, torch.nn.Parameter):
            out.append((None, "#%d" % i))
        else:
            out.append(None)
    return out


def _wrap_compile_fx(module):
    original = getattr(module, "compile_fx", None)
    if original is None or getattr(original, "_allocscope", False):
        return

    def compile_fx(model_, example_inputs_, *args, **kwargs):
        stack = _local.__dict__.setdefault("sources", [])
        try:
            sources = param_sources(model_, example_inputs_)
        except Exception:
            sources = None
        if (not sources or not any(sources)) and stack:
            sources = stack[-1]  # inductor calling itself on a rewritten graph
        stack.append(sources)
        try:
            return original(model_, example_inputs_, *args, **kwargs)
        finally:
            stack.pop()

    compile_fx._allocscope = True
    module.compile_fx = compile_fx


def _saved_for_backward(lowering):
    """The nodes a training forward graph returns for backward."""
    if getattr(lowering, "is_backward", False) or getattr(lowering, "is_inference", False):
        return set()
    try:
        import torch

        meta = torch._guards.TracingContext.try_get().fw_metadata
        saved = meta.tensors_saved_for_backwards_slice
        output = next(n for n in reversed(lowering.graph.nodes) if n.op == "output")
        values = output.args[0]
        return {v for v in list(values)[saved] if hasattr(v, "op")}
    except Exception:
        return set()


def _scope_graph(lowering, module):
    path = getattr(module, "__file__", None)
    if not path:
        return
    with open(path) as f:
        lines = f.read().splitlines()
    graph = lowering.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    params = {}  # placeholder -> (module path, name) of a parameter, forward graphs
    if not getattr(lowering, "is_backward", False):
        stack = getattr(_local, "sources", None)
        sources = stack[-1] if stack else None
        if sources and len(sources) == len(placeholders):
            params = {n: s for n, s in zip(placeholders, sources) if s}
    saved = _saved_for_backward(lowering)
    registered = 0
    # Lines derived from a parameter known only at call time wait for the
    # first call that names it (_enter_frame_module).
    at_call = []
    # Without provenance buffers are only tagged; the parameters still say
    # which module a call ran as (_enter_frame_module).
    for scope in scopes(lines, lowering.name_to_buffer, graph, params if _derive else {}, saved):
        number, module_path, param_module, param, how = scope
        if param is not None and param_module is None:  # known at call time
            at_call.append(scope)
            continue
        _allocscope.python_frame_scope(path, number, module_path, param_module, param, how)
        registered += 1
    inputs = [(i, params[n]) for i, n in enumerate(placeholders) if n in params]
    if inputs:
        _enter_frame_module(module, inputs, path, at_call)
    if _debug:
        from ._common import _say

        _say(
            "compiled " + path,
            "torch.compile: %s graph %s: %d allocating lines scoped, parameters %s"
            % (
                "backward" if getattr(lowering, "is_backward", False) else "forward",
                path,
                registered,
                ", ".join(".".join(c for c in s if c) for _, s in inputs) or "none",
            )
            + ("; %d more once a call names its parameters" % len(at_call) if at_call else ""),
        )


# --- the compiled frame's module, at call time ------------------------------
#
# Dynamo compiles a frame of a module's code, `forward` or `_call_impl`, and
# the module hooks inside a traced _call_impl do nothing, so a module whose
# own call was compiled (a linear inside a block, compiled apart after a
# graph break) runs without its tag: its buffers would be scoped to the
# enclosing block and its parameters looked for there. One generated file
# serves every module that passes the frame's guards (the 8 blocks of a
# model, or sibling linears of one shape), so which module ran is known only
# at call time: from the parameters the call is given. The generated
# module's `call` is wrapped so that it enters the tag of the module whose
# parameters these are (a second entry of a tag already entered changes
# nothing).

_owners = {}  # id(parameter) -> (weakref to it, weakref to its module, modules named)


def _remember_owner(parameter, module, named=0):
    """`module` (None: none, while `named` modules were named) holds it."""
    try:
        _owners[id(parameter)] = (
            weakref.ref(parameter),
            (weakref.ref(module) if module is not None else (lambda: None)),
            named,
        )
    except TypeError:  # no weak references to it: looked up again next time
        pass


def _owner(parameter, name, names):
    """The named module (of `names`, _naming's table) that holds `parameter`
    as its parameter `name` (None: under any name). A miss indexes every
    parameter the named modules hold now (one pass, not one per parameter: under FSDP2 a
    block's unsharded parameters are registered while it runs), and a
    tensor no named module holds is remembered as such until more modules
    are named."""
    got = _owners.get(id(parameter))
    if got is not None and got[0]() is parameter:
        m = got[1]()
        # A tensor held by none is looked for again once more modules are named.
        if m is not None or got[2] == len(names):
            return m
    for ref, _name, provisional, _b in list(names.values()):
        m = ref()
        if m is None or provisional:
            continue
        try:
            for p in m._parameters.values():
                if p is not None:
                    _remember_owner(p, m)
        except Exception:
            continue
    got = _owners.get(id(parameter))
    if got is not None and got[0]() is parameter:
        m = got[1]()
        if m is not None and (
            m._parameters.get(name) is parameter if name is not None
            else _name_in(m, parameter) is not None
        ):
            return m
    _remember_owner(parameter, None, len(names))
    return None


def _name_in(module, parameter):
    """The name under which `module` holds `parameter` itself, or None."""
    for n, p in module._parameters.items():
        if p is parameter:
            return n
    return None


def frame_module(args, inputs, names):
    """The module the compiled frame ran as: `inputs` are (index, (module
    path from the frame's self, name)) of the graph's parameter inputs and
    `names` _naming's table (id(module) -> (weakref, name, provisional,
    bytes)); the first input whose owner is named and whose path leads back
    up to a named module gives it; a parameter known only at call time
    (module path None) gives the module that holds it. None when none does,
    or when the frame's self is the model's root (whose tag its hooks
    entered)."""
    for index, (module_path, name) in inputs:
        if index >= len(args):
            continue
        if module_path is None:
            owner = _owner(args[index], None, names)
            if owner is None:
                continue
            entry = names.get(id(owner))
            if entry is None or not entry[1]:
                return None  # the model's root: its tag is entered
            return owner
        owner = _owner(args[index], name, names)
        if owner is None:
            continue
        m = owner
        if module_path:
            # Up from the owner to the frame's self: the owner's name ends
            # with module_path.
            entry = names.get(id(owner))
            if entry is None:
                continue
            full = entry[1]
            if full == module_path:
                return None  # the frame's self is the model's root: its tag is entered
            if not full.endswith("." + module_path):
                continue
            root_name = full[: -len(module_path) - 1]
            m = None
            for ref, n, provisional, _b in list(names.values()):
                if n == root_name and not provisional:
                    m = ref()
                    break
            if m is None:
                continue
        return m
    return None


def declare_at_call(path, at_call, args, module):
    """Registers the generated lines of `path` that `at_call` lists
    (scopes() entries derived from a parameter known only at call time,
    "#<input index>") as derived from the parameters of `module` that `args`
    holds at those indexes, each by the name `module` holds it under.
    Returns whether it did: not where `module` holds one of them not."""
    named = {}
    for _number, _module_path, _param_module, param, _how in at_call:
        index = int(param[1:])
        if param not in named:
            name = _name_in(module, args[index]) if index < len(args) else None
            if name is None:
                return False
            named[param] = name
    for number, module_path, _param_module, param, how in at_call:
        name = named[param]
        # Relative to the module's tag, which the call enters.
        _allocscope.python_frame_scope(path, number, module_path, "", name,
                                       how.replace(param, name, 1) if how else how)
    return True


def _enter_frame_module(module, inputs, path=None, at_call=()):
    from . import _hooks
    from ._common import _FORWARD
    from ._naming import _names

    call = getattr(module, "call", None)
    if call is None or getattr(call, "_allocscope", False):
        return
    # Per distinct first parameter, the module found for it (its key and
    # name bytes); one not found is looked for again next call (_owner
    # keeps that cheap until more modules are named).
    keys = {}
    # The lines derived from parameters known only at call time are
    # declared once, by the first call whose module holds them all: a line
    # is registered once, before it runs (the names are the module's own,
    # the same for every module the generated file serves).
    pending = [list(at_call)] if at_call and path else [None]

    def wrapped(args):
        ops = _hooks._ops
        key = entry = None
        if ops is not None and args:
            try:
                first = args[inputs[0][0]]
                got = keys.get(id(first))
                if got is None or got[0]() is not first:
                    m = frame_module(args, inputs, _names)
                    if m is not None and pending[0] and declare_at_call(path, pending[0], args, m):
                        pending[0] = None
                    named = _names.get(id(m)) if m is not None else None
                    # Not the model's root (named ""): its hooks entered its tag.
                    tag = (id(m) + 1, named[3]) if named is not None and named[1] else None
                    got = (weakref.ref(first), tag)
                    if tag is not None:
                        keys[id(first)] = got
                if got[1] is not None:
                    key, entry = got[1]
                    # id + 1 is odd: no module's own key.
                    ops.enter(key, _FORWARD, _hooks._generation, entry, _hooks._forward_phase(ops))
            except Exception:
                key = None
        try:
            return call(args)
        finally:
            if key is not None:
                try:
                    ops.leave(key, _FORWARD, None)
                except Exception:
                    pass

    wrapped._allocscope = True
    module.call = wrapped


_CACHES = (
    ("TORCHINDUCTOR_FX_GRAPH_CACHE", "torch._inductor.config", "fx_graph_cache"),
    ("TORCHINDUCTOR_AUTOGRAD_CACHE", "torch._functorch.config", "enable_autograd_cache"),
)


def _caches_off():
    """Inductor's FX graph cache and the AOT autograd cache skip
    GraphLowering: off, unless the program's environment sets them."""
    off = []
    for var, module_name, attr in _CACHES:
        if var in os.environ:
            continue
        config = sys.modules.get(module_name)
        if config is None:
            try:
                config = importlib.import_module(module_name)
            except Exception:
                continue
        if getattr(config, attr, False):
            setattr(config, attr, False)
            off.append(var)
    if off:
        from ._common import _say

        _say(
            "compiled caches",
            "torch.compile: inductor's caches are off (%s) so that compiled buffers are "
            "attributed to their modules and parameters; set them to 1 to keep the caches"
            % ", ".join(v + "=0" for v in off),
        )


def _wrap_graph(module):
    cls = getattr(module, "GraphLowering", None)
    original = getattr(cls, "compile_to_module", None) if cls is not None else None
    if original is None or getattr(original, "_allocscope", False):
        return
    _caches_off()

    def compile_to_module(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        try:
            _scope_graph(self, compiled)
        except Exception:  # never break the program's compile
            pass
        return compiled

    compile_to_module._allocscope = True
    cls.compile_to_module = compile_to_module


# --- modules compiled in place ---------------------------------------------


def _wrap_compiled_call(module):
    """The module hooks around a module.compile()'d module's compiled call."""
    from . import _hooks

    inner = module.__dict__.get("_compiled_call_impl")
    if inner is None or getattr(inner, "_allocscope", False):
        return
    ref = weakref.ref(module)

    def call(*args, **kwargs):
        m = ref()
        if m is None or _hooks._is_compiling():
            return inner(*args, **kwargs)
        key = id(m)
        _hooks._forward_pre(m, args)
        _hooks._outside.add(key)
        try:
            out = inner(*args, **kwargs)
        except BaseException:
            _hooks._outside.discard(key)
            _hooks._forward_post(m, args, None)
            raise
        _hooks._outside.discard(key)
        _hooks._forward_post(m, args, out)
        return out

    call._allocscope = True
    module._compiled_call_impl = call


def _wrap_module_compile():
    import torch

    original = getattr(torch.nn.Module, "compile", None)
    if original is None or getattr(original, "_allocscope", False):
        return

    def compile(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            _wrap_compiled_call(self)
        except Exception:
            pass
        return result

    compile._allocscope = True
    compile.__doc__ = original.__doc__
    torch.nn.Module.compile = compile


class _Finder(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after module `name` is imported (once)."""

    def __init__(self, name, then):
        self.name = name
        self.then = then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # the import machinery says it again, without this finder
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        then = self.then

        def exec_and_wrap(module):
            exec_module(module)
            try:
                then(module)
            except Exception:
                pass

        spec.loader.exec_module = exec_and_wrap
        return spec


_installed = False
_derive = True  # declare what compiled buffers derive from (provenance on)
_debug = os.environ.get("ALLOCSCOPE_LOG") == "debug"  # one line per compiled graph


def _when_imported(name, then):
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _Finder(name, then))


def install(scope=True, derive=True):
    """From now on: generated frames named by the user's lines; with `scope`,
    compiled buffers tagged with their modules (and with `derive` declared
    derived from the parameters they are computed from), and in-place
    compiled modules tagged. At once for what is imported, else when it
    will be."""
    global _installed, _derive
    if _installed:
        return
    _installed = True
    _derive = derive
    _when_imported(_CODECACHE, _wrap)
    if scope:
        _when_imported("torch._inductor.compile_fx", _wrap_compile_fx)
        _when_imported("torch._inductor.graph", _wrap_graph)
        _wrap_module_compile()
