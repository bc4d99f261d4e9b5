"""allocscope for PyTorch: module, backward and optimizer hooks that tag every
allocation with the module running it, parameter registration for the
detectors, and the caching-allocator bridge.

    import allocscope.torch
    allocscope.torch.enable(model, optimizer)     # both optional

`allocscope run` calls enable() with no arguments as soon as a traced Python
process imports torch (tools/python/sitecustomize.py), so a training script
needs no change.

Tags (layer, phase), all per thread:

* forward: a global forward pre-hook enters (layer = the module's qualified
  name, "forward"); a global forward hook registered with always_call=True
  leaves it, also when forward raises (torch < 2.0 has no always_call: a
  forward that raises there leaves its entry on the thread's stack until
  an enclosing module's leave pops it).
* backward: when a module call's forward ends (with grad enabled), tensor
  hooks go on its outputs and inputs that require grad. The outputs' hooks
  enter (layer, "backward") when the first gradient of an output is ready,
  on the thread autograd runs the backward on; the inputs' hooks leave it
  when the gradient of an input is. A module none of whose inputs requires
  grad (the root, the first layer) gets no leave: its tag stays until the
  backward of a module outside it begins or the backward pass ends (an
  autograd final callback, when it runs on the same thread), so the first
  layer's backward is tagged like the others and the root's ("") encloses
  the whole backward pass. When a module and the module it returns the
  output of share an output tensor, the inner one's hook fires first; the
  outer one's enter puts the inner one back on top of it. Tensor hooks wrap
  nothing in autograd functions (global full backward hooks put two
  BackwardHookFunctions around every module call and refuse modules that
  modify their input in place) and fire before the hooks registered after
  them on the same tensor, such as FSDP2's pre-backward hooks.
* recomputation: a module forward that runs inside a backward pass
  (activation checkpointing recomputing it, reentrant or not) enters
  (layer, "backward/recompute") instead: its memory is the backward's, at
  the time it is used. Inside a backward means torch's graph task id on
  the calling thread (torch._C._current_graph_task_id, torch 2.x), or,
  where torch has none, a backward entry on the thread's tag stack or the
  autograd engine answering torch._C._will_engine_execute_node, which it
  does only on a thread that runs a backward pass (torch 1.13).
* optimizer: global optimizer step pre-/post-hooks enter and leave
  (enclosing layer, "optimizer"); torch < 2.0 has none, so there each
  Optimizer subclass's step() is wrapped instead (_StepWrappers). After
  each step of the first optimizer that steps (or the one passed to enable)
  the process-wide step is incremented (allocscope_step).

Layer names. Modules of a known model are named by its named_modules(): the
model passed to enable(), else every *root* found lazily: the top-most module
called on a thread whose tag stack is empty. The first root is the PyTorch
root "" and its children are "layers.0", "layers.0.fc1", ...; a later, different
root is named after its class ("Critic", "Critic.layers.0", ...). A module of
no known model (called inside another module before any root saw it) is named
lazily "<enclosing layer>.<ClassName>". When a root's first forward begins,
every parameter of it is registered: numel from the (global) shape, sharded
numel from DTensor.to_local() for FSDP2 parameters, the dtype as "bf16",
"fp32", "fp8_e4m3", .... The components wrappers insert are left out, as
torch's state dicts leave them out: "_orig_mod" (torch.compile's
OptimizedModule), "_checkpoint_wrapped_module" (checkpoint_wrapper) and
"_fsdp_wrapped_module" (FSDP1); a wrapper and the module it wraps share
a name.

torch.compile. Hooks do nothing while Dynamo traces (they would put
graph breaks in the compiled code): a module called inside a compiled region
gets no tag of its own, and its allocations go to the nearest module called
outside one. A block compiled as torch.compile(block) (an OptimizedModule)
is itself called outside, so its allocations and its backward keep the
block's tag; with model.compile() or torch.compile(model) only the modules
outside the compiled code tag.

Pairing. Tags are the interposer's keyed tags (allocscope_enter and friends
in include/allocscope/allocscope.h), keyed by the module's (or optimizer's)
id: a leave pops down to its own enter (entries above it whose leave never
came go with it) and a leave without an enter does nothing, so an exception
never leaves the stack unbalanced. A backward enter is
allocscope_enter_nested: backward entries of an earlier forward pass
(generation) go, and so do those of modules that do not enclose it.
Optimizer entries of a step() that raised go at the next step().

Environment: ALLOCSCOPE_PYTHON_BACKWARD=0 leaves out the backward hooks.
ALLOCSCOPE_PYTHON_MODULES=0 leaves out the module hooks altogether (no layer
tags, no parameters registered; steps and per-tensor blocks stay).
ALLOCSCOPE_TORCH_BLOCKS=0 does not attach the bridge to the caching
allocator (segments only, and no Python lines for them). The two exist to
measure what each part costs (tests/bench/torch_overhead.py --breakdown).
ALLOCSCOPE_TORCH_BRIDGE: the bridge library's path. ALLOCSCOPE_BRIDGE_HOOKS=0:
tag through ctypes and Python tensor hooks even where the bridge is built.
ALLOCSCOPE_LOG=debug: which of the two tags, and each Python hook's calls and
average time, one line each at exit.

Provenance (ALLOCSCOPE_PROVENANCE=1, `allocscope run --provenance`; off by
default): enable() installs the bridge's ATen op observer
(tools/torch_bridge/provenance.cpp) and every registered parameter is
passed to it with its full shape; the observer declares each allocation
computed from one parameter alone (allocscope_derived), with the chain of
ops that made it. It needs the bridge (or, on CPU builds of torch, the tag
hooks library) and the module hooks; without them it says so in one line
and the run goes on without it.

Where the bridge (tools/torch_bridge) is built, the hooks' tag calls are
its builtins, not ctypes, and the backward wiring of _forward_post is C++:
tensor hooks that call the interposer on autograd's threads without the GIL,
by the same rules (tag_hooks.cpp). The bridge also attaches to the native
caching allocator's trace tracker once CUDA is initialized and reports every
tensor block to the interposer. With
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync it is not needed: every
tensor is a cudaMallocAsync call the interposer sees.
"""

