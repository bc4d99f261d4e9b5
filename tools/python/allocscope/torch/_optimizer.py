"""allocscope.torch's optimizer hooks: global step pre-/post-hooks that tag
each step() (enclosing layer, "optimizer") and count the training steps of
the primary optimizer; _StepWrappers for torch < 2.0, which has none."""

import functools
import threading
import weakref

import torch

import allocscope as _allocscope

from . import _bridge, _hooks
from ._common import _ANY_GENERATION, _OPTIMIZER, _lock, _say

_primary_optimizer = None  # weakref (set by enable, else the first optimizer that steps)
_steps = 0


def _optimizer_pre(optimizer, args, kwargs):
    ops = _hooks._ops  # the tag calls
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
        ops = _hooks._ops
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
            _allocator_counters()
    except Exception as e:
        _say("optimizer", "optimizer hook failed (tags may be missing): %s" % e)
    return None


def _allocator_counters():
    """The caching allocator's counters at the step boundary, for the
    report's self-check: memory_allocated and memory_reserved of the current
    device, and the driver's count of the memory in use (mem_get_info)."""
    cuda = torch.cuda
    if not cuda.is_available() or not cuda.is_initialized():
        return
    device = cuda.current_device()
    counters = _bridge._counters
    if counters is not None and counters(device) == 0:
        return
    stats = cuda.memory_stats(device)
    free, total = cuda.mem_get_info(device)
    _allocscope.allocator_counters(
        device,
        stats.get("allocated_bytes.all.current", 0),
        stats.get("reserved_bytes.all.current", 0),
        total - free,
    )


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
