"""allocscope.torch's out-of-memory recording: the parameter the failing
thread was processing (from the locals of the frames that raised
torch.OutOfMemoryError, whichever way the request itself was recorded),
and the request where the PyTorch bridge does not see the caching
allocator's OOM trace entries: the native allocator without the bridge
(PyTorch's OOM observer), and backend:cudaMallocAsync, which has no
observer (the moment torch.OutOfMemoryError is made)."""

import sys

import torch

import allocscope as _allocscope

from .._oom_context import processing_parameter
from .._oom_text import parse_message
from ._common import _lock, _say
from ._params import parameter_of

_installed = False
_record_request = False  # the error's __init__ records the request (no bridge, no observer)


def _observer(device, alloc, device_allocated, device_free):
    # Runs inside the allocator with the GIL: never raise.
    try:
        _allocscope.block_oom(int(alloc), int(device), None, int(device_free))
    except Exception:
        pass


def _on_error(args, frame):
    """What an OutOfMemoryError being made tells: its request (when nothing
    else recorded it) and the parameter its frames were processing."""
    if _record_request and args and isinstance(args[0], str):
        parsed = parse_message(args[0])
        if parsed is not None:
            requested, device, free = parsed
            _allocscope.block_oom(requested, max(device, 0), None, free)
    found = processing_parameter(frame, parameter_of)
    if found is not None:
        _allocscope.oom_parameter(*found)


def _patch_exception():
    cls = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if cls is None:
        return False
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        try:
            # PyTorch makes the error where the failing op returns to Python:
            # the caller of __init__ is the frame that called the op.
            _on_error(args, sys._getframe(1))
        except Exception:
            pass
        original(self, *args, **kwargs)

    try:
        cls.__init__ = __init__
    except (TypeError, AttributeError):
        return False
    return True


def record_ooms(bridge_sees_ooms):
    """Records the allocator's out-of-memory verdicts from Python unless the
    bridge already does (`bridge_sees_ooms`), and the parameter each one's
    thread was processing. Once per process."""
    global _installed, _record_request
    if not _allocscope.available():
        return
    with _lock:
        if _installed:
            return
        _installed = True
    observed = bridge_sees_ooms
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if not observed and attach is not None:
        try:
            attach(_observer)
            observed = True
        except Exception:
            pass  # cudaMallocAsync and pluggable allocators have no observer
    _record_request = not observed
    if not _patch_exception() and not observed:
        _say("oom", "out-of-memory errors are not recorded: torch.OutOfMemoryError cannot be hooked")