import ctypes
import functools
import os
import sys
import threading
import types
import warnings
import weakref

import torch

import allocscope as _allocscope

__all__ = ["enable", "disable", "attach_bridge", "layer_name"]

_lock = threading.RLock()

_enabled = False
_handles = []
_backward_hooks = False

# id(module) -> (weakref to the module, name, provisional, name as UTF-8 bytes)
_names = {}
# id(root) -> [weakref, prefix, params registered]
_roots = {}
_root_prefixes = set()
_generation = 0

_primary_optimizer = None  # weakref
_steps = 0

_bridge_state = None  # None: not tried; True: attached or not needed; False: failed
_provenance_param = None  # the bridge's allocscope_torch_provenance_param once installed
_said = set()


def _say(key, text):
    """One line on stderr, once per key."""
    if key in _said:
        return
    _said.add(key)
    rank = _allocscope.rank()
    prefix = "allocscope" if rank is None else "allocscope[rank %d]" % rank
    try:
        sys.stderr.write("%s: %s\n" % (prefix, text))
        sys.stderr.flush()
    except Exception:
        pass


def _compiling():
    """is_compiling for torch without torch.compiler (before 2.1): 2.0's
    dynamo once something loaded it; nothing compiles before 2.0. Never
    raises: an exception per module call would cost microseconds."""
    dynamo = sys.modules.get("torch._dynamo")
    is_compiling = getattr(dynamo, "is_compiling", None)
    try:
        return bool(is_compiling()) if is_compiling is not None else False
    except Exception:
        return False


# Bound once: the module hooks run for every module call.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _compiling
_grad_enabled = torch.is_grad_enabled
_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)  # torch 2.x: -1 outside backward


def _engine_probe():
    """torch < 2.0: a function telling whether the calling thread runs a
    backward pass, or None. torch._C._will_engine_execute_node(node) raises
    RuntimeError outside one (about 0.4 us) and answers inside one."""
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if _graph_task_id is not None or will_execute is None:
        return None
    try:
        with torch.enable_grad():
            node = (torch.zeros(1, requires_grad=True) * 1).grad_fn
    except Exception:  # inference mode at import
        return None

    def running():
        try:
            will_execute(node)
            return True
        except RuntimeError:
            return False

    return running


