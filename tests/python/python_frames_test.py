#!/usr/bin/env python3
"""The PyTorch bridge's Python frame walk (tools/torch_bridge/python_frames.h)
against what the interpreter itself says, without torch:

    python3.12 tests/python/python_frames_test.py LIB [--bench]

LIB is tests/python/python_frames_probe.cpp built against this interpreter's
headers. Calls through ctypes.CDLL run without the GIL, as the bridge's walk
does under an operator that released it; ctypes.PyDLL calls hold it. Exits
77 (skipped) before Python 3.12, where the bridge reads no frames. With
--bench, prints the walk's cost instead of testing.
"""

import ctypes
import gc
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


FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def check_names(got, want, what):
    check(got == want, "%s:\n  got  %s\n  want %s" % (what, got, want))


# ---------------------------------------------------------------- cases


def a(kind):
    return b(kind)


def b(kind):
    return c(kind)


def c(kind):
    return walk(kind)


def case_nested_calls():
    for kind in ("nogil", "gil"):
        _, got, want = a(kind)
        check_names(got, want, "nested calls (%s)" % kind)
        check([n.split(" ")[0] for n in got[:4]] == ["walk", "c", "b", "a"],
              "innermost first (%s): %s" % (kind, got[:4]))


def case_same_stack_reuses_names():
    for kind in ("nogil", "gil"):
        ids = []
        for i in range(3):
            ids.append(a(kind)[0])
            if i == 0:
                before = LIBS[kind].probe_names_made()
        check(ids[0] == ids[1] == ids[2], "the same stack thrice gives the same ids (%s)" % kind)
        check(LIBS[kind].probe_names_made() == before,
              "no new names for a stack seen before (%s)" % kind)


def case_lines_follow_the_call_site():
    seen = []
    for i in range(4):
        if i % 2:
            seen.append(walk())
        else:
            seen.append(walk())
    for _, got, want in seen:
        check_names(got, want, "each call site's line")
    check(seen[0][1][1] != seen[1][1][1], "two call sites in one function: two lines")
    check(seen[0][1] == seen[2][1], "the same call site again: the same names")


def gen():
    yield walk()


def case_generator_frame():
    _, got, want = next(gen())
    check_names(got, want, "a generator's frame")
    check(got[1].startswith("gen ("), "the generator is the walk's caller")


def case_other_thread():
    result = {}

    def body():
        result["walk"] = walk()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    _, got, want = result["walk"]
    check_names(got, want, "a thread's own frames")
    check(not any(n.startswith("case_other_thread (") for n in got),
          "another thread's walk has none of the main thread's frames")


def deep(n):
    if n == 0:
        return walk()
    return deep(n - 1)


def case_deep_stack_keeps_innermost():
    _, got, want = deep(30)
    check(len(got) == MAX, "a deep stack gives %d frames (got %d)" % (MAX, len(got)))
    check_names(got, want, "a deep stack's innermost frames")


def case_new_code_objects_are_named_anew():
    # Code objects made and freed one after another: a new one may take a
    # freed one's address; a name cached without the GIL must not be reused
    # for it.
    for i in range(200):
        scope = {"walk": walk}
        exec(compile("def f_%d():\n    return walk()\n" % i, "<gen %d>" % i, "exec"), scope)
        _, got, want = scope["f_%d" % i]()
        check_names(got[:2], want[:2], "a fresh function's frame (%d)" % i)
        del scope
        gc.collect()
        if FAILURES:
            break


def bench():
    def at_depth(n, kind):
        if n == 0:
            return LIBS[kind].probe_walk_ns(200000)
        return at_depth(n - 1, kind)

    for kind in ("nogil", "gil"):
        for depth in (1, 10):
            best = min(at_depth(depth, kind) for _ in range(5))
            print("walk %-5s %2d frames below the test: %.1f ns" % (kind, depth, best))


def main():
    global LIBS
    if sys.version_info < (3, 12):
        print("skipped: Python %d.%d reads no frames (3.12 and later)" % sys.version_info[:2])
        return 77
    LIBS = load(sys.argv[1])
    if "--bench" in sys.argv:
        bench()
        return 0
    cases = [v for k, v in sorted(globals().items()) if k.startswith("case_")]
    for case in cases:
        case()
    print("%d cases, %d failures (Python %s)" % (len(cases), len(FAILURES), sys.version.split()[0]))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
