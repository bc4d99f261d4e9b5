"""allocscope.torch's tag calls: the interposer's keyed tags through the
PyTorch bridge's builtins (tools/torch_bridge/tag_hooks.cpp), else through
ctypes with the backward wiring in Python."""

import ctypes
import os
import types

import allocscope as _allocscope

from ._bridge import _bridge_path
from ._common import _BACKWARD, _FORWARD, _say
from ._hooks import _python_forward_post


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

    @staticmethod
    def forward_pre(_module, _generation, _names, _roots):
        return False  # the forward pre-hook enters in Python


def _make_ops(api):
    """The tag calls and how they are made: the bridge's builtins where it is
    built (unless ALLOCSCOPE_BRIDGE_HOOKS=0), else _CtypesOps over `api`."""
    if _allocscope.config_on("ALLOCSCOPE_BRIDGE_HOOKS"):
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
