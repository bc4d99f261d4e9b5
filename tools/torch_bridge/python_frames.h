// The calling thread's Python frames, for the PyTorch bridge (bridge.cpp,
// whose opening comment says when and why they are read without the GIL)
// and for tests/python/python_frames_probe.cpp, which checks and times the
// walk without torch. Needs <Python.h>; 3.12 and later only (before, no
// frames).
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace allocscope::pyframes {

// Names one frame: allocscope_python_frame's signature (0: not named).
using PythonFrame = uint64_t (*)(const char* function, const char* file, int line);

// Python frames kept per allocation, innermost first.
inline constexpr size_t kPythonFrames = 16;

#if PY_VERSION_HEX >= 0x030C0000
// (code object, instruction offset) -> the interposer's pseudo-address of
// its "function (file:line)". Keyed by the offset, not the line: the line is
// decoded from the code's location table only once per call site.
struct FrameKey {
    const void* code;
    int lasti;
    bool operator==(const FrameKey&) const = default;
};
struct FrameKeyHash {
    size_t operator()(const FrameKey& k) const noexcept {
        return std::hash<const void*>()(k.code) * 31 + static_cast<size_t>(k.lasti);
    }
};
// What a cached name was made from: a hit whose code object no longer
// matches (its address reused by another code object) is named again.
struct FrameName {
    uint64_t address;
    const void* qualname;
    const void* filename;
    int first_line;
    bool pinned;  // holds a reference to the code object: the address cannot be reused
};
using FrameNames = std::unordered_map<FrameKey, FrameName, FrameKeyHash>;

#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
// The head of CPython's _PyInterpreterFrame (Include/internal/
// pycore_frame.h) in 3.12 and 3.13, the fields read here: the code object
// (3.13: f_executable, a code object for every frame the walk names),
// the calling frame, the instruction pointer (3.12: prev_instr, the unit
// before the next instruction; 3.13: instr_ptr, the one executing) and
// who owns the frame.
// One unit of bytecode (CPython's _Py_CODEUNIT, internal from 3.13 on).
using CodeUnit = uint16_t;

// The first unit of `code`'s bytecode (CPython's _PyCode_CODE, likewise).
inline const CodeUnit* first_unit(const PyCodeObject* code) noexcept {
    return reinterpret_cast<const CodeUnit*>(code->co_code_adaptive);
}

struct RawFrame {
    PyObject* code;
    RawFrame* previous;
    PyObject* funcobj;
    PyObject* globals;
    PyObject* builtins;
    PyObject* locals;
    PyFrameObject* frame_obj;
    const CodeUnit* instr;
    int stacktop;
    uint16_t return_offset;
    char owner;
};
static_assert(sizeof(void*) != 8 ||
                  (offsetof(RawFrame, instr) == 56 && offsetof(RawFrame, owner) == 70),
              "RawFrame must match CPython's 64-bit _PyInterpreterFrame layout");
inline constexpr char kOwnedByGenerator = 1;
inline constexpr char kOwnedByCStack = 3;  // a shim frame of the interpreter's, not Python code

inline RawFrame* current_raw_frame(PyThreadState* ts) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return reinterpret_cast<RawFrame*>(ts->current_frame);
#else
    return ts->cframe ? reinterpret_cast<RawFrame*>(ts->cframe->current_frame) : nullptr;
#endif
}

// The UTF-8 text of `s` without making anything: ASCII strings are their
// own UTF-8, others only when CPython already has their UTF-8 form.
inline const char* utf8_without_gil(PyObject* s) noexcept {
    if (!s || !PyUnicode_Check(s)) return "?";
    if (PyUnicode_IS_COMPACT_ASCII(s)) return static_cast<const char*>(PyUnicode_DATA(s));
    if (PyUnicode_IS_COMPACT(s)) {
        const char* utf8 = reinterpret_cast<PyCompactUnicodeObject*>(s)->utf8;
        if (utf8) return utf8;
    }
    return "?";
}

#define ALLOCSCOPE_RAW_PYTHON_FRAMES 1
#endif

// Whether a name cached for the code object at `code`'s address was made
// from `code` itself.
inline bool same_code(const FrameName& n, const PyCodeObject* code) noexcept {
    return n.pinned || (n.qualname == code->co_qualname && n.filename == code->co_filename &&
                        n.first_line == code->co_firstlineno);
}

