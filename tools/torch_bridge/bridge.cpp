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
//                       like the allocator's round_size, device, stream), or
//                       allocscope_block_alloc_in_pool(..., pool id) for a
//                       block of any other pool than the default (pool_of)
//   FREE_REQUESTED   -> allocscope_block_free(addr): the moment
//                       memory_allocated() drops (the block's stats are
//                       decreased right before this entry is recorded); a
//                       block still in use by another stream (record_stream)
//                       is only reused after FREE_COMPLETED, so no later
//                       ALLOC of the address can precede this free
//   FREE_COMPLETED   -> ignored (the free was reported at FREE_REQUESTED)
//   SEGMENT_*        -> ignored: cudaMalloc/cudaFree and cuMemMap/cuMemUnmap
//                       are recorded at the runtime/driver level already
//   OOM              -> allocscope_block_oom(size, device, stream, addr): the
//                       allocator gave up on the request after freeing its
//                       cache and retrying (the failed cudaMalloc calls
//                       before it are recorded at the runtime level); PyTorch
//                       puts the device's free bytes (cudaMemGetInfo) in addr_
//   SNAPSHOT         -> ignored
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
// C API (loaded by allocscope/torch/_bridge.py with ctypes after CUDA is initialized):
//   int allocscope_torch_bridge_attach(char* error, size_t error_size)
//     0: attached; 1: not needed (the cudaMallocAsync backend: every tensor
//     is a runtime-API call); 2: already attached; -1: failed, the reason in
//     `error` (the allocator refused, e.g. a pluggable allocator).
//   int allocscope_torch_bridge_counters(int device)
//     passes the allocator's counters of `device` (allocated and reserved
//     bytes, what torch.cuda.memory_stats calls allocated_bytes.all.current
//     and reserved_bytes.all.current) and the driver's count of device
//     memory in use (cudaMemGetInfo on the current device, as
//     torch.cuda.mem_get_info) to allocscope_allocator_counters, the
//     report's self-check. 0: passed; -1: not (no interposer, the allocator
//     or the driver refused). The optimizer's step hook calls it once a
//     step; from Python, memory_stats builds a dict of every statistic,
//     about 0.2 ms a step.
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
#include <cuda_runtime_api.h>

#include "config_text.h"
#include "per_step.h"
#include "python_frames.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unordered_map>
#include <utility>

#define ALLOCSCOPE_BRIDGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace allocscope::torch_bridge {
extern std::atomic<bool> g_tensors_visible;  // provenance.cpp: set when attached here
extern std::atomic<void (*)() noexcept> g_pin_python_frames;  // tag_hooks.cpp
}  // namespace allocscope::torch_bridge

