#!/usr/bin/env python3
"""allocscope._oom_text.parse_message, which reads the request out of
PyTorch's out-of-memory messages where no allocator hook gives it
(backend:cudaMallocAsync): the messages of both allocators, as PyTorch's
c10 format_size prints sizes (bytes below 1 KiB, else two decimals).

    python3 tests/python/run_pytest.py tests/python/oom_text_test.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "python"))
from allocscope._oom_text import parse_message  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def test_the_native_allocators_message_gives_request_device_and_free():
    text = (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of "
        "139.81 GiB of which 1.25 GiB is free. Including non-PyTorch memory, this process "
        "has 150.00 MiB memory in use. Of the allocated memory 99.00 MiB is allocated by "
        "PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated."
    )
    assert parse_message(text) == (20 * MiB, 1, int(1.25 * GiB))


def test_the_cudamallocasync_message_gives_request_device_and_free():
    text = (
        "Allocation on device 0 would exceed allowed memory. (out of memory)\n"
        "Currently allocated     : 95.87 MiB\n"
        "Requested               : 256.00 KiB\n"
        "Device limit            : 139.81 GiB\n"
        "Free (according to CUDA): 137.92 GiB\n"
        "PyTorch limit (set by user-supplied memory fraction)\n"
        "                        : 96.00 MiB"
    )
    assert parse_message(text) == (256 << 10, 0, int(137.92 * GiB))


def test_sizes_below_a_kibibyte_are_bytes_and_a_message_without_a_request_is_none():
    assert parse_message("Tried to allocate 512 bytes. GPU 0 has") == (512, 0, 0)
    assert parse_message("CUDA error: an illegal memory access was encountered") is None