// A thread's names: by (code object, offset), and the code objects it
// holds a reference to (pinned: their addresses cannot be reused, so a name
// cached for one is checked without reading the code object, which a
// training step has long evicted from the caches by the next allocation).
//
// With the raw walk, also the thread's last walk by position: consecutive
// allocations share their outer frames (the training loop, the module
// calls), which then skip the hash table. What a position's check reads
// first is packed (24 bytes a frame); what an unpinned one compares with
// its code object comes apart.
struct MemoFrame {
    const void* code = nullptr;
    int lasti = 0;
    bool pinned = false;
    uint64_t address = 0;
};
struct MemoCheck {
    const void* qualname = nullptr;
    const void* filename = nullptr;
    int first_line = 0;
};

struct ThreadNames {
    FrameNames names;
    std::unordered_set<const void*> pinned;
    MemoFrame memo[kPythonFrames];
    MemoCheck memo_check[kPythonFrames];
    uint32_t quiet_pins = 0;    // pins in a row that pinned nothing new (pin_python_frames)
    uint32_t skipped_pins = 0;  // calls since pins went quiet

    // Takes a reference to `code` (the GIL is held) and marks every name
    // cached for it pinned, the last walk's included. A name cached at its
    // address for another code object that lived there before is not
    // `code`'s: it stays unpinned (and is named again when met), and the
    // last walk forgets it.
    void pin(PyCodeObject* code) {
        if (!pinned.insert(code).second) return;
        Py_INCREF(code);
        for (auto& [key, name] : names)
            if (key.code == code && same_code(name, code)) name.pinned = true;
        for (size_t n = 0; n < kPythonFrames; ++n) {
            if (memo[n].code != code) continue;
            const MemoCheck& c = memo_check[n];
            if (c.qualname == code->co_qualname && c.filename == code->co_filename &&
                c.first_line == code->co_firstlineno)
                memo[n].pinned = true;
            else
                memo[n] = {};
        }
    }
    void remember(size_t n, const FrameKey& key, const FrameName& name) noexcept {
        memo[n] = {key.code, key.lasti, name.pinned, name.address};
        memo_check[n] = {name.qualname, name.filename, name.first_line};
    }
};

// The name of (code, lasti), from the thread's cache or made now (address
// 0, and nothing cached, where the interposer could not name it). `gil`: the calling
// thread holds the GIL (the name may pin the code object). The reference
// stays valid: unordered_map never moves its elements, and a name is never
// erased once made.
inline const FrameName& frame_name(ThreadNames& thread, PyCodeObject* code, int lasti, bool gil,
                                   PythonFrame name_frame) {
    const FrameKey key{code, lasti};
    auto [it, inserted] = thread.names.try_emplace(key);
    FrameName& cached = it->second;
    if (!inserted && same_code(cached, code)) {
        if (gil && !cached.pinned) thread.pin(code);  // later walks read nothing of it
        return cached;
    }
    const char* function = "?";
    const char* file = "?";
    if (gil) {
        function = PyUnicode_AsUTF8(code->co_qualname);
        file = PyUnicode_AsUTF8(code->co_filename);
        if (!function || !file) PyErr_Clear();
    } else {
#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
        function = utf8_without_gil(code->co_qualname);
        file = utf8_without_gil(code->co_filename);
#endif  // else not reached: without the raw walk, frames need the GIL
    }
    const uint64_t address =
        name_frame(function ? function : "?", file ? file : "?", PyCode_Addr2Line(code, lasti));
    if (address == 0) {  // not recording (yet): named again next time
        static const FrameName unnamed{};
        if (inserted) thread.names.erase(it);
        return unnamed;
    }
    // A code object at a pinned address is the one pinned (its reference
    // keeps it); a name made for another object at that address before the
    // pin (not the same code, above) is named again here, pinned.
    const bool pinned = thread.pinned.count(code) != 0;
    cached = {address, code->co_qualname, code->co_filename, code->co_firstlineno, pinned};
    if (gil && !pinned) thread.pin(code);
    return cached;
}

#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
inline ThreadNames& thread_names() {
    thread_local ThreadNames names;
    return names;
}

