"""allocscope from Python: tags, steps, parameters and notes for the trace.

The functions call the C API of liballocscope.so (include/allocscope/allocscope.h)
through ctypes. The library is not loaded by this package: it is the one
`allocscope run` (or LD_PRELOAD) already put in the process, found by symbol
lookup in the process (ctypes.CDLL(None)), or, when ALLOCSCOPE_LIB names it and
it is already loaded under that path, by that path (never loaded afresh: a
tracer that starts in the middle of a process would miss what came before).
ALLOCSCOPE_LIB is the one variable read here from the environment: the library
has to be found before it can be asked; every other ALLOCSCOPE_* value comes
from the library, parsed once (config()).
When it is absent every call does nothing; the first call says so once on
stderr.

    import allocscope
    with allocscope.scope("layers.3", "forward"):
        ...
    allocscope.step(1)

Tags are per thread: a scope entered on one thread does not tag another.

Checks run the detection plugins on a stretch of the program's own events
and fail when they find something (include/allocscope/doctest.h for C++):

    with allocscope.check("weight-copy-accumulation", fail_on="warning") as c:
        train_step()
    # raised CheckFailed if a finding was at or above warning; c.findings

The pytest marker @pytest.mark.allocscope is in allocscope.pytest.
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
    "allocator_counters",
    "oom_parameter",
    "scope",
    "rank",
    "library_path",
    "config",
    "config_on",
    "check",
    "CheckFailed",
    "Finding",
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
    "python_frame": ([_str, _str, ctypes.c_int], _u64),
    "python_frame_alias": ([_str, ctypes.c_int, _str, _str, ctypes.c_int], None),
    "python_frame_scope": ([_str, ctypes.c_int, _str, _str, _str, _str], None),
    "block_alloc_frames": (
        [_ptr, ctypes.c_size_t, ctypes.c_int, _ptr, ctypes.POINTER(_u64), ctypes.c_size_t],
        None,
    ),
    "block_free": ([_ptr], None),
    "graph_pool": ([_u64, _u64], None),
    "block_oom": ([ctypes.c_size_t, ctypes.c_int, _ptr, _u64], None),
    "allocator_counters": ([ctypes.c_int, _u64, _u64, _u64], None),
    "oom_parameter": ([_str, _str, _u64], None),
    "check_begin": ([_str, _str, _str, ctypes.c_size_t], _u64),
    "check_end": ([_u64, _ptr, _ptr, _str, ctypes.c_size_t], ctypes.c_int),
    "config_get": ([_str, _str, ctypes.c_size_t], ctypes.c_int64),
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


def python_frame_alias(file, line, function, as_file, as_line):
    """Names Python frames at (`file`, `line`), generated code, as
    `function (as_file:as_line)`, the source line it was generated from
    (allocscope_python_frame_alias). Call before the line first runs."""
    api = _get()
    if api is not None:
        api.python_frame_alias(_b(file), int(line), _b(function), _b(as_file), int(as_line))


def python_frame_scope(file, line, module, param_module=None, param=None, how=None):
    """Allocations whose innermost Python frame is (`file`, `line`), generated
    code, are tagged "<enclosing layer>.<module>" and, with `param`,
    declared derived from parameter `param` of "<enclosing
    layer>.<param_module>" (allocscope_python_frame_scope)."""
    api = _get()
    if api is not None:
        api.python_frame_scope(
            _b(file), int(line), _b(module or ""),
            None if param is None else _b(param_module or ""),
            None if param is None else _b(param),
            None if how is None else _b(how),
        )


# allocscope_python_frame's address per (code object, line): the C API asks
# for one call per frame, the result kept.
_FRAME_ADDRESSES = {}
_MAX_PYTHON_FRAMES = 32  # allocscope_block_alloc_frames' limit


def _python_frames(api, frame):
    """The C API's addresses of `frame` and its callers, innermost first."""
    addresses = []
    while frame is not None and len(addresses) < _MAX_PYTHON_FRAMES:
        code = frame.f_code
        key = (code, frame.f_lineno)
        address = _FRAME_ADDRESSES.get(key)
        if address is None:
            name = getattr(code, "co_qualname", code.co_name)
            address = api.python_frame(_b(name), _b(code.co_filename), frame.f_lineno or 0)
            if address:
                _FRAME_ADDRESSES[key] = address
        if address:
            addresses.append(address)
        frame = frame.f_back
    return addresses