_in_engine = _engine_probe()


_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float64: "fp64",
}
for _attr, _text in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
    if hasattr(torch, _attr):
        _DTYPES[getattr(torch, _attr)] = _text


def _dtype_name(dtype):
    return _DTYPES.get(dtype) or str(dtype).replace("torch.", "")


def _dtensor_type():
    for module in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            mod = __import__(module, fromlist=["DTensor"])
            return getattr(mod, "DTensor")
        except Exception:
            continue
    return None


# ---------------------------------------------------------------- names


# Components that wrappers insert into qualified names (torch's state dicts
# leave them out too): torch.compile's OptimizedModule, checkpoint_wrapper,
# FSDP1.
_WRAPPER_COMPONENTS = frozenset(("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"))


def _join(prefix, name):
    """prefix.name without wrapper components (naming time only)."""
    name = ".".join(c for c in name.split(".") if c not in _WRAPPER_COMPONENTS)
    if not prefix:
        return name
    if not name:
        return prefix
    return prefix + "." + name


def layer_name(module):
    """The layer name allocscope gives `module`, or None when it has none yet."""
    entry = _names.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    return None


def _set_name(module, name, provisional):
    key = id(module)
    try:
        ref = weakref.ref(module, lambda _r, key=key: _forget(key, _r))
    except TypeError:
        return
    _names[key] = (ref, name, provisional, name.encode("utf-8", "replace"))


def _forget(key, ref):
    entry = _names.get(key)
    if entry is not None and entry[0] is ref:
        _names.pop(key, None)
    root = _roots.get(key)
    if root is not None and root[0] is ref:
        _roots.pop(key, None)


def _add_root(module, prefix=None):
    """Names `module` and its sub-modules; returns the root's entry."""
    with _lock:
        entry = _roots.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry
        if prefix is None:
            if not _root_prefixes:
                prefix = ""
            else:
                base = type(module).__name__
                prefix, n = base, 2
                while prefix in _root_prefixes:
                    prefix = "%s#%d" % (base, n)
                    n += 1
        _root_prefixes.add(prefix)
        for name, sub in module.named_modules():
            existing = _names.get(id(sub))
            if existing is not None and existing[0]() is sub and not existing[2] and sub is not module:
                continue  # already named by another known model
            _set_name(sub, _join(prefix, name), False)
        entry = [weakref.ref(module), prefix, False]
        _roots[id(module)] = entry
        return entry


def _register_params(root, prefix):
    dtensor = _dtensor_type()
    seen = set()
    for name, sub in root.named_modules():
        layer = _join(prefix, name)
        for pname, p in sub.named_parameters(recurse=False):
            key = (id(sub), pname)
            if key in seen or p is None:
                continue
            seen.add(key)
            try:
                numel = int(p.numel())
                sharded = numel
                if dtensor is not None and isinstance(p, dtensor):
                    sharded = int(p.to_local().numel())
                _allocscope.register_param(layer, pname, numel, _dtype_name(p.dtype), sharded)
                if _provenance_param is not None:
                    shape = [int(d) for d in p.shape]  # a DTensor's: the global shape
                    _provenance_param(
                        layer.encode("utf-8", "replace"),
                        pname.encode("utf-8", "replace"),
                        (ctypes.c_int64 * max(len(shape), 1))(*shape),
                        len(shape),
                    )
            except Exception as e:  # never break the training step
                _say("param", "cannot register parameter %s.%s: %s" % (layer, pname, e))


# ---------------------------------------------------------------- tags

# Kinds of the interposer's keyed tags (allocscope_enter in allocscope.h):
# a leave pops down to its own entry, whatever is above it.
_FORWARD = 1
_BACKWARD = 2
_OPTIMIZER = 3
_ANY_GENERATION = (1 << 64) - 1


_ops = None  # the tag calls (set by enable): the bridge's builtins, else _CtypesOps


