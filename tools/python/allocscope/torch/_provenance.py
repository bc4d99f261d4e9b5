"""allocscope.torch's provenance (ALLOCSCOPE_PROVENANCE=1): installing the
bridge's ATen op observer (tools/torch_bridge/provenance.cpp), which then
hears of every registered parameter."""

import ctypes
import os

from ._bridge import _bridge_candidates, _bridge_path
from ._common import _BACKWARD, _FORWARD, _say

_provenance_param = None  # the bridge's allocscope_torch_provenance_param once installed


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
        from . import _bridge

        if _bridge._refused is not None:
            _say("provenance", "provenance is off: %s" % _bridge._refused)
            return False
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
