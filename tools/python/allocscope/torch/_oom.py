"""allocscope.torch's out-of-memory recording where the PyTorch bridge does
not see the caching allocator's OOM trace entries: the native allocator
without the bridge (PyTorch's OOM observer), and backend:cudaMallocAsync,
which has no observer (the moment torch.OutOfMemoryError is made)."""

import re

import torch

import allocscope as _allocscope

from ._common import _lock, _say

_installed = False

_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# PyTorch's messages (c10 format_size: two decimals): the native allocator's
# "Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of
# which 1.25 GiB is free", cudaMallocAsync's "Allocation on device 0 ...
# Requested               : 20.00 MiB ... Free (according to CUDA): 1.25 GiB".
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
_REQUESTED = re.compile(r"(?:Tried to allocate|Requested\s*:)\s*" + _SIZE)
_FREE = re.compile(r"(?:of which " + _SIZE + r" is free|Free \(according to CUDA\):\s*" + _SIZE + ")")
_DEVICE = re.compile(r"(?:GPU|on device) ([0-9]+)")


def _bytes(number, unit):
    return int(float(number) * _UNITS[unit])


def parse_message(text):
    """(requested bytes, device, device free bytes) from an OOM message;
    None when it names no request. Sizes are as PyTorch printed them (two
    decimals of their unit); device -1 and free 0 when not stated."""
    m = _REQUESTED.search(text)
    if not m:
        return None
    requested = _bytes(m.group(1), m.group(2))
    d = _DEVICE.search(text)
    device = int(d.group(1)) if d else -1
    f = _FREE.search(text)
    free = 0
    if f:
        groups = [g for g in f.groups() if g is not None]
        free = _bytes(groups[0], groups[1])
    return requested, device, free


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
