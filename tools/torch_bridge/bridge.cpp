// The PyTorch bridge: per-tensor block events from PyTorch's native CUDA
// caching allocator.
//
// Under the native allocator only whole segments reach the CUDA runtime (see
// docs/BUILD-NOTES in the shared docs); tensors are carved out of them
// invisibly. The allocator's trace tracker
// (c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker) calls back,
// under the per-device allocator lock, for every allocator action; this
// library turns them into the interposer's block events:
//
//   ALLOC            -> allocscope_block_alloc(addr, size rounded up to 512 B
//                       like the allocator's round_size, device, stream)
//   FREE_REQUESTED   -> allocscope_block_free(addr): the moment
//                       memory_allocated() drops (the block's stats are
//                       decreased right before this entry is recorded); a
//                       block still in use by another stream (record_stream)
//                       is only reused after FREE_COMPLETED, so no later
//                       ALLOC of the address can precede this free
//   FREE_COMPLETED   -> ignored (the free was reported at FREE_REQUESTED)
//   SEGMENT_*        -> ignored: cudaMalloc/cudaFree and cuMemMap/cuMemUnmap
//                       are recorded at the runtime/driver level already
//   OOM, SNAPSHOT    -> ignored (the failed cudaMalloc is recorded as oom)
//
// The interposer entry points are looked up with dlsym, so the bridge loads
// (and does nothing) without the interposer. The callback never throws and
// never touches torch.
//
// Python frames. The bridge registers outer_frames with the interposer
// (allocscope_set_outer_frames), which calls it for every allocation it
// records without frames of its own, the blocks above included, and
// appends the Python frames that led to it (at most kPythonFrames,
// innermost first) to the native stack it captures, so a report shows the
// C++ site and the Python line. Most tensors are made with the
// GIL released (PyTorch's Python bindings drop it around every operator
// call), so on Python 3.12 and 3.13 the frames are read without it, from
// the calling thread's own interpreter frames: while this thread is inside
// the allocator it runs no Python, so its frame chain cannot change, and
// every code object on it is kept alive by its frame. That walk only reads
// (no reference counts, no objects made, no allocation by Python), never
// takes the GIL (the allocator's lock is held here; waiting for the GIL
// under it could deadlock with a thread that holds the GIL and wants the
// lock), and follows the layout of CPython's _PyInterpreterFrame of those
// versions (RawFrame below). Elsewhere (3.14 and later) frames come only
// when the thread holds the GIL, through the public frame API, which on
// >= 3.12 cannot run the garbage collector on the spot. Each
// (code object, instruction offset) is named once through
// allocscope_python_frame and cached per thread; a cached name is used
// again only while the code object at that address still has the same
// qualified name, file and first line (or, named with the GIL held, holds
// a reference that keeps the address from being reused).
// ALLOCSCOPE_PYTHON_STACKS=0 turns this off.
//
// C API (loaded by allocscope/torch.py with ctypes after CUDA is initialized):
//   int allocscope_torch_bridge_attach(char* error, size_t error_size)
//     0: attached; 1: not needed (the cudaMallocAsync backend: every tensor
//     is a runtime-API call); 2: already attached; -1: failed, the reason in
//     `error` (the allocator refused, e.g. a pluggable allocator).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

#include <Python.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unordered_map>
#include <utility>

#define ALLOCSCOPE_BRIDGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using BlockAlloc = void (*)(void*, size_t, int, void*);
using PythonFrame = uint64_t (*)(const char*, const char*, int);
using BlockFree = void (*)(void*);

std::atomic<BlockAlloc> g_block_alloc{nullptr};
std::atomic<PythonFrame> g_python_frame{nullptr};
std::atomic<BlockFree> g_block_free{nullptr};
std::atomic<int> g_attached{0};

constexpr size_t kPythonFrames = 16;

