#!/usr/bin/env python3
"""The PyTorch bridge's Python frame walk (tools/torch_bridge/python_frames.h)
against what the interpreter itself says, without torch (meson tests
python_frames_<version>):

    PYTHON_FRAMES_PROBE=LIB python3.12 tests/python/run_pytest.py tests/python/python_frames_test.py
    python3.12 tests/python/python_frames_test.py LIB --bench

LIB is tests/python/python_frames_probe.cpp built against this interpreter's
headers. Calls through ctypes.CDLL run without the GIL, as the bridge's walk
does under an operator that released it; ctypes.PyDLL calls hold it. Skipped
(exit 77) before Python 3.12, where the bridge reads no frames. With
--bench, prints the walk's cost instead of testing.
"""

import ctypes
import gc
import os
import sys
import threading

MAX = 16


def load(path):
    libs = {}
    for name, kind in (("nogil", ctypes.CDLL), ("gil", ctypes.PyDLL)):
        lib = kind(path)
        lib.probe_walk.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.probe_walk.restype = ctypes.c_long
        lib.probe_name.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        lib.probe_name.restype = ctypes.c_size_t
        lib.probe_names_made.restype = ctypes.c_size_t
        lib.probe_walk_ns.argtypes = [ctypes.c_long]
        lib.probe_walk_ns.restype = ctypes.c_double
        lib.probe_pin.restype = ctypes.c_int
        lib.probe_walk_cold_ns.argtypes = [ctypes.c_long, ctypes.c_long]
        lib.probe_walk_cold_ns.restype = ctypes.c_double
        libs[name] = lib
    return libs


LIBS = None


def frame_text(f, line=None):
    return "%s (%s:%d)" % (f.f_code.co_qualname, f.f_code.co_filename,
                           f.f_lineno if line is None else line)


def walk(kind="nogil"):
    """(ids, names, expected names): the walk's frames, innermost first
    (this function's own first), and what the interpreter says they are."""
    out = (ctypes.c_uint64 * MAX)()
    line = sys._getframe().f_lineno + 1
    n = LIBS[kind].probe_walk(out, MAX)
    want = [frame_text(sys._getframe(), line)]
    f = sys._getframe(1)
    while f is not None and len(want) < MAX:
        want.append(frame_text(f))  # a caller's line is that of its call
        f = f.f_back
    ids = list(out[:n])
    buf = ctypes.create_string_buffer(1024)
    names = []
    for i in ids:
        LIBS[kind].probe_name(i, buf, len(buf))
        names.append(buf.value.decode())
    return ids, names, want


def assert_names(got, want, what):
    assert got == want, "%s:\n  got  %s\n  want %s" % (what, got, want)


if __name__ != "__main__":  # under pytest (--bench needs none)
    import pytest

    if sys.version_info < (3, 12):
        pytest.skip("Python %d.%d reads no frames (3.12 and later)" % sys.version_info[:2],
                    allow_module_level=True)
    LIBS = load(os.environ["PYTHON_FRAMES_PROBE"])


# ---------------------------------------------------------------- cases


def a(kind):
    return b(kind)


def b(kind):
    return c(kind)


def c(kind):
    return walk(kind)


def test_nested_calls_are_walked_innermost_first():
    for kind in ("nogil", "gil"):
        _, got, want = a(kind)
        assert_names(got, want, "nested calls (%s)" % kind)
        assert [n.split(" ")[0] for n in got[:4]] == ["walk", "c", "b", "a"], (
            "innermost first (%s): %s" % (kind, got[:4])
        )


def test_the_same_stack_again_reuses_its_ids_and_names():
    for kind in ("nogil", "gil"):
        ids = []
        for i in range(3):
            ids.append(a(kind)[0])
            if i == 0:
                before = LIBS[kind].probe_names_made()
        assert ids[0] == ids[1] == ids[2], "the same stack thrice gives the same ids (%s)" % kind
        assert LIBS[kind].probe_names_made() == before, (
            "no new names for a stack seen before (%s)" % kind
        )


def test_lines_follow_the_call_site():
    seen = []
    for i in range(4):
        if i % 2:
            seen.append(walk())
        else:
            seen.append(walk())
    for _, got, want in seen:
        assert_names(got, want, "each call site's line")
    assert seen[0][1][1] != seen[1][1][1], "two call sites in one function: two lines"
    assert seen[0][1] == seen[2][1], "the same call site again: the same names"


def gen():
    yield walk()


def test_a_generators_frame_is_walked():
    _, got, want = next(gen())
    assert_names(got, want, "a generator's frame")
    assert got[1].startswith("gen ("), "the generator is the walk's caller"


def test_a_thread_walks_only_its_own_frames():
    result = {}

    def body():
        result["walk"] = walk()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    _, got, want = result["walk"]
    assert_names(got, want, "a thread's own frames")
    assert not any(n.startswith("test_a_thread_walks_only_its_own_frames (") for n in got), (
        "another thread's walk has none of the main thread's frames"
    )


def deep(n):
    if n == 0:
        return walk()
    return deep(n - 1)


def test_a_deep_stack_keeps_its_innermost_frames():
    _, got, want = deep(30)
    assert len(got) == MAX, "a deep stack gives %d frames (got %d)" % (MAX, len(got))
    assert_names(got, want, "a deep stack's innermost frames")


