"""allocscope.torch's module hooks: the global forward pre-/post-hooks that
tag each module call (forward, or backward/recompute inside a backward
pass) and the tensor hooks that tag each module's backward."""

import functools
import sys

import torch

import allocscope as _allocscope

from . import _bridge
from ._common import _ANY_GENERATION, _BACKWARD, _FORWARD, _say
from ._naming import _add_root, _current_layer, _join, _names, _register_params, _roots, _set_name

_ops = None  # the tag calls (set by enable): the bridge's builtins, else _tags._CtypesOps
_backward_hooks = False  # whether _forward_post wires the backward (set by enable, disable)
_generation = 0  # forward passes begun (outermost module calls)


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


def _settle(ops, module, key):
    """The names entry of `module` for a call that is not the plain case
    (a root, or a module without a final name): a call on a thread in no
    module starts a forward pass; names and parameters are made here."""
    global _generation
    outermost = ops.keyed_depth() == 0
    if outermost:
        _generation += 1
        if _bridge._bridge_state is None:
            _bridge._maybe_attach_bridge()
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


# Modules compiled in place whose hooks _compiled.py calls around the
# compiled call: the global hooks skip them inside it (Dynamo runs
# _call_impl eagerly when it falls back).
_outside = set()


def _forward_pre(module, args):
    if _is_compiling() or (_outside and id(module) in _outside):
        return None
    ops = _ops
    if ops is None:
        return None
    try:
        # The plain case (a named module, no root) enters in the bridge's
        # builtin; what it leaves is settled here.
        if ops.forward_pre(module, _generation, _names, _roots):
            return None
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
    if _is_compiling() or (_outside and id(module) in _outside):
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