def block_alloc(ptr, size, device=0, stream=None):
    """Caching-allocator hook: a block of `size` bytes at address `ptr` was
    handed out. Its stack ends in the caller's Python frames."""
    api = _get()
    if api is not None:
        frames = _python_frames(api, sys._getframe(1))
        api.block_alloc_frames(
            ptr, int(size), int(device), stream, (_u64 * len(frames))(*frames), len(frames)
        )


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


def oom_parameter(layer, name, count=1):
    """Names the parameter (module `layer`, parameter `name`) this thread was
    processing when it ran out of memory, right after the failure; `count`
    > 1: the first of that many processed together. The report names it in
    the thread's out-of-memory moment."""
    api = _get()
    if api is not None:
        api.oom_parameter(_b(layer), _b(name), max(int(count), 1))


def allocator_counters(device, allocated, reserved, device_used=0):
    """The caching allocator's own counters for `device` at a step boundary
    (allocated and reserved bytes, and the device memory in use by the
    driver's count, 0 when not known): the report sets allocscope's live
    bytes against them (its self-check)."""
    api = _get()
    if api is not None:
        api.allocator_counters(int(device), int(allocated), int(reserved), int(device_used))


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


def config(name):
    """The value of ALLOCSCOPE_* variable `name` as liballocscope.so parsed it
    (allocscope_config_get in allocscope.h; docs/ENVIRONMENT.md): its default
    when unset or invalid, in canonical text (switches "1" or "0", whatever of
    1/true/yes, 0/false/no was written). None when the library is not loaded
    in this process (nothing is recorded then) or does not know `name`."""
    if not available():
        return None
    size = 256
    while True:
        out = ctypes.create_string_buffer(size)
        n = _api.config_get(_b(name), out, size)
        if n < 0:
            return None
        if n < size:
            return out.value.decode("utf-8", "surrogateescape")
        size = n + 1


def config_on(name):
    """Whether switch `name` is on as liballocscope.so parsed it: True
    unless it says "0" (the switches read here are on by default; without
    the library nothing is recorded whatever they say)."""
    return config(name) != "0"


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
    return config("ALLOCSCOPE_LIB") or None


# ------------------------------------------------------------------ checks

SEVERITIES = ("info", "warning", "error")  # allocscope_severity_v1, in order

HOW_TO_RUN = "allocscope run -- python3 script.py"


def not_loaded_line(how_to_run=HOW_TO_RUN):
    """The one line that says a check cannot run here and how to run it."""
    return (
        "allocscope: liballocscope.so is not loaded in this process, so nothing was "
        "checked: run it as `%s`" % how_to_run
    )


class CheckFailed(AssertionError):
    """A check found something at or above its level, or could not look
    (a plugin that did not load or was disabled, nothing to check, no
    interposer). str() is the report: one line, or a headline and one line
    per finding. `findings`: those at or above the level (Finding);
    `unchecked`: the line saying what was not checked, "" when the check
    ran to its end."""

    def __init__(self, report, findings=(), unchecked=""):
        super().__init__(report)
        self.findings = list(findings)
        self.unchecked = unchecked


class Finding:
    """One finding of a check, as the C API gives it (allocscope_check_finding):
    plugin, severity ("info", "warning", "error"), rank (None: no rank),
    layer and phase ("" when not attributed), bytes, count, summary and
    stack: the stack of its first evidence allocation that has one, one
    frame per line, trimmed to the program's code ("" when none)."""

    __slots__ = (
        "plugin", "severity", "rank", "layer", "phase", "bytes", "count", "summary", "stack"
    )

    def __init__(self, plugin, severity, rank, layer, phase, nbytes, count, summary, stack=""):
        self.plugin = plugin
        self.severity = severity
        self.rank = rank
        self.layer = layer
        self.phase = phase
        self.bytes = nbytes
        self.count = count
        self.summary = summary
        self.stack = stack

    def line(self):
        """The finding in one line: plugin [severity] where: summary."""
        where = " ".join(
            part
            for part in (
                self.layer,
                self.phase and "(%s)" % self.phase,
                self.rank is not None and "rank %d" % self.rank or "",
            )
            if part
        )
        return "%s [%s] %s%s" % (
            self.plugin,
            self.severity,
            where + ": " if where else "",
            self.summary,
        )

    def report(self, indent="  "):
        """The line, then the stack indented under it."""
        lines = [indent + self.line()]
        lines.extend(indent + "    " + frame for frame in self.stack.splitlines())
        return "\n".join(lines)

    def __repr__(self):
        return "Finding(%s)" % self.line()