// The calling thread's frames read without the GIL (see the note at the
// top). `gil`: the thread holds it, so new names may pin code objects.
// `remember`: the walk becomes the thread's last one (pin_python_frames'
// walks, made from another place than allocations, do not).
inline size_t python_frames_raw(uint64_t* out, PythonFrame name_frame, bool gil,
                                bool remember = true) {
    // With the GIL, the current thread state (a program may have swapped
    // in another); without it, the one Python keeps for this thread.
    PyThreadState* ts = gil ? PyThreadState_Get() : PyGILState_GetThisThreadState();
    if (!ts) return 0;  // a thread Python has never run on
    ThreadNames& thread = thread_names();
    size_t n = 0;
    for (RawFrame* f = current_raw_frame(ts); f && n < kPythonFrames; f = f->previous) {
        if (f->owner == kOwnedByCStack || !f->code) continue;
        auto* code = reinterpret_cast<PyCodeObject*>(f->code);
        const CodeUnit* first = first_unit(code);  // an address: nothing read yet
        const int lasti = static_cast<int>(f->instr - first) * static_cast<int>(sizeof(CodeUnit));
        // The frame at this position last time, checked then: a pinned code
        // object is that same object (nothing of it need be read); another
        // is if it still has that name, file and first line (with the GIL,
        // it is pinned below instead). Either way its frame had started
        // (the check below is a constant of the code object).
        if (const MemoFrame& m = thread.memo[n];
            m.code == code && m.lasti == lasti && m.address != 0 &&
            (m.pinned || (!gil && Py_TYPE(f->code) == &PyCode_Type &&
                          thread.memo_check[n].qualname == code->co_qualname &&
                          thread.memo_check[n].filename == code->co_filename &&
                          thread.memo_check[n].first_line == code->co_firstlineno))) {
            out[n] = m.address;
            ++n;
            continue;
        }
        const FrameKey key{code, lasti};
        // A pinned name of this (code, offset): that same code object, whose
        // type and start were checked when the name was made.
        const FrameName* name = nullptr;
        if (auto it = thread.names.find(key); it != thread.names.end() && it->second.pinned) {
            name = &it->second;
        } else {
            if (Py_TYPE(f->code) != &PyCode_Type) continue;
            // Frames not yet started (before their first traceable
            // instruction) are skipped, as CPython's own tracebacks do.
            if (f->owner != kOwnedByGenerator && f->instr < first + code->_co_firsttraceable)
                continue;
            name = &frame_name(thread, code, lasti, gil, name_frame);
        }
        if (name->address) {
            if (remember) thread.remember(n, key, *name);
            out[n++] = name->address;
        }
    }
    return n;
}

// With the GIL held: names the calling thread's frames and pins their code
// objects, so that the walks of later allocations under these frames (made
// without the GIL, in operators) check their names without reading the code
// objects. The module hooks call it (tag_hooks.cpp): the frames of the
// module calls and the training loop are under every allocation of a step.
// A training loop calls the same modules from the same lines every step:
// once kQuietPins pins in a row have found nothing new, a thread pins only
// at every kQuietPins-th call (a new path, an evaluation loop, is still
// found, a little later), so that the module hooks stop paying for a walk
// that pins nothing.
inline constexpr uint32_t kQuietPins = 64;

inline void pin_python_frames(PythonFrame name_frame) {
    if (!Py_IsInitialized() || !PyGILState_Check()) return;
    ThreadNames& thread = thread_names();
    if (thread.quiet_pins >= kQuietPins && ++thread.skipped_pins % kQuietPins != 0) return;
    const size_t pinned = thread.pinned.size();
    uint64_t frames[kPythonFrames];
    python_frames_raw(frames, name_frame, true, false);
    if (thread.pinned.size() != pinned)
        thread.quiet_pins = 0;
    else if (thread.quiet_pins < kQuietPins)
        ++thread.quiet_pins;
}
#endif

// The calling thread's Python frames, innermost first. Called with the
// allocator's lock held.
inline size_t python_frames(uint64_t* out, PythonFrame name_frame) {
    if (!Py_IsInitialized()) return 0;
    const bool gil = PyGILState_Check() != 0;
#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
    return python_frames_raw(out, name_frame, gil);
#else
    if (!gil) return 0;
    thread_local ThreadNames names;
    size_t n = 0;
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    while (frame && n < kPythonFrames) {
        PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
        if (const uint64_t address =
                frame_name(names, code, PyFrame_GetLasti(frame), true, name_frame).address)
            out[n++] = address;
        Py_DECREF(code);
        PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return n;
#endif
}
#endif

}  // namespace allocscope::pyframes