class _CtypesOps:
    """The tag calls through ctypes, and the forward hook's backward wiring
    in Python: used where the bridge is not built, or with
    ALLOCSCOPE_BRIDGE_HOOKS=0. The bridge's builtins (tools/torch_bridge/
    tag_hooks.cpp) take the same arguments."""

    def __init__(self, api):
        self.enter = api.enter
        self.enter_nested = api.enter_nested
        self.leave = api.leave
        self.leave_kind = api.leave_kind
        self.keyed_depth = api.keyed_depth
        self.keyed_kind_depth = api.keyed_kind_depth
        self.forward_post = _python_forward_post


def _make_ops(api):
    if os.environ.get("ALLOCSCOPE_BRIDGE_HOOKS", "1") != "0":
        path = _bridge_path()
        if path is not None:
            try:
                make = ctypes.PyDLL(os.path.abspath(path)).allocscope_torch_bridge_ops
                make.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
                make.restype = ctypes.py_object
                ops = make(_FORWARD, _BACKWARD)
                if ops:
                    return types.SimpleNamespace(**ops), "the PyTorch bridge"
            except Exception as e:  # an older bridge, a torch it was not built for
                _say(
                    "bridge hooks",
                    "the PyTorch bridge's tag hooks cannot be used (%s): tagging through ctypes" % e,
                )
    return _CtypesOps(api), "ctypes"


def _current_layer(api):
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = api.current_layer(buf, size)
        if n < size:
            return buf.value.decode("utf-8", "replace")
        size = n + 1


# ---------------------------------------------------------------- hooks


def _settle(ops, module, key):
    """The names entry of `module` for a call that is not the plain case
    (a root, or a module without a final name): a call on a thread in no
    module starts a forward pass; names and parameters are made here."""
    global _generation
    outermost = ops.keyed_depth() == 0
    if outermost:
        _generation += 1
        if _bridge_state is None:
            _maybe_attach_bridge()
    entry = _names.get(key)
    if entry is not None and entry[0]() is not module:
        entry = None
    if entry is None or (entry[2] and outermost):
        if outermost:
            _add_root(module)
        else:
            api = _allocscope._get()
            enclosing = _current_layer(api) if api is not None else ""
            _set_name(module, _join(enclosing, type(module).__name__), True)
        entry = _names.get(key)
    root = _roots.get(key)
    if root is not None and not root[2] and root[0]() is module:
        root[2] = True
        _register_params(module, root[1])
    return entry


def _forward_pre(module, args):
    if _is_compiling():
        return None
    ops = _ops
    if ops is None:
        return None
    try:
        key = id(module)
        entry = _names.get(key)
        # A named module's entry goes when the module does (_forget), so
        # `key` cannot be another module's.
        if entry is None or entry[2] or key in _roots:
            entry = _settle(ops, module, key)
            if entry is None:
                return None
        ops.enter(key, _FORWARD, _generation, entry[3], _forward_phase(ops))
    except Exception as e:
        _say("forward", "forward hook failed (tags may be missing): %s" % e)
    return None


def _forward_phase(ops):
    """b"forward", or b"backward/recompute" for a forward run inside a
    backward pass (activation checkpointing)."""
    if _graph_task_id is not None:
        inside = _graph_task_id() >= 0
    else:
        # A reentrant checkpoint of the outermost module recomputes before
        # any module backward has entered: only the engine knows then.
        inside = ops.keyed_kind_depth(_BACKWARD) > 0 or (_in_engine is not None and _in_engine())
    return b"backward/recompute" if inside else b"forward"


def _forward_post(module, args, output):
    if _is_compiling():
        return None
    ops = _ops
    if ops is None:
        return None
    try:
        ops.forward_post(id(module), args, output, _backward_hooks)
    except Exception as e:
        _say("backward", "backward hooks failed (tags may be missing): %s" % e)
    return None


def _python_forward_post(key, args, output, backward):
    """Leaves (key, forward); then, when the module's backward is to be
    tagged, puts the tensor hooks on (tag_hooks.cpp does the same in C++)."""
    generation = _ops.leave(key, _FORWARD, None)
    if generation >= 0 and backward and _grad_enabled():
        entry = _names.get(key)
        if entry is not None:
            _hook_backward(key, entry[3], generation, args, output)