class _CheckFinding(ctypes.Structure):
    _fields_ = [
        ("plugin", ctypes.c_char_p),
        ("severity", ctypes.c_uint32),
        ("rank", ctypes.c_int32),
        ("layer", ctypes.c_char_p),
        ("phase", ctypes.c_char_p),
        ("bytes", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
        ("summary", ctypes.c_char_p),
        ("stack", ctypes.c_char_p),  # NULL from a library without stacks
    ]


_CHECK_VISITOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_CheckFinding))


def _text(raw):
    return (raw or b"").decode("utf-8", "replace")


def _reason(error):
    """The C API's error text without its own "allocscope: " prefix."""
    text = _text(error.value)
    return text[len("allocscope: "):] if text.startswith("allocscope: ") else text


def _plugin_list(plugins):
    """A comma list from a str or a list; None for every plugin (None or empty)."""
    if plugins is not None and not isinstance(plugins, (str, bytes)):
        plugins = ",".join(str(p) for p in plugins)
    return plugins or None


def _option_list(options):
    """A comma list "<plugin>.<key>=<value>,..." from a str or a dict
    {"<plugin>.<key>": value}."""
    if options is None or isinstance(options, (str, bytes)):
        return options
    return ",".join("%s=%s" % (key, value) for key, value in options.items())


class check:
    """`with allocscope.check(plugins, options, fail_on="error") as c:` runs
    the block inside a check: the detection plugins see the events recorded
    from its start to its end, in instances of their own, and when the
    block ends CheckFailed is raised for findings at or above `fail_on`
    ("info", "warning" or "error"), listing them. A check that cannot look
    never passes: without liballocscope.so in the process, or when a plugin
    does not load, is disabled by its own error, or none is found, it raises
    CheckFailed with one line saying what was not checked.

    plugins: names or paths, a list or a comma list as ALLOCSCOPE_PLUGINS
      (None or empty: every plugin of the plugin directory).
    options: {"<plugin>.<key>": value} or "<plugin>.<key>=<value>,...".
    After the block, c.findings holds every finding (Finding) and c.failing
    those at or above fail_on. An exception from the block goes on
    unchanged; the check is ended all the same."""

    def __init__(self, plugins=None, options=None, fail_on="error", how_to_run=HOW_TO_RUN):
        if fail_on not in SEVERITIES:
            raise ValueError("fail_on must be one of %s, not %r" % (", ".join(SEVERITIES), fail_on))
        self.plugins = _plugin_list(plugins)
        self.options = _option_list(options)
        self.fail_on = fail_on
        self.findings = []
        self.failing = []
        self._how_to_run = how_to_run
        self._id = 0

    def __enter__(self):
        if not available():
            line = not_loaded_line(self._how_to_run)
            raise CheckFailed(line, unchecked=line)
        error = ctypes.create_string_buffer(1024)
        self._id = _api.check_begin(_b(self.plugins), _b(self.options), error, len(error))
        if self._id == 0:
            line = "allocscope check did not run: %s" % _reason(error)
            raise CheckFailed(line, unchecked=line)
        return self

    def __exit__(self, exc_type, exc, tb):
        unchecked = self._end()
        if exc_type is None and (unchecked or self.failing):
            lines = [unchecked] if unchecked else []
            if self.failing:
                lines.append(
                    "allocscope: %d finding(s) at or above %s:" % (len(self.failing), self.fail_on)
                )
                lines.extend(f.report() for f in self.failing)
            raise CheckFailed("\n".join(lines), self.failing, unchecked)
        return False

    def _end(self):
        """Ends the check, keeping its findings; the line saying why it did
        not run to its end, or "" when it did."""
        found = []

        def visit(_user, finding):
            f = finding.contents
            found.append(
                Finding(
                    _text(f.plugin),
                    SEVERITIES[min(f.severity, len(SEVERITIES) - 1)],
                    None if f.rank < 0 else f.rank,
                    _text(f.layer),
                    _text(f.phase),
                    f.bytes,
                    f.count,
                    _text(f.summary),
                    _text(f.stack),
                )
            )

        error = ctypes.create_string_buffer(1024)
        rc = _api.check_end(self._id, _CHECK_VISITOR(visit), None, error, len(error))
        self._id = 0
        level = SEVERITIES.index(self.fail_on)
        self.findings = found
        self.failing = [f for f in found if SEVERITIES.index(f.severity) >= level]
        return "allocscope check did not run to its end: %s" % _reason(error) if rc != 0 else ""
