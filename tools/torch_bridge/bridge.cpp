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
// Python frames. When the allocating thread holds the GIL (a tensor made by
// Python code; autograd's backward threads mostly do not), an ALLOC also
// carries the Python frames that led to it (at most kPythonFrames, innermost
// first): allocscope_block_alloc_frames appends them to the native stack the
// interposer captures, so a report shows the C++ site and the Python line.
// Each (code object, instruction offset) is named once through
// allocscope_python_frame and cached per thread, holding a reference to the code object so its
// address is never reused for another. Only on Python >= 3.12, where creating a frame object cannot
// run the garbage collector on the spot (it is deferred to the interpreter's next safe point): a
// collection here could free tensors inside the allocator. ALLOCSCOPE_PYTHON_STACKS=0 turns it off.
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
using BlockAllocFrames = void (*)(void*, size_t, int, void*, const uint64_t*, size_t);
using PythonFrame = uint64_t (*)(const char*, const char*, int);
using BlockFree = void (*)(void*);

std::atomic<BlockAlloc> g_block_alloc{nullptr};
std::atomic<BlockAllocFrames> g_block_alloc_frames{nullptr};
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
                     "frames); %llu block allocs, %llu ns each in the interposer; %llu block "
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

// The calling thread's Python frames, innermost first; 0 frames without the
// GIL. Called with the allocator's lock held: only reads the frame chain
// and names each (code, instruction offset) once.
size_t python_frames(uint64_t* out, PythonFrame name_frame) {
    if (!Py_IsInitialized() || !PyGILState_Check()) return 0;
    thread_local std::unordered_map<FrameKey, uint64_t, FrameKeyHash> names;
    size_t n = 0;
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    while (frame && n < kPythonFrames) {
        PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
        const FrameKey key{code, PyFrame_GetLasti(frame)};
        auto it = names.find(key);
        if (it == names.end()) {
            const char* function = PyUnicode_AsUTF8(code->co_qualname);
            const char* file = PyUnicode_AsUTF8(code->co_filename);
            if (!function || !file) PyErr_Clear();
            const uint64_t address = name_frame(function ? function : "?", file ? file : "?",
                                                PyFrame_GetLineNumber(frame));
            Py_INCREF(code);  // kept: the address of a cached code object is never reused
            it = names.emplace(key, address).first;
        }
        Py_DECREF(code);
        if (it->second) out[n++] = it->second;
        PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return n;
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
#if PY_VERSION_HEX >= 0x030C0000
        BlockAllocFrames with_frames = g_block_alloc_frames.load(std::memory_order_relaxed);
        PythonFrame name_frame = g_python_frame.load(std::memory_order_relaxed);
        if (with_frames && name_frame) {
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
            timed(g_cost.allocs, g_cost.alloc_ns,
                  [&] { with_frames(addr, size, device, stream, frames, n); });
            return;
        }
#endif
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
        const std::string name = a->name();
        if (name == "cudaMallocAsync") return 1;
        int expected = 0;
        if (!g_attached.compare_exchange_strong(expected, 1)) return 2;
        g_block_alloc.store(
            reinterpret_cast<BlockAlloc>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc")));
        g_block_free.store(
            reinterpret_cast<BlockFree>(dlsym(RTLD_DEFAULT, "allocscope_block_free")));
        const char* py_stacks = std::getenv("ALLOCSCOPE_PYTHON_STACKS");
        const char* depth = std::getenv("ALLOCSCOPE_STACK_DEPTH");
        const bool python_stacks = !(py_stacks && std::strcmp(py_stacks, "0") == 0) &&
                                   !(depth && std::strcmp(depth, "0") == 0);
        if (python_stacks) {
            g_block_alloc_frames.store(reinterpret_cast<BlockAllocFrames>(
                dlsym(RTLD_DEFAULT, "allocscope_block_alloc_frames")));
            g_python_frame.store(
                reinterpret_cast<PythonFrame>(dlsym(RTLD_DEFAULT, "allocscope_python_frame")));
        }
        const char* log = std::getenv("ALLOCSCOPE_LOG");
        g_cost.on = log && std::strcmp(log, "debug") == 0;
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
