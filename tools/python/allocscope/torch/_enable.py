"""allocscope.torch's enable() and disable(): installing and removing the
hooks, naming the models passed in, choosing the tag calls."""

import warnings
import weakref

import torch

import allocscope as _allocscope

from . import _compiled, _graphs, _hooks, _optimizer
from ._bridge import _attach_when_cuda_ready, attach_bridge
from ._common import _lock, _say
from ._cost import _timed
from ._naming import _add_root
from ._provenance import _install_provenance
from ._provenance import _off as _provenance_off
from ._tags import _make_ops

_enabled = False
_handles = []


def _models(model):
    """enable()'s `model` as a list of (prefix or None, Module)."""
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
    global _enabled
    if not _allocscope.available():
        _allocscope._get()  # the one warning
        return False
    with _lock:
        for prefix, m in _models(model):
            _add_root(m, prefix)
        if optimizer is not None:
            _optimizer._primary_optimizer = weakref.ref(optimizer)
        if _enabled:
            return True
        _enabled = True
        from torch.nn.modules import module as nn_module

        debug = _allocscope.config("ALLOCSCOPE_LOG") == "debug"
        if _hooks._ops is None:
            _hooks._ops, how = _make_ops(_allocscope._get())
            if debug:
                _say("ops", "tag calls through %s" % how)

        def timed(hook):
            return _timed(hook, _hooks._is_compiling) if debug else hook

        if _allocscope.config_on("ALLOCSCOPE_PYTHON_MODULES"):
            # torch >= 2.5 warns at every torch.compile(module) call that global
            # hooks fire for the OptimizedModule too: these are allocscope's,
            # and the wrapper shares its module's name.
            warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
            _handles.append(nn_module.register_module_forward_pre_hook(timed(_hooks._forward_pre)))
            try:
                post = nn_module.register_module_forward_hook(
                    timed(_hooks._forward_post), always_call=True
                )
            except TypeError:  # torch < 2.0: no always_call (see the package's docstring)
                post = nn_module.register_module_forward_hook(timed(_hooks._forward_post))
            _handles.append(post)
        else:
            _say("modules", "module hooks left out (ALLOCSCOPE_PYTHON_MODULES=0): no layer tags")
        try:
            _install_provenance()
        except Exception as e:  # never break the program
            _provenance_off(str(e))
        try:
            # CUDA graphs' pools, for the bridge's blocks in them.
            _graphs.install()
        except Exception as e:  # never break the program
            _say("graphs", "CUDA graph pools will read as ordinary blocks: %s" % e)
        try:
            # torch.compile: generated frames named by the user's lines, and
            # compiled buffers attributed to modules and parameters.
            _compiled.install(
                scope=_allocscope.config_on("ALLOCSCOPE_PYTHON_MODULES"),
                derive=_allocscope.config_on("ALLOCSCOPE_PROVENANCE"),
            )
        except Exception as e:  # never break the program
            _say("compiled", "frames of compiled code keep their generated names: %s" % e)
        # Backward phases come from tensor hooks that _forward_post puts on
        # each module call's inputs and outputs.
        _hooks._backward_hooks = _allocscope.config_on("ALLOCSCOPE_PYTHON_BACKWARD")
        _hooks._backward_enter = timed(_hooks._backward_enter)
        _hooks._backward_leave = timed(_hooks._backward_leave)
        _handles.extend(
            _optimizer._optimizer_step_hooks(timed(_optimizer._optimizer_pre), timed(_optimizer._optimizer_post))
        )
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
    global _enabled
    with _lock:
        for h in _handles:
            try:
                h.remove()
            except Exception:
                pass
        del _handles[:]
        _enabled = False
        _hooks._backward_hooks = False