namespace {

using allocscope::pyframes::PythonFrame;
#if PY_VERSION_HEX >= 0x030C0000
using allocscope::pyframes::kPythonFrames;
using allocscope::pyframes::python_frames;
#endif
using BlockAlloc = void (*)(void*, size_t, int, void*);
using BlockAllocInPool = void (*)(void*, size_t, int, void*, uint64_t, uint64_t);
using BlockFree = void (*)(void*);
using BlockOom = void (*)(size_t, int, void*, uint64_t);

std::atomic<BlockAlloc> g_block_alloc{nullptr};
std::atomic<BlockAllocInPool> g_block_alloc_in_pool{nullptr};
std::atomic<PythonFrame> g_python_frame{nullptr};
std::atomic<BlockFree> g_block_free{nullptr};
std::atomic<BlockOom> g_block_oom{nullptr};
std::atomic<int> g_attached{0};

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
        const std::string per_step = allocscope::torch_bridge::per_step_text(alloc_ns + free_ns);
        std::fprintf(stderr,
                     "allocscope: PyTorch bridge: %llu Python frame walks, %llu ns each (%llu "
                     "frames); %llu block allocs, %llu ns each in the interposer (Python frame "
                     "walks included); %llu block "
                     "frees, %llu ns each%s\n",
                     static_cast<unsigned long long>(walks.load()), avg(walk_ns, walks),
                     static_cast<unsigned long long>(frames.load()),
                     static_cast<unsigned long long>(allocs.load()), avg(alloc_ns, allocs),
                     static_cast<unsigned long long>(frees.load()), avg(free_ns, frees),
                     per_step.c_str());
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

// The pool a block was allocated in, (0, 0) for the allocator's default
// one. The caching allocator's pool ids are pairs: (n, 0) the pool a
// capture made for itself; (0, n) torch.cuda.graph_pool_handle()'s (the
// pools inductor's CUDA graph trees capture into) and torch.cuda.MemPool's
// alike. The interposer tells them apart (allocscope_block_alloc_in_pool:
// the shim declares the graphs' pools). Torch before the field: (0, 0).
template <class Entry>
std::pair<uint64_t, uint64_t> pool_of(const Entry& e) noexcept {
    if constexpr (requires(const Entry& x) { x.mempool_.first; }) {
        return {static_cast<uint64_t>(e.mempool_.first), static_cast<uint64_t>(e.mempool_.second)};
    } else {
        return {0, 0};
    }
}

// One trace entry. Generic over the entry type so that it compiles against
// the TraceEntry of any PyTorch version that has the tracker (the fields
// action_, addr_, size_, stream_ and, since 2.4, device_).
template <class Entry>
void on_entry(const Entry& e) noexcept {
    using Action = typename Entry::Action;
    const Action action = e.action_;
    int device = 0;
    if constexpr (requires(const Entry& x) { x.device_; }) device = static_cast<int>(e.device_);
    void* stream = nullptr;
    if constexpr (std::is_pointer_v<std::decay_t<decltype(e.stream_)>>)
        stream = reinterpret_cast<void*>(e.stream_);
    if (action == Action::ALLOC) {
        void* addr = reinterpret_cast<void*>(static_cast<uintptr_t>(e.addr_));
        const size_t size = rounded(static_cast<size_t>(e.size_));
        // Python frames come from outer_frames, which the interposer calls.
        const std::pair<uint64_t, uint64_t> pool = pool_of(e);
        BlockAllocInPool in_pool = g_block_alloc_in_pool.load(std::memory_order_relaxed);
        BlockAlloc alloc = g_block_alloc.load(std::memory_order_relaxed);
        if ((pool.first != 0 || pool.second != 0) && in_pool) {
            timed(g_cost.allocs, g_cost.alloc_ns,
                  [&] { in_pool(addr, size, device, stream, pool.first, pool.second); });
        } else if (alloc) {
            timed(g_cost.allocs, g_cost.alloc_ns, [&] { alloc(addr, size, device, stream); });
        }
    } else if (action == Action::OOM) {
        // Python frames come from outer_frames, as for blocks.
        if (BlockOom oom = g_block_oom.load(std::memory_order_relaxed))
            oom(static_cast<size_t>(e.size_), device, stream, static_cast<uint64_t>(e.addr_));
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

// The module hooks' pin of the calling thread's frames (GIL held).
void pin_frames() noexcept {
#ifdef ALLOCSCOPE_RAW_PYTHON_FRAMES
    const PythonFrame name_frame = g_python_frame.load(std::memory_order_relaxed);
    if (!name_frame) return;
    try {
        allocscope::pyframes::pin_python_frames(name_frame);
    } catch (...) {  // out of host memory in the cache: not pinned
    }
#endif
}

// Once, whatever the allocator: Python frames for blocks (on_entry) and,
// through the interposer's provider hook, for its own allocations. Off with
// ALLOCSCOPE_PYTHON_STACKS=0 or ALLOCSCOPE_STACK_DEPTH=0.
void provide_python_frames() {
    static std::atomic<bool> done{false};
    if (done.exchange(true)) return;
    using allocscope::torch_bridge::config_text;
    g_cost.on = config_text("ALLOCSCOPE_LOG") == "debug";
    const bool python_stacks = config_text("ALLOCSCOPE_PYTHON_STACKS") != "0" &&
                               config_text("ALLOCSCOPE_STACK_DEPTH") != "0";
    if (!python_stacks) return;
    g_python_frame.store(
        reinterpret_cast<PythonFrame>(dlsym(RTLD_DEFAULT, "allocscope_python_frame")));
    using SetOuterFrames = void (*)(size_t(*)(uint64_t*, size_t));
    if (auto set =
            reinterpret_cast<SetOuterFrames>(dlsym(RTLD_DEFAULT, "allocscope_set_outer_frames"));
        set && g_python_frame.load()) {
        set(outer_frames);
        allocscope::torch_bridge::g_pin_python_frames.store(pin_frames);
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
        provide_python_frames();
        const std::string name = a->name();
        if (name == "cudaMallocAsync") {
            allocscope::torch_bridge::g_tensors_visible.store(true);
            return 1;
        }
        int expected = 0;
        if (!g_attached.compare_exchange_strong(expected, 1)) return 2;
        g_block_alloc.store(
            reinterpret_cast<BlockAlloc>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc")));
        g_block_alloc_in_pool.store(reinterpret_cast<BlockAllocInPool>(
            dlsym(RTLD_DEFAULT, "allocscope_block_alloc_in_pool")));
        g_block_free.store(
            reinterpret_cast<BlockFree>(dlsym(RTLD_DEFAULT, "allocscope_block_free")));
        g_block_oom.store(reinterpret_cast<BlockOom>(dlsym(RTLD_DEFAULT, "allocscope_block_oom")));
        try {
            a->attachAllocatorTraceTracker([](const auto& entry) { on_entry(entry); });
        } catch (...) {
            g_attached.store(0);
            throw;
        }
        allocscope::torch_bridge::g_tensors_visible.store(true);
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

ALLOCSCOPE_BRIDGE_EXPORT int allocscope_torch_bridge_counters(int device) {
    using Counters = void (*)(int, uint64_t, uint64_t, uint64_t);
    static const auto counters =
        reinterpret_cast<Counters>(dlsym(RTLD_DEFAULT, "allocscope_allocator_counters"));
    if (!counters || device < 0) return -1;
    try {
        const auto stats =
            c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
        // Index 0 of each statistic is StatType::AGGREGATE ("all") in every
        // torch that has the tracker; the enum's namespace moved in 2.5.
        const int64_t allocated = stats.allocated_bytes[0].current;
        const int64_t reserved = stats.reserved_bytes[0].current;
        size_t free = 0, total = 0;
        uint64_t used = 0;
        if (cudaMemGetInfo(&free, &total) == cudaSuccess)
            used = total - free;
        else
            (void)cudaGetLastError();  // leave no error behind for the program
        counters(device, static_cast<uint64_t>(allocated < 0 ? 0 : allocated),
                 static_cast<uint64_t>(reserved < 0 ? 0 : reserved), used);
        return 0;
    } catch (...) {
        return -1;
    }
}
