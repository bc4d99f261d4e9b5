"""The request in PyTorch's out-of-memory messages (no torch needed, so the
parser is tested on any machine: tests/python/oom_text_test.py)."""

import re

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
