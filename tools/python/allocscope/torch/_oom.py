"""allocscope.torch's out-of-memory recording where the PyTorch bridge does
not see the caching allocator's OOM trace entries: the native allocator
without the bridge (PyTorch's OOM observer), and backend:cudaMallocAsync,
which has no observer (the moment torch.OutOfMemoryError is made)."""

import torch

import allocscope as _allocscope

from .._oom_text import parse_message
from ._common import _lock, _say

_installed = False


def _observer(device, alloc, device_allocated, device_free):
    # Runs inside the allocator with the GIL: never raise.
    try:
        _allocscope.block_oom(int(alloc), int(device), None, int(device_free))
    except Exception:
        pass


def _patch_exception():
    cls = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if cls is None:
        return False
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        try:
            if args and isinstance(args[0], str):
                parsed = parse_message(args[0])
                if parsed is not None:
                    requested, device, free = parsed
                    _allocscope.block_oom(requested, max(device, 0), None, free)
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
    bridge already does (`bridge_sees_ooms`). Once per process."""
    global _installed
    if bridge_sees_ooms or not _allocscope.available():
        return
    with _lock:
        if _installed:
            return
        _installed = True
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None:
        try:
            attach(_observer)
            return
        except Exception:
            pass  # cudaMallocAsync and pluggable allocators have no observer
    if not _patch_exception():
        _say("oom", "out-of-memory errors are not recorded: torch.OutOfMemoryError cannot be hooked")