uint64_t mono_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ALLOCSCOPE_LOG=debug: what each part of a trace entry costs the allocating
// thread, one line at exit.
struct EntryCost {
    bool on = false;  // set before the tracker is attached, read-only after
    std::atomic<uint64_t> walks{0}, frames{0}, walk_ns{0};  // Python frame walks
    std::atomic<uint64_t> allocs{0}, alloc_ns{0};           // interposer: block alloc
    std::atomic<uint64_t> frees{0}, free_ns{0};             // interposer: block free
    static unsigned long long avg(uint64_t ns, uint64_t n) { return n ? ns / n : 0; }
    ~EntryCost() {
        if (!on) return;
        std::fprintf(stderr,
                     "allocscope: PyTorch bridge: %llu Python frame walks, %llu ns each (%llu "
                     "frames); %llu block allocs, %llu ns each in the interposer (Python frame "
                     "walks included); %llu block "
                     "frees, %llu ns each\n",
                     static_cast<unsigned long long>(walks.load()), avg(walk_ns, walks),
                     static_cast<unsigned long long>(frames.load()),
                     static_cast<unsigned long long>(allocs.load()), avg(alloc_ns, allocs),
                     static_cast<unsigned long long>(frees.load()), avg(free_ns, frees));
    }
};
EntryCost g_cost;

// Runs `call`, timing it into (count, ns) when debug costs are on.
template <class Call>
void timed(std::atomic<uint64_t>& count, std::atomic<uint64_t>& ns, Call&& call) {
    if (!g_cost.on) {
        call();
        return;
    }
    const uint64_t start = mono_ns();
    call();
    ns.fetch_add(mono_ns() - start, std::memory_order_relaxed);
    count.fetch_add(1, std::memory_order_relaxed);
}

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
struct RawFrame {
    PyObject* code;
    RawFrame* previous;
    PyObject* funcobj;
    PyObject* globals;
    PyObject* builtins;
    PyObject* locals;
    PyFrameObject* frame_obj;
    _Py_CODEUNIT* instr;
    int stacktop;
    uint16_t return_offset;
    char owner;
};
static_assert(sizeof(void*) != 8 ||
                  (offsetof(RawFrame, instr) == 56 && offsetof(RawFrame, owner) == 70),
              "RawFrame must match CPython's 64-bit _PyInterpreterFrame layout");
constexpr char kOwnedByGenerator = 1;
constexpr char kOwnedByCStack = 3;  // a shim frame of the interpreter's, not Python code

RawFrame* current_raw_frame(PyThreadState* ts) noexcept {
#if PY_VERSION_HEX >= 0x030D0000
    return reinterpret_cast<RawFrame*>(ts->current_frame);
#else
    return ts->cframe ? reinterpret_cast<RawFrame*>(ts->cframe->current_frame) : nullptr;
#endif
}

// The UTF-8 text of `s` without making anything: ASCII strings are their
// own UTF-8, others only when CPython already has their UTF-8 form.
const char* utf8_without_gil(PyObject* s) noexcept {
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
bool same_code(const FrameName& n, const PyCodeObject* code) noexcept {
    return n.pinned || (n.qualname == code->co_qualname && n.filename == code->co_filename &&
                        n.first_line == code->co_firstlineno);
}

// The name of (code, lasti), from the thread's cache or made now (address
// 0, and nothing cached, where the interposer could not name it). `gil`: the calling
// thread holds the GIL (the name may pin the code object). The reference
// stays valid: unordered_map never moves its elements.
const FrameName& frame_name(FrameNames& names, PyCodeObject* code, int lasti, bool gil,
                            PythonFrame name_frame) {
    const FrameKey key{code, lasti};
    auto [it, inserted] = names.try_emplace(key);
    FrameName& cached = it->second;
    if (!inserted && same_code(cached, code)) return cached;
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
        if (inserted) names.erase(it);
        return unnamed;
    }
    const bool pinned = cached.pinned || gil;
    if (gil && !cached.pinned) Py_INCREF(code);  // kept: a pinned code's address is never reused
    cached = {address, code->co_qualname, code->co_filename, code->co_firstlineno, pinned};
    return cached;
}