def test_new_code_objects_are_named_anew():
    # Code objects made and freed one after another: a new one may take a
    # freed one's address; a name cached without the GIL must not be reused
    # for it.
    for i in range(200):
        scope = {"walk": walk}
        exec(compile("def f_%d():\n    return walk()\n" % i, "<gen %d>" % i, "exec"), scope)
        _, got, want = scope["f_%d" % i]()
        assert_names(got[:2], want[:2], "a fresh function's frame (%d)" % i)
        del scope
        gc.collect()


def pin_here():
    """Pins the caller's frames (with the GIL, as a module hook does)."""
    assert LIBS["gil"].probe_pin() == 0, "this Python has no raw walk"


def under_pin(kind):
    pin_here()
    return pinned_inner(kind)


def pinned_inner(kind):
    return walk(kind)


def test_pinned_frames_keep_their_code_objects_and_their_names():
    # The module hooks pin the frames above a module call with the GIL; the
    # allocations below them are walked without it.
    code = under_pin.__code__
    before = sys.getrefcount(code)
    _, got, want = under_pin("nogil")
    assert sys.getrefcount(code) == before + 1, "the pin holds one reference to the caller's code"
    assert_names(got, want, "frames walked without the GIL under pinned ones")
    # Pinned once: another pin and more walks take no further reference.
    for _ in range(3):
        _, got, want = under_pin("nogil")
        assert_names(got, want, "frames walked again under pinned ones")
    assert sys.getrefcount(code) == before + 1, "a code object is pinned once"


def test_a_pinned_frame_at_another_line_is_named_for_that_line():
    # The pin names the frames at the lines they are at during the pin; an
    # allocation below the same frames at another line gets that line.
    def caller():
        pin_here()
        first = pinned_inner("nogil")
        second = pinned_inner("nogil")
        return first, second

    (_, got1, want1), (_, got2, want2) = caller()
    assert_names(got1, want1, "the first call's frames")
    assert_names(got2, want2, "the second call's frames")
    assert got1[2] != got2[2], "two call sites of one pinned frame are two lines"


def test_a_pin_never_vouches_for_a_name_made_for_a_freed_code_object():
    # A function named without the GIL (unpinned) and freed, then a new one,
    # which may take its code object's address, pinned: the pin must not
    # make the freed one's names the new one's.
    src = ("def f_%d(pin):\n"
           "    if pin:\n"
           "        pin_here()\n"
           "    return walk()\n")
    reused = 0
    for i in range(300):
        scope = {"walk": walk, "pin_here": pin_here}
        exec(compile(src % i, "<pinned %d>" % i, "exec"), scope)
        f = scope["f_%d" % i]
        if i % 2 == 0:
            freed = id(f.__code__)
            _, got, want = f(False)
            assert_names(got[:2], want[:2], "an unpinned function's frames (%d)" % i)
        else:
            reused += id(f.__code__) == freed
            _, got, want = f(True)
            assert_names(got[:2], want[:2], "a pinned function's frames (%d)" % i)
        del scope, f
        gc.collect()
    assert reused > 0, "no code object took a freed one's address: the case was not made"


def test_pins_that_find_nothing_new_go_quiet_and_still_find_a_new_path():
    # The module hooks pin at every module call; once the same frames come
    # back again and again, pins run only now and then (at most every 64th
    # call), and a new caller's frames are still pinned by then.
    def same_path():
        pin_here()

    for _ in range(200):
        same_path()
    scope = {"pin_here": pin_here}
    exec(compile("def new_path():\n    pin_here()\n", "<new path>", "exec"), scope)
    code = scope["new_path"].__code__
    before = sys.getrefcount(code)
    calls = 0
    while sys.getrefcount(code) == before and calls < 1000:
        scope["new_path"]()
        calls += 1
    assert sys.getrefcount(code) == before + 1, "a new path is pinned"
    assert calls <= 64, "a new path is pinned within 64 calls (took %d)" % calls


def bench():
    def at_depth(n, kind):
        if n == 0:
            return LIBS[kind].probe_walk_ns(200000)
        return at_depth(n - 1, kind)

    for kind in ("nogil", "gil"):
        for depth in (1, 10):
            best = min(at_depth(depth, kind) for _ in range(5))
            print("walk %-5s %2d frames below the test: %.1f ns" % (kind, depth, best))
    # Cold: 8 MiB written between walks, 10 frames of 10 functions (code
    # objects) of their own, unpinned and pinned (as under the module
    # hooks' pins).
    for pinned in (False, True):
        src = ["def f0(pin):\n"
               "    if pin:\n"
               "        pin_here()\n"
               "    return LIBS['nogil'].probe_walk_cold_ns(2000, 8192)\n"]
        src += ["def f%d(pin):\n    return f%d(pin)\n" % (i, i - 1) for i in range(1, 10)]
        scope = {"LIBS": LIBS, "pin_here": pin_here}
        exec(compile("".join(src), "<cold>", "exec"), scope)
        best = min(scope["f9"](pinned) for _ in range(5))
        print("walk nogil 10 frames, caches written over between walks, %s: %.1f ns"
              % ("pinned" if pinned else "not pinned", best))


def main():
    """--bench: the walk's cost (the tests run under pytest)."""
    global LIBS
    if sys.version_info < (3, 12):
        print("skipped: Python %d.%d reads no frames (3.12 and later)" % sys.version_info[:2])
        return 77
    if len(sys.argv) < 3 or sys.argv[2] != "--bench":
        print("usage: %s LIB --bench (the tests: tests/python/run_pytest.py)" % sys.argv[0])
        return 2
    LIBS = load(sys.argv[1])
    bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
