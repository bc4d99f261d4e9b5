"""allocscope.torch's caching-allocator bridge: finding the PyTorch bridge
library (tools/torch_bridge) and attaching it to the native caching
allocator once CUDA is initialized."""

import ctypes
import os

import torch

import allocscope as _allocscope

from ._common import _lock, _say
from ._oom import record_ooms

_bridge_state = None  # None: not tried; True: attached or not needed; False: failed
_sees_ooms = False  # the bridge is attached to the native allocator's trace
_tensors_visible = False  # each tensor is an allocation of its own (bridge.cpp)
# allocscope_torch_bridge_counters(device) once the bridge is loaded: the
# allocator's counters for the self-check without memory_stats' dict.
_counters = None
# Called after each attach_bridge: what depends on the bridge's outcome
# (provenance needs _tensors_visible) registers here, so that this module,
# which finds and attaches the bridge, imports none of it.
_after_attach = []


def _bridge_candidates():
    path = _allocscope.config("ALLOCSCOPE_TORCH_BRIDGE")
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


_refused = None  # why the bridge that exists is not used (built for another torch)


def _running_torch():
    """The running torch as the bridge records the one it was built for."""
    return "%s cxx11abi=%d" % (torch.__version__, int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)))


def _built_for(path):
    """The torch `path` was compiled against ("<version> cxx11abi=<0|1>"),
    or why it cannot say."""
    try:
        stamp = ctypes.CDLL(os.path.abspath(path)).allocscope_torch_bridge_built_for
        stamp.argtypes = []
        stamp.restype = ctypes.c_char_p
        return (stamp() or b"").decode("utf-8", "replace") or "(unknown)"
    except (OSError, AttributeError) as e:
        return "(unknown: %s)" % e


def _bridge_path():
    """The bridge library to use: found, and built for the running torch
    (its structs' layouts are that torch's). Otherwise None; a bridge built
    for another torch is refused once, in one line, and the run goes on as
    where none is built (backend:cudaMallocAsync when CUDA has not started
    and no backend is set)."""
    global _refused
    path = next((p for p in _bridge_candidates() if os.path.exists(p)), None)
    if path is None or _refused is not None:
        return None
    built, running = _built_for(path), _running_torch()
    if built == running:
        return path
    _refused = "the PyTorch bridge %s was built for torch %s, this is torch %s" % (
        path,
        built,
        running,
    )
    fallback = _fall_back_to_async()
    _say(
        "bridge",
        "%s: not loaded (no per-tensor blocks, bridge tag hooks or provenance%s; rebuild "
        "allocscope against this torch)"
        % (_refused, "; backend:cudaMallocAsync records every tensor" if fallback else ""),
    )
    return None


def _fall_back_to_async():
    """What `allocscope run` does where no bridge is built: every tensor a
    cudaMallocAsync call, when CUDA has not started and no backend is set."""
    try:
        if torch.cuda.is_initialized():
            return False
    except Exception:
        return False
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if "backend" in os.environ.get(var, ""):
            return False
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = (conf + "," if conf else "") + "backend:cudaMallocAsync"
    return True


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
    # The allocator's out-of-memory verdicts: from the bridge's trace
    # entries when it is attached, else from Python (_oom.py).
    try:
        record_ooms(_sees_ooms)
    except Exception as e:
        _say("oom", "out-of-memory errors are not recorded: %s" % e)
    for hook in _after_attach:
        hook()
    return _bridge_state


def _attach():
    # Under cudaMallocAsync every tensor reaches the runtime API; the bridge
    # is still loaded there for the Python frames of those allocations
    # (allocscope_torch_bridge_attach registers them and answers 1).
    asynchronous = _allocator_backend() == "cudaMallocAsync"
    # (Under cudaMallocAsync attaching records no blocks: it registers the
    # Python frames and tells provenance that tensors are allocations.)
    if not _allocscope.config_on("ALLOCSCOPE_TORCH_BLOCKS") and not asynchronous:
        _say(
            "bridge",
            "the PyTorch bridge is not attached (ALLOCSCOPE_TORCH_BLOCKS=0): per-tensor "
            "blocks of the caching allocator are not recorded",
        )
        return True
    candidates = _bridge_candidates()
    path = _bridge_path()
    if path is None:
        if asynchronous or _refused is not None:  # _refused: said already
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
    global _counters
    try:
        counters = lib.allocscope_torch_bridge_counters
        counters.argtypes = [ctypes.c_int]
        counters.restype = ctypes.c_int
        _counters = counters
    except AttributeError:
        pass  # an older bridge: _optimizer.py asks torch.cuda.memory_stats
    global _sees_ooms, _tensors_visible
    error = ctypes.create_string_buffer(512)
    rc = attach(error, len(error))
    _sees_ooms = rc in (0, 2)
    _tensors_visible = rc in (0, 1, 2)
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