#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
// The calling thread's frames read without the GIL (see the note at the
// top). `gil`: the thread holds it, so new names may pin code objects.
size_t python_frames_raw(uint64_t* out, PythonFrame name_frame, bool gil) {
    // With the GIL, the current thread state (a program may have swapped
    // in another); without it, the one Python keeps for this thread.
    PyThreadState* ts = gil ? PyThreadState_Get() : PyGILState_GetThisThreadState();
    if (!ts) return 0;  // a thread Python has never run on
    thread_local FrameNames names;
    // The thread's last walk by position: consecutive allocations share
    // their outer frames (the training loop, the module calls), which then
    // skip the hash table.
    thread_local struct {
        FrameKey key[kPythonFrames];
        FrameName name[kPythonFrames];
    } last{};
    size_t n = 0;
    for (RawFrame* f = current_raw_frame(ts); f && n < kPythonFrames; f = f->previous) {
        if (f->owner == kOwnedByCStack || !f->code || Py_TYPE(f->code) != &PyCode_Type) continue;
        auto* code = reinterpret_cast<PyCodeObject*>(f->code);
        const _Py_CODEUNIT* first = _PyCode_CODE(code);
        // Frames not yet started (before their first traceable
        // instruction) are skipped, as CPython's own tracebacks do.
        if (f->owner != kOwnedByGenerator && f->instr < first + code->_co_firsttraceable) continue;
        const int lasti =
            static_cast<int>(f->instr - first) * static_cast<int>(sizeof(_Py_CODEUNIT));
        const FrameKey key{code, lasti};
        if (last.key[n] == key && same_code(last.name[n], code)) {
            out[n] = last.name[n].address;
            ++n;
            continue;
        }
        const FrameName& name = frame_name(names, code, lasti, gil, name_frame);
        if (name.address) {
            last.key[n] = key;
            last.name[n] = name;
            out[n++] = name.address;
        }
    }
    return n;
}
#endif