# Backward. A module's backward begins when the gradient of one of its
# outputs is ready and ends when the gradients of its inputs are: tensor
# hooks on the outputs enter (layer, "backward"), tensor hooks on the inputs
# leave it. Tensor hooks fire on the thread autograd runs the producing node
# on, before that node and before the hooks registered after them (FSDP2's
# pre-backward hooks among them).


_MAX_NESTING = 4  # containers inside containers looked into (tag_hooks.cpp: the same)


def _grad_tensors(value, depth=0):
    """The tensors in `value` that require grad: `value` itself, or those in
    it when it is a tuple, list or dict (values), or a dataclass instance
    (the fields in its __dict__; slots dataclasses are not looked into),
    down to _MAX_NESTING levels of nesting (a model output such as
    transformers' ModelOutput is a dict and a dataclass)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if depth >= _MAX_NESTING:
        return []
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        fields = getattr(type(value), "__dataclass_fields__", None)
        attrs = getattr(value, "__dict__", None) if fields is not None else None
        if not isinstance(attrs, dict):
            return []
        items = [attrs.get(name) for name in fields]
    out = []
    for item in items:
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                out.append(item)
        elif item is not None:
            out.extend(_grad_tensors(item, depth + 1))
    return out


def _hook_backward(key, encoded, generation, args, output):
    outputs = _grad_tensors(output)
    if not outputs:
        return
    inputs = _grad_tensors(args)
    enter = functools.partial(_backward_enter, key, encoded, generation)
    for t in outputs:
        if not any(t is i for i in inputs):  # an input passed through
            t.register_hook(enter)
    if inputs:
        leave = functools.partial(_backward_leave, key)
        for t in inputs:
            t.register_hook(leave)


def _backward_enter(key, encoded, generation, _grad):
    """A module's backward begins (allocscope_enter_nested): the entries of
    modules whose backward is over (not enclosing this one) go; modules
    inside it that were entered first through the same output tensor (their
    hooks were registered first) come back on top of it."""
    ops = _ops
    if ops is None:
        return None
    try:
        if ops.enter_nested(key, _BACKWARD, generation, encoded, b"backward") > 0:
            _queue_end_of_backward()
    except Exception as e:
        _say("backward", "backward hook failed (tags may be missing): %s" % e)
    return None


def _backward_leave(key, _grad):
    ops = _ops
    if ops is not None:
        ops.leave(key, _BACKWARD, None)
    return None


_end_queued = -1  # the generation whose backward has the callback queued


def _queue_end_of_backward():
    global _end_queued
    if _end_queued == _generation:
        return
    try:
        torch.autograd.Variable._execution_engine.queue_callback(_end_of_backward)
        _end_queued = _generation
    except Exception:
        pass


def _end_of_backward():
    """The backward pass is over: modules whose inputs need no grad (the
    root, the first layer) never got their leave."""
    global _end_queued
    _end_queued = -1
    ops = _ops
    if ops is not None:
        ops.leave_kind(_BACKWARD, _ANY_GENERATION)


def _optimizer_pre(optimizer, args, kwargs):
    ops = _ops
    if ops is None:
        return None
    try:
        ops.leave_kind(_OPTIMIZER, _ANY_GENERATION)  # a step() that raised
        ops.enter(id(optimizer), _OPTIMIZER, 0, None, b"optimizer")
    except Exception as e:
        _say("optimizer", "optimizer hook failed (tags may be missing): %s" % e)
    return None


def _optimizer_post(optimizer, args, kwargs):
    global _primary_optimizer, _steps
    try:
        ops = _ops
        if ops is not None:
            ops.leave(id(optimizer), _OPTIMIZER, None)
        with _lock:
            if _primary_optimizer is None or _primary_optimizer() is None:
                _primary_optimizer = weakref.ref(optimizer)
            primary = _primary_optimizer() is optimizer
            if primary:
                _steps += 1
                steps = _steps
        if primary:
            _allocscope.step(steps)
    except Exception as e:
        _say("optimizer", "optimizer hook failed (tags may be missing): %s" % e)
    return None


def _optimizer_step_hooks(pre, post):
    """Global optimizer step pre-/post-hooks: torch's own (2.0 and later),
    else _StepWrappers. Returns the handles."""
    from torch.optim import optimizer as optim_module

    if hasattr(optim_module, "register_optimizer_step_pre_hook"):
        return [
            optim_module.register_optimizer_step_pre_hook(pre),
            optim_module.register_optimizer_step_post_hook(post),
        ]
    return [_StepWrappers(pre, post)]


class _StepWrappers:
    """Global step hooks for torch < 2.0, which has none: the step() of
    every Optimizer subclass that defines one is wrapped, as torch's own
    profiler hook does (Optimizer._hook_for_profile) — the subclasses that
    exist now, and those of optimizers constructed later (Optimizer.__init__
    is wrapped to find them). pre(optimizer, args, kwargs) runs before the
    outermost step() of an optimizer on a thread (a subclass's step() that
    calls super().step() is one step), post after it returns. remove() puts
    back what can be put back; a wrapper that something else wrapped in turn
    stays, as a plain call."""

    def __init__(self, pre, post):
        self._pre = pre
        self._post = post
        self._on = True
        self._inside = threading.local()
        self._originals = {}  # class -> its own step() before wrapping
        base = torch.optim.Optimizer
        self._base_init = base.__dict__["__init__"]
        wrappers = self

        @functools.wraps(self._base_init)
        def init(optimizer, *args, **kwargs):
            wrappers._base_init(optimizer, *args, **kwargs)
            wrappers._wrap_class_of(optimizer)

        self._init = init
        base.__init__ = init
        pending = list(base.__subclasses__())
        while pending:
            cls = pending.pop()
            pending.extend(cls.__subclasses__())
            if "step" in cls.__dict__:
                self._wrap(cls)

    def _wrap_class_of(self, optimizer):
        if not self._on:
            return
        for cls in type(optimizer).__mro__:
            if cls is torch.optim.Optimizer:
                return
            if "step" in cls.__dict__:
                self._wrap(cls)

    def _wrap(self, cls):
        with _lock:
            if cls in self._originals:
                return
            original = cls.__dict__["step"]
            if not callable(original):  # a staticmethod, a descriptor: leave it
                return
            self._originals[cls] = original
            wrappers = self

            @functools.wraps(original)
            def step(optimizer, *args, **kwargs):
                inside = wrappers._inside.__dict__.setdefault("ids", set())
                if not wrappers._on or id(optimizer) in inside:
                    return original(optimizer, *args, **kwargs)
                inside.add(id(optimizer))
                try:
                    wrappers._pre(optimizer, args, kwargs)
                    out = original(optimizer, *args, **kwargs)
                    wrappers._post(optimizer, args, kwargs)
                    return out
                finally:
                    inside.discard(id(optimizer))

            step.allocscope_wrapped = True
            cls.step = step

    def remove(self):
        with _lock:
            self._on = False
            base = torch.optim.Optimizer
            if base.__dict__.get("__init__") is self._init:
                base.__init__ = self._base_init
            for cls, original in self._originals.items():
                if getattr(cls.__dict__.get("step"), "allocscope_wrapped", False):
                    cls.step = original
            self._originals.clear()


# ---------------------------------------------------------------- the bridge


def _bridge_candidates():
    path = os.environ.get("ALLOCSCOPE_TORCH_BRIDGE")
    if path:
        return [path]
    name = "liballocscope_torch_bridge.so"
    out = []
    lib = _allocscope.library_path()
    if lib:
        d = os.path.dirname(lib)
        out.append(os.path.join(d, "allocscope", name))  # installed: <libdir>/allocscope
        out.append(os.path.join(d, "..", "tools", "torch_bridge", name))  # build tree
    return out


def _bridge_path():
    return next((p for p in _bridge_candidates() if os.path.exists(p)), None)


def _allocator_backend():
    try:
        return torch.cuda.get_allocator_backend()
    except Exception:
        return None


def attach_bridge():
    """Attaches the caching-allocator bridge (CUDA must be initialized).
    True when attached or not needed; says in one line why not otherwise."""
    global _bridge_state
    if not _allocscope.available():
        return False
    with _lock:
        if _bridge_state is not None:
            return _bridge_state
        _bridge_state = _attach()
        return _bridge_state


def _attach():
    # Under cudaMallocAsync every tensor reaches the runtime API; the bridge
    # is still loaded there for the Python frames of those allocations
    # (allocscope_torch_bridge_attach registers them and answers 1).
    asynchronous = _allocator_backend() == "cudaMallocAsync"
    if os.environ.get("ALLOCSCOPE_TORCH_BLOCKS", "1") == "0":
        if not asynchronous:
            _say(
                "bridge",
                "the PyTorch bridge is not attached (ALLOCSCOPE_TORCH_BLOCKS=0): per-tensor "
                "blocks of the caching allocator are not recorded",
            )
        return True
    candidates = _bridge_candidates()
    path = _bridge_path()
    if path is None:
        if asynchronous:
            return True
        _say(
            "bridge",
            "the PyTorch bridge is not built (looked for %s): per-tensor blocks of the caching "
            "allocator are not recorded; set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "
            "to record every tensor" % (", ".join(candidates) or "ALLOCSCOPE_TORCH_BRIDGE"),
        )
        return False
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
        attach = lib.allocscope_torch_bridge_attach
        attach.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        attach.restype = ctypes.c_int
    except (OSError, AttributeError) as e:
        _say("bridge", "the PyTorch bridge %s cannot be loaded: %s" % (path, e))
        return asynchronous
    error = ctypes.create_string_buffer(512)
    rc = attach(error, len(error))
    if rc < 0:
        _say(
            "bridge",
            "the PyTorch bridge did not attach: %s" % error.value.decode("utf-8", "replace"),
        )
        return asynchronous
    return True


def _attach_when_cuda_ready():
    try:
        attach_bridge()
    except Exception as e:  # runs inside torch.cuda's lazy init: never raise
        _say("bridge", "the PyTorch bridge did not attach: %s" % e)


def _maybe_attach_bridge():
    try:
        if torch.cuda.is_initialized():
            attach_bridge()
    except Exception:
        pass


def _install_provenance():
    """The bridge's op observer (ALLOCSCOPE_PROVENANCE=1): installed once,
    never removed; says in one line why not when it cannot be."""
    global _provenance_param
    if _provenance_param is not None:
        return True
    if os.environ.get("ALLOCSCOPE_PYTHON_MODULES", "1") == "0":
        _say("provenance", "provenance is off: it needs the module hooks (ALLOCSCOPE_PYTHON_MODULES=0)")
        return False
    path = _bridge_path()
    if path is None:
        _say(
            "provenance",
            "provenance is off: the PyTorch bridge is not built (looked for %s)"
            % (", ".join(_bridge_candidates()) or "ALLOCSCOPE_TORCH_BRIDGE"),
        )
        return False
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
        install = lib.allocscope_torch_provenance_install
        install.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        install.restype = ctypes.c_int
        param = lib.allocscope_torch_provenance_param
        param.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
        param.restype = None
    except (OSError, AttributeError) as e:
        _say("provenance", "provenance is off: the PyTorch bridge %s has no op observer (%s)" % (path, e))
        return False
    error = ctypes.create_string_buffer(512)
    if install(_FORWARD, _BACKWARD, error, len(error)) < 0:
        _say("provenance", "provenance is off: %s" % error.value.decode("utf-8", "replace"))
        return False
    _provenance_param = param
    if os.environ.get("ALLOCSCOPE_LOG") == "debug":
        _say("provenance on", "provenance: the op observer of %s is installed" % path)
    return True


# ---------------------------------------------------------------- cost (ALLOCSCOPE_LOG=debug)

_hook_cost = {}  # hook name -> [calls, ns]


def _timed(hook):
    """`hook`, timing its calls; the totals are printed at exit."""
    import atexit
    import time

    counter = time.perf_counter_ns
    cost = _hook_cost.setdefault(hook.__name__, [0, 0])
    if len(_hook_cost) == 1:
        atexit.register(_print_hook_cost)

    def timed_hook(*args):
        start = counter()
        try:
            return hook(*args)
        finally:
            cost[0] += 1
            cost[1] += counter() - start

    timed_hook.__name__ = hook.__name__
    return timed_hook


def _print_hook_cost():
    for name, (calls, ns) in sorted(_hook_cost.items()):
        if not calls:
            continue
        _say(
            "cost " + name,
            "hook %s: %d calls, %d ns each on average (%d ms in all)"
            % (name.lstrip("_"), calls, ns // max(calls, 1), ns // 1000000),
        )


# ---------------------------------------------------------------- enable / disable


def _models(model):
    if model is None:
        return []
    if isinstance(model, torch.nn.Module):
        return [(None, model)]
    if isinstance(model, dict):
        return list(model.items())
    return [(None, m) for m in model]


def enable(model=None, optimizer=None):
    """Installs the hooks (once per process) and names `model`'s modules.

    model: a Module, a list of Modules (the first is the root "", the others
    are named after their class) or a dict {prefix: Module}; None: roots are
    found lazily. optimizer: the optimizer whose steps count as training
    steps (default: the first one that steps). Without liballocscope.so in
    the process this does nothing (one warning)."""
    global _enabled, _backward_hooks, _primary_optimizer, _backward_enter, _backward_leave, _ops
    if not _allocscope.available():
        _allocscope._get()  # the one warning
        return False
    with _lock:
        for prefix, m in _models(model):
            _add_root(m, prefix)
        if optimizer is not None:
            _primary_optimizer = weakref.ref(optimizer)
        if _enabled:
            return True
        _enabled = True
        from torch.nn.modules import module as nn_module

        debug = os.environ.get("ALLOCSCOPE_LOG") == "debug"
        if _ops is None:
            _ops, how = _make_ops(_allocscope._get())
            if debug:
                _say("ops", "tag calls through %s" % how)
        timed = _timed if debug else (lambda f: f)
        if os.environ.get("ALLOCSCOPE_PYTHON_MODULES", "1") != "0":
            # torch >= 2.5 warns at every torch.compile(module) call that global
            # hooks fire for the OptimizedModule too: these are allocscope's,
            # and the wrapper shares its module's name.
            warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
            _handles.append(nn_module.register_module_forward_pre_hook(timed(_forward_pre)))
            try:
                post = nn_module.register_module_forward_hook(
                    timed(_forward_post), always_call=True
                )
            except TypeError:  # torch < 2.0: no always_call (see the module's docstring)
                post = nn_module.register_module_forward_hook(timed(_forward_post))
            _handles.append(post)
        else:
            _say("modules", "module hooks left out (ALLOCSCOPE_PYTHON_MODULES=0): no layer tags")
        if os.environ.get("ALLOCSCOPE_PROVENANCE", "0") == "1":
            try:
                _install_provenance()
            except Exception as e:  # never break the program
                _say("provenance", "provenance is off: %s" % e)
        # Backward phases come from tensor hooks that _forward_post puts on
        # each module call's inputs and outputs.
        _backward_hooks = os.environ.get("ALLOCSCOPE_PYTHON_BACKWARD", "1") != "0"
        if timed is _timed:
            _backward_enter = _timed(_backward_enter)
            _backward_leave = _timed(_backward_leave)
        _handles.extend(_optimizer_step_hooks(timed(_optimizer_pre), timed(_optimizer_post)))
        try:
            if torch.cuda.is_initialized():
                attach_bridge()
            else:
                torch.cuda._lazy_call(_attach_when_cuda_ready)
        except Exception as e:
            _say("bridge", "the PyTorch bridge will not attach: %s" % e)
        return True


def disable():
    """Removes the hooks (the bridge stays attached: it cannot be detached)."""
    global _enabled, _backward_hooks
    with _lock:
        for h in _handles:
            try:
                h.remove()
            except Exception:
                pass
        del _handles[:]
        _enabled = False
        _backward_hooks = False
