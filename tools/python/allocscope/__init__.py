"""allocscope from Python: tags, steps, parameters and notes for the trace.

The functions call the C API of liballocscope.so (include/allocscope/allocscope.h)
through ctypes. The library is not loaded by this package: it is the one
`allocscope run` (or LD_PRELOAD) already put in the process, found by symbol
lookup in the process (ctypes.CDLL(None)), or, when ALLOCSCOPE_LIB names it and
it is already loaded under that path, by that path (never loaded afresh: a
tracer that starts in the middle of a process would miss what came before).
When it is absent every call does nothing; the first call says so once on
stderr.

    import allocscope
    with allocscope.scope("layers.3", "forward"):
        ...
    allocscope.step(1)

Tags are per thread: a scope entered on one thread does not tag another.
PyTorch integration (module and optimizer hooks, parameter registration, the
caching-allocator bridge) is in allocscope.torch.
"""

import ctypes
import os
import sys
import threading

__all__ = [
    "available",
    "push",
    "pop",
    "step",
    "register_param",
    "mark",
    "derived",
    "block_alloc",
    "block_free",
    "block_oom",
    "scope",
    "rank",
    "library_path",
]

_lock = threading.Lock()
_api = None  # _Api, or False once the lookup failed
_warned = False


_u32, _u64, _str, _ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_void_p

# The C API (include/allocscope/allocscope.h): name -> (argtypes, restype).
_SIGNATURES = {
    "push": ([_str, _str], None),
    "pop": ([], None),
    "enter": ([_u64, _u32, _u64, _str, _str], ctypes.c_int),
    "enter_nested": ([_u64, _u32, _u64, _str, _str], ctypes.c_int),
    "leave": ([_u64, _u32, _ptr], ctypes.c_int64),
    "leave_kind": ([_u32, _u64], None),
    "keyed_depth": ([], ctypes.c_int),
    "keyed_kind_depth": ([_u32], ctypes.c_int),
    "current_layer": ([_str, ctypes.c_size_t], ctypes.c_size_t),
    "step": ([_u64], None),
    "register_param": ([_str, _str, _u64, _str, _u64], None),
    "mark": ([_str], None),
    "derived": ([_ptr, _str, _str, _str], None),
    "block_alloc": ([_ptr, ctypes.c_size_t, ctypes.c_int, _ptr], None),
    "block_free": ([_ptr], None),
    "block_oom": ([ctypes.c_size_t, ctypes.c_int, _ptr, _u64], None),
}


class _Api:
    """The C API's functions of `lib` as attributes (push, pop, enter, ...);
    AttributeError when one is missing."""

    def __init__(self, lib):
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(lib, "allocscope_" + name)
            function.argtypes = argtypes
            function.restype = restype
            setattr(self, name, function)


def _lookup():
    """The C API of the liballocscope.so already in the process, or None."""
    candidates = []
    try:
        candidates.append(ctypes.CDLL(None))
    except OSError:
        pass
    path = os.environ.get("ALLOCSCOPE_LIB")
    if path:
        try:
            # RTLD_NOLOAD: only a library already loaded under this path.
            candidates.append(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL))
        except OSError:
            pass
    for lib in candidates:
        try:
            return _Api(lib)
        except AttributeError:
            continue
    return None


def _get():
    global _api, _warned
    api = _api
    if api is None:
        with _lock:
            if _api is None:
                _api = _lookup() or False
            api = _api
    if api is False:
        if not _warned:
            with _lock:
                if not _warned:
                    _warned = True
                    sys.stderr.write(
                        "allocscope: liballocscope.so is not loaded in this process; "
                        "allocscope calls do nothing (run under `allocscope run -- ...`)\n"
                    )
        return None
    return api


def available():
    """True when liballocscope.so is loaded in this process (no warning)."""
    global _api
    if _api is None:
        with _lock:
            if _api is None:
                _api = _lookup() or False
    return _api is not False


def _b(text):
    if text is None:
        return None
    if isinstance(text, bytes):
        return text
    return str(text).encode("utf-8", "replace")


def push(layer, phase):
    """Enters (layer, phase) on the calling thread; None keeps the enclosing value."""
    api = _get()
    if api is not None:
        api.push(_b(layer), _b(phase))


def pop():
    """Leaves the innermost tag of the calling thread."""
    api = _get()
    if api is not None:
        api.pop()


def step(n):
    """Sets the process-wide training step."""
    api = _get()
    if api is not None:
        api.step(int(n))


def register_param(layer, name, numel, dtype, sharded_numel=None):
    """Declares a parameter `name` of module `layer`: numel elements unsharded,
    sharded_numel on this rank (default: numel), stored as dtype ("bf16", ...)."""
    api = _get()
    if api is not None:
        numel = int(numel)
        api.register_param(
            _b(layer),
            _b(name),
            numel,
            _b(dtype),
            numel if sharded_numel is None else int(sharded_numel),
        )


def mark(text):
    """Records a free-form note in the trace at this point."""
    api = _get()
    if api is not None:
        api.mark(_b(text))


def derived(ptr, layer, name, how=None):
    """Declares that the allocation at address `ptr` (an int, e.g. a tensor's
    untyped_storage().data_ptr()) holds bytes computed from parameter `name`
    of module `layer`: a quantized copy, a transpose, a scale. `how` says how
    (optional). The weight detectors then report it as proven evidence."""
    api = _get()
    if api is not None and ptr:
        api.derived(int(ptr), _b(layer), _b(name), None if how is None else _b(how))


def block_alloc(ptr, size, device=0, stream=None):
    """Caching-allocator hook: a block of `size` bytes at address `ptr` was handed out."""
    api = _get()
    if api is not None:
        api.block_alloc(ptr, int(size), int(device), stream)


def block_free(ptr):
    """Caching-allocator hook: the block at `ptr` was taken back."""
    api = _get()
    if api is not None:
        api.block_free(ptr)


def block_oom(size, device=0, stream=None, device_free=0):
    """Caching-allocator hook: a request of `size` bytes could not be served
    (the program sees an out-of-memory error). `device_free`: the device's
    free bytes when it failed, 0 when not known."""
    api = _get()
    if api is not None:
        api.block_oom(int(size), int(device), stream, int(device_free))


class scope:
    """`with allocscope.scope("layers.3", "forward"):` tags the block on this
    thread; the tag is left however the block exits. Also a decorator."""

    __slots__ = ("layer", "phase")

    def __init__(self, layer, phase):
        self.layer = layer
        self.phase = phase

    def __enter__(self):
        push(self.layer, self.phase)
        return self

    def __exit__(self, exc_type, exc, tb):
        pop()
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with scope(self.layer, self.phase):
                return fn(*args, **kwargs)

        return wrapped


def rank():
    """This process's rank from RANK (else LOCAL_RANK, OMPI_COMM_WORLD_RANK,
    SLURM_PROCID), or None. The interposer reads the rank itself."""
    for name in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def library_path():
    """The path liballocscope.so is mapped from in this process, or None."""
    try:
        with open("/proc/self/maps", "r", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].rstrip("\n").endswith("/liballocscope.so"):
                    return parts[5].rstrip("\n")
    except OSError:
        pass
    return os.environ.get("ALLOCSCOPE_LIB") if available() else None