// The calling thread's Python frames, innermost first. Called with the
// allocator's lock held.
size_t python_frames(uint64_t* out, PythonFrame name_frame) {
    if (!Py_IsInitialized()) return 0;
    const bool gil = PyGILState_Check() != 0;
#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
    return python_frames_raw(out, name_frame, gil);
#else
    if (!gil) return 0;
    thread_local FrameNames names;
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

constexpr size_t kMinBlockSize = 512;  // c10: kMinBlockSize, round_size()

size_t rounded(size_t size) {
    if (size < kMinBlockSize) return kMinBlockSize;
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

void copy_error(const std::string& text, char* error, size_t error_size) {
    if (!error || error_size == 0) return;
    const size_t n = text.size() < error_size - 1 ? text.size() : error_size - 1;
    std::memcpy(error, text.data(), n);
    error[n] = '\0';
}

// One trace entry. Generic over the entry type so that it compiles against
// the TraceEntry of any PyTorch version that has the tracker (the fields
// action_, addr_, size_, stream_ and, since 2.4, device_).
template <class Entry>
void on_entry(const Entry& e) noexcept {
    using Action = typename Entry::Action;
    const Action action = e.action_;
    if (action == Action::ALLOC) {
        int device = 0;
        if constexpr (requires(const Entry& x) { x.device_; }) device = static_cast<int>(e.device_);
        void* stream = nullptr;
        if constexpr (std::is_pointer_v<std::decay_t<decltype(e.stream_)>>)
            stream = reinterpret_cast<void*>(e.stream_);
        void* addr = reinterpret_cast<void*>(static_cast<uintptr_t>(e.addr_));
        const size_t size = rounded(static_cast<size_t>(e.size_));
        // Python frames come from outer_frames, which the interposer calls.
        BlockAlloc alloc = g_block_alloc.load(std::memory_order_relaxed);
        if (alloc)
            timed(g_cost.allocs, g_cost.alloc_ns, [&] { alloc(addr, size, device, stream); });
    } else if (action == Action::FREE_REQUESTED) {
        BlockFree release = g_block_free.load(std::memory_order_relaxed);
        if (!release) return;
        timed(g_cost.frees, g_cost.free_ns,
              [&] { release(reinterpret_cast<void*>(static_cast<uintptr_t>(e.addr_))); });
    }
}

// allocscope_set_outer_frames's provider: the Python frames of allocations
// the interposer records itself (the allocator's segments, every tensor
// under backend:cudaMallocAsync, library workspaces). Runs inside the
// interposer's hook, so it names frames through allocscope_python_frame,
// which works there.
size_t outer_frames(uint64_t* out, size_t max) noexcept {
#if PY_VERSION_HEX >= 0x030C0000
    const PythonFrame name_frame = g_python_frame.load(std::memory_order_relaxed);
    if (!name_frame) return 0;
    uint64_t frames[kPythonFrames];
    size_t n = 0;
    timed(g_cost.walks, g_cost.walk_ns, [&] {
        try {
            n = python_frames(frames, name_frame);
        } catch (...) {  // out of host memory in the cache: no frames
            n = 0;
        }
    });
    if (g_cost.on) g_cost.frames.fetch_add(n, std::memory_order_relaxed);
    n = n < max ? n : max;
    std::memcpy(out, frames, n * sizeof(uint64_t));
    return n;
#else
    (void)out;
    (void)max;
    return 0;
#endif
}

// Once, whatever the allocator: Python frames for blocks (on_entry) and,
// through the interposer's provider hook, for its own allocations. Off with
// ALLOCSCOPE_PYTHON_STACKS=0 or ALLOCSCOPE_STACK_DEPTH=0.
void provide_python_frames() {
    static std::atomic<bool> done{false};
    if (done.exchange(true)) return;
    const char* log = std::getenv("ALLOCSCOPE_LOG");
    g_cost.on = log && std::strcmp(log, "debug") == 0;
    const char* py_stacks = std::getenv("ALLOCSCOPE_PYTHON_STACKS");
    const char* depth = std::getenv("ALLOCSCOPE_STACK_DEPTH");
    const bool python_stacks = !(py_stacks && std::strcmp(py_stacks, "0") == 0) &&
                               !(depth && std::strcmp(depth, "0") == 0);
    if (!python_stacks) return;
    g_python_frame.store(
        reinterpret_cast<PythonFrame>(dlsym(RTLD_DEFAULT, "allocscope_python_frame")));
    using SetOuterFrames = void (*)(size_t(*)(uint64_t*, size_t));
    if (auto set =
            reinterpret_cast<SetOuterFrames>(dlsym(RTLD_DEFAULT, "allocscope_set_outer_frames"));
        set && g_python_frame.load())
        set(outer_frames);
}

}  // namespace

ALLOCSCOPE_BRIDGE_EXPORT int allocscope_torch_bridge_attach(char* error, size_t error_size) {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    copy_error("", error, error_size);
    try {
        alloc::CUDAAllocator* a = alloc::get();
        if (!a) {
            copy_error("no CUDA allocator is installed", error, error_size);
            return -1;
        }
        provide_python_frames();
        const std::string name = a->name();
        if (name == "cudaMallocAsync") return 1;
        int expected = 0;
        if (!g_attached.compare_exchange_strong(expected, 1)) return 2;
        g_block_alloc.store(
            reinterpret_cast<BlockAlloc>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc")));
        g_block_free.store(
            reinterpret_cast<BlockFree>(dlsym(RTLD_DEFAULT, "allocscope_block_free")));
        try {
            a->attachAllocatorTraceTracker([](const auto& entry) { on_entry(entry); });
        } catch (...) {
            g_attached.store(0);
            throw;
        }
        return 0;
    } catch (const std::exception& e) {
        // c10::Error derives from std::exception; keep its first line.
        std::string what = e.what();
        if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
        copy_error("attachAllocatorTraceTracker failed: " + what, error, error_size);
    } catch (...) {
        copy_error("attachAllocatorTraceTracker failed", error, error_size);
    }
    return -1;
}
