"""allocscope.torch's provenance (on by default; ALLOCSCOPE_PROVENANCE=0 or
`allocscope run --no-provenance` turn it off): installing the bridge's ATen
op observer (tools/torch_bridge/provenance.cpp), which then hears of every
registered parameter. Whether it runs, and why not, goes into the trace as
a mark (allocscope.h, ALLOCSCOPE_PROVENANCE_MARK) with the first parameters
registered, so that the run's summary can say what the weight detectors
could only match by size."""

import ctypes
import os

import allocscope as _allocscope

from . import _bridge
from ._bridge import _bridge_candidates, _bridge_path
from ._common import _BACKWARD, _FORWARD, _say

_provenance_param = None  # the bridge's allocscope_torch_provenance_param once installed
_status = None  # "on" or "off: <why>" once decided
_marked = None  # the status last marked in the trace
_registering = False  # parameters are being registered: the process trains

# The steps the op observer runs in (tools/torch_bridge/provenance.cpp,
# "Steps"): the first FIRST, then WINDOW in every EVERY.
DEFAULT_STEPS = (4, 100, 2)


def parse_steps(raw):
    """ALLOCSCOPE_PROVENANCE_STEPS's value as (first, every, window), first
    0 for every step; raises ValueError naming what is wrong. The grammar of
    core/config.cpp's parse_provenance_steps, which liballocscope.so applies
    to the variable; here it reads the text the library gives back."""
    text = raw.strip().lower()
    if text == "all":
        return (0, 0, 0)
    first, every, window = DEFAULT_STEPS
    seen = set()
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        key = key.strip()
        if not eq or key not in ("first", "every", "window") or key in seen:
            raise ValueError("%r is not a key=value of first, every or window, each once" % part.strip())
        seen.add(key)
        value = value.strip()
        if not value.isdigit() or len(value) > 12:
            raise ValueError("%s=%r is not a whole number" % (key, value))
        n = int(value)
        if key == "first":
            first = n
        elif key == "every":
            every = n
        else:
            window = n
    if first < 1:
        raise ValueError("first must be at least 1 (all observes every step)")
    if every > 0 and not 1 <= window <= every:
        raise ValueError("window must be from 1 to every (%d), got %d" % (every, window))
    return (first, every, window if every > 0 else 0)


def _steps():
    """The schedule from ALLOCSCOPE_PROVENANCE_STEPS as liballocscope.so
    parsed it (core/config.cpp, parse_provenance_steps: a bad value is named
    there in one line and the default kept)."""
    raw = _allocscope.config("ALLOCSCOPE_PROVENANCE_STEPS")
    try:
        return parse_steps(raw) if raw else DEFAULT_STEPS
    except ValueError:  # a library whose text this package does not read
        return DEFAULT_STEPS


def _off(why, say=True):
    """Provenance does not run: says why in one line (once) and keeps it for
    the trace's mark. Returns False."""
    global _status
    _status = "off: " + why
    if say:
        _say("provenance", "provenance is off: %s" % why)
    note_status()
    return False


def registering():
    """_naming registers parameters: from now on the status is marked."""
    global _registering
    _registering = True
    note_status()


def note_status():
    """Marks the provenance status in the trace once parameters are being
    registered (a process that registers none, such as a launcher, is
    not made to record), and again when it changed."""
    global _marked
    if _status is None or _status == _marked or not _registering:
        return
    _marked = _status
    try:
        _allocscope.mark("allocscope: provenance " + _status)
    except Exception:
        pass



def _install_provenance():
    """The bridge's op observer: installed once, never removed; says in one
    line why not when it cannot be."""
    global _provenance_param, _status
    if _provenance_param is not None:
        return True
    if not _allocscope.config_on("ALLOCSCOPE_PROVENANCE"):
        return _off("turned off (ALLOCSCOPE_PROVENANCE=0, or allocscope run --no-provenance)", say=False)
    if not _allocscope.config_on("ALLOCSCOPE_PYTHON_MODULES"):
        return _off("it needs the module hooks (ALLOCSCOPE_PYTHON_MODULES=0)")
    path = _bridge_path()
    if path is None:
        if _bridge._refused is not None:
            return _off(_bridge._refused)
        return _off(
            "the PyTorch bridge is not built (looked for %s)"
            % (", ".join(_bridge_candidates()) or "ALLOCSCOPE_TORCH_BRIDGE")
        )
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
        install = lib.allocscope_torch_provenance_install
        install.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        install.restype = ctypes.c_int
        param = lib.allocscope_torch_provenance_param
        param.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
        param.restype = None
        steps = lib.allocscope_torch_provenance_steps
        steps.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        steps.restype = None
    except (OSError, AttributeError) as e:
        return _off("the PyTorch bridge %s has no op observer (%s)" % (path, e))
    steps(*_steps())
    error = ctypes.create_string_buffer(512)
    if install(_FORWARD, _BACKWARD, error, len(error)) < 0:
        return _off(error.value.decode("utf-8", "replace"))
    _provenance_param = param
    _status = "on"
    note_status()
    if _allocscope.config("ALLOCSCOPE_LOG") == "debug":
        _say("provenance on", "provenance: the op observer of %s is installed" % path)
    return True


def _check_tensors_visible():
    """After the bridge is attached: a declaration names an allocation, so
    provenance is off where tensors are not allocations of their own."""
    if _provenance_param is not None and not _bridge._tensors_visible:
        _off(
            "the caching allocator's tensors are not visible as allocations "
            "(the bridge is not attached to it), and a declaration would name a whole segment"
        )


_bridge._after_attach.append(_check_tensors_visible)
