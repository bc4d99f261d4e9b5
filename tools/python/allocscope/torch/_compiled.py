"""torch.compile's generated code named by the user's lines.

Inductor writes each compiled graph as a Python file whose `call` allocates
the graph's buffers (`buf3 = empty_strided_cuda(...)`) and runs its
kernels. An allocation made there has that generated line as its innermost
Python frame, which says nothing to the user. Inductor loads every such
file, on a fresh compile and on a cache hit alike, through
`PyCodeCache.load_by_key_path(key, path, linemap)`, where `linemap` pairs
lines of the file with the stack trace of the FX node whose code starts
there (inductor's own map for rewriting tracebacks). This module wraps that
call: each line of the file that binds a buffer to a new tensor is named,
through allocscope_python_frame_alias, as the user's source line of the
node whose code it belongs to (the nearest line of the map at or before
it), e.g. `forward [compiled: buf4] (model.py:269)`.

Nothing of the program changes: the wrapper calls the original first and
returns its module; any failure of its own leaves frames as they were."""

import bisect
import importlib.abc
import importlib.util
import re
import sys

import allocscope as _allocscope

_CODECACHE = "torch._inductor.codecache"

# A buffer (or a memory-planning pool) bound to a new tensor: not an alias
# of another buffer ("buf5 = buf3; del buf3  # reuse") and not a view of one
# (reinterpret_tensor), which allocate nothing.
_ALLOCATING = re.compile(
    r"\s+((?:buf|pool)\d+)\s*=\s*(?!reinterpret_tensor\()(?!(?:buf|pool)\d+\s*(?:;|#|$))\S"
)
_TRACE_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def user_frame(stack_trace):
    """(function, file, line) of the innermost frame of an FX node's
    stack_trace (the user's line that made the node), or None."""
    if not stack_trace:
        return None
    frames = _TRACE_FRAME.findall(stack_trace)
    if not frames:
        return None
    file, line, function = frames[-1]
    return function, file, int(line)


def aliases(source_lines, linemap):
    """(line, function, as_file, as_line) for every line of generated
    `source_lines` (line 1 first) that allocates a buffer, named after the
    node of the nearest `linemap` entry (line, stack_trace) at or before
    it; lines before the first entry, or whose entry has no stack, are left
    out."""
    marks = sorted((int(line), trace) for line, trace in linemap or () if trace)
    starts = [line for line, _ in marks]
    out = []
    for number, text in enumerate(source_lines, 1):
        match = _ALLOCATING.match(text)
        if not match:
            continue
        at = bisect.bisect_right(starts, number) - 1
        if at < 0:
            continue
        frame = user_frame(marks[at][1])
        if frame is None:
            continue
        function, file, line = frame
        out.append((number, "%s [compiled: %s]" % (function, match.group(1)), file, line))
    return out


def _name_frames(path, linemap):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for number, function, file, line in aliases(lines, linemap):
        _allocscope.python_frame_alias(path, number, function, file, line)


def _wrap(codecache):
    """Wraps codecache.PyCodeCache.load_by_key_path once."""
    cache = getattr(codecache, "PyCodeCache", None)
    original = getattr(cache, "load_by_key_path", None) if cache is not None else None
    if original is None or getattr(original, "_allocscope", False):
        return
    function = getattr(original, "__func__", None)  # a classmethod's function
    if function is None:
        return

    def load_by_key_path(cls, key, path, linemap=None, *args, **kwargs):
        module = function(cls, key, path, linemap, *args, **kwargs)
        if linemap:
            try:
                _name_frames(path, linemap)
            except Exception:  # never break the program's compile
                pass
        return module

    load_by_key_path._allocscope = True
    cache.load_by_key_path = classmethod(load_by_key_path)


class _Finder(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after module `name` is imported (once)."""

    def __init__(self, name, then):
        self.name = name
        self.then = then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # the import machinery says it again, without this finder
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        then = self.then

        def exec_and_wrap(module):
            exec_module(module)
            try:
                then(module)
            except Exception:
                pass

        spec.loader.exec_module = exec_and_wrap
        return spec


_installed = False


def install():
    """Names generated frames from now on: at once when inductor's code
    cache is imported, else when it will be."""
    global _installed
    if _installed:
        return
    _installed = True
    module = sys.modules.get(_CODECACHE)
    if module is not None:
        _wrap(module)
    else:
        sys.meta_path.insert(0, _Finder(_CODECACHE, _wrap))
