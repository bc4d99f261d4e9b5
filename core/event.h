// Event model shared by the interposer, the trace format, plugins and tools.
// No CUDA headers here: everything is plain integers so the core builds on
// machines without a CUDA toolkit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace allocscope {

enum class EventKind : uint8_t {
    alloc = 1,  // memory handed out (segment or block level)
    free = 2,   // memory returned; `result` != 0 means the real call failed
    map = 3,    // reserved (never written): driver-level mappings are recorded
    unmap = 4,  // as alloc/free with api cuMemMap/cuMemUnmap, see Api
    // A request that failed; `size` is the request. Level segment: a runtime
    // or driver call failed (`result` is its code; an allocator may free its
    // cache and retry). Level block: the caching allocator gave up on it
    // (allocscope_block_oom), so the program saw an out-of-memory error.
    // `address` is the device's free bytes when it failed, 0 if not known.
    oom = 5,
    tag_push = 6,  // layer/phase entered on thread `tid`
    tag_pop = 7,   // layer/phase left on thread `tid`
    step = 8,      // the training step counter changed to `step`
    param = 9,     // a parameter was registered; `aux` indexes the param table
    mark = 10,     // user note; `aux` is the interned text
    // The allocation at `address` holds bytes computed from a parameter
    // (provenance: a quantized copy, a transpose, a scale): `aux` indexes the
    // param table, `stream` is the interned derivation text ("layers.3.fc1.
    // weight -> abs -> amax -> _to_copy"), 0 for none. Format version 3.
    derived = 11,
};
inline constexpr int kEventKindCount = 11;

// Where the event was observed. The sum of live segments approximates
// "reserved" memory, the sum of live blocks approximates "allocated".
enum class Level : uint8_t {
    none = 0,  // tag/step/param/mark events
    segment = 1,
    block = 2,
};

enum class MemoryKind : uint8_t {
    none = 0,
    device = 1,
    managed = 2,
    host_pinned = 3,
    // Driver virtual memory management. A `physical` allocation is a
    // cuMemCreate handle (address = the handle value, not a pointer); it holds
    // memory but is reachable only through mappings, which are recorded as
    // device segments (api cuMemMap). An `address_range` is a VA reservation
    // (cuMemAddressReserve) and holds no memory. Both are accounted in pools
    // of their own so mapped bytes are never counted twice.
    physical = 4,
    address_range = 5,
};
inline constexpr int kMemoryKindMax = 5;

// The API entry point that produced the event.
enum class Api : uint8_t {
    none = 0,
    cudaMalloc,
    cudaFree,
    cudaMallocAsync,
    cudaMallocAsync_ptsz,
    cudaFreeAsync,
    cudaFreeAsync_ptsz,
    cudaMallocFromPoolAsync,
    cudaMallocFromPoolAsync_ptsz,
    cudaMallocManaged,
    cudaMallocPitch,
    cudaMallocHost,
    cudaHostAlloc,
    cudaFreeHost,
    block_alloc,  // allocscope_block_alloc (caching-allocator hook ABI)
    block_free,   // allocscope_block_free
    c_api,        // allocscope_push/pop/step/register_param/mark
    // Driver entry points (interposer/hooks_driver.cpp). Appended: the trace
    // stores the numeric value.
    cuMemAlloc_v2,
    cuMemAllocPitch_v2,
    cuMemFree_v2,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemAllocManaged,
    cuMemCreate,          // physical allocation (MemoryKind::physical)
    cuMemRelease,         // ...its release
    cuMemMap,             // a mapping: a device segment at the mapped VA
    cuMemUnmap,           // ...removed (one free per mapping the range covers)
    cuMemAddressReserve,  // VA reservation (MemoryKind::address_range)
    cuMemAddressFree,     // ...its release
};
inline constexpr int kApiCount = static_cast<int>(Api::cuMemAddressFree) + 1;

// Bits of Event::flags.
enum EventFlag : uint32_t {
    kFlagUnknownAddress = 1u << 0,  // free of an address never seen alloc'd
    kFlagDoubleFree = 1u << 1,      // free of an address already freed
    kFlagTagOverflow = 1u << 2,     // push beyond the per-thread tag depth
    // Written by a bounded trace in place of events it dropped: the live
    // set and open scopes carried over the gap (core/trace_bound.h).
    kFlagCarried = 1u << 3,
    // On a carried segment alloc: the segment had held a caching-allocator
    // block (it is the allocator's reserve, core/segment_owners.h).
    kFlagHeldBlock = 1u << 4,
    // On a cuMemUnmap free (format version 5): the event is the whole call,
    // `size` the unmapped range's length. Replay splits it into one free per
    // live mapping that starts inside [address, address + size)
    // (core/replay.h); older traces hold those frees one event each.
    kFlagRange = 1u << 5,
    // On a block alloc: the block is in a CUDA graph's private memory pool
    // (the caching allocator's pool of a capture: torch.cuda.graph,
    // inductor's CUDA graph trees), `aux` the pool's id, truncated. Such
    // memory is held by the graph for as long as it can be replayed, by
    // design: reports count it apart and the detectors never see it.
    kFlagGraphPool = 1u << 6,
};

// One recorded event. Tag = (rank, step, layer, phase): rank is per trace
// file (header), step is process-global, layer/phase are the top of the
// recording thread's tag stack. String ids index the trace's string table;
// id 0 is the empty string ("untagged"). stack 0 means "no stack captured".
struct Event {
    uint64_t seq = 0;      // global order; per address, free follows alloc
    uint64_t t_ns = 0;     // CLOCK_MONOTONIC nanoseconds since the trace began
    uint64_t address = 0;  // pointer for alloc/free; oom: device free bytes (0 unknown)
    uint64_t size = 0;     // bytes (for free: size of the freed record, 0 if unknown)
    uint64_t stream = 0;   // cudaStream_t as an integer, 0 = legacy default
    uint64_t step = 0;
    uint32_t tid = 0;
    uint32_t layer = 0;
    uint32_t phase = 0;
    uint32_t stack = 0;
    uint32_t aux = 0;  // mark text id / param index
    uint32_t flags = 0;
    int32_t device = -1;
    int32_t result = 0;  // the real call's return code (cudaError_t)
    EventKind kind = EventKind::alloc;
    Level level = Level::none;
    MemoryKind memory = MemoryKind::none;
    Api api = Api::none;
};

// Plain driver allocations (cuMemAlloc_v2 ... cuMemAllocManaged and their
// frees), as opposed to runtime-API segments and driver mappings: what
// libraries take for themselves (a cuBLAS handle's workspace, NCCL's
// buffers), never a framework's tensors.
inline constexpr bool is_direct_driver_allocation(Api api) noexcept {
    switch (api) {
        case Api::cuMemAlloc_v2:
        case Api::cuMemAllocPitch_v2:
        case Api::cuMemFree_v2:
        case Api::cuMemAllocAsync:
        case Api::cuMemAllocAsync_ptsz:
        case Api::cuMemFreeAsync:
        case Api::cuMemFreeAsync_ptsz:
        case Api::cuMemAllocFromPoolAsync:
        case Api::cuMemAllocFromPoolAsync_ptsz:
        case Api::cuMemAllocManaged:
            return true;
        default:
            return false;
    }
}

// Python frames in recorded stacks. A stack is native return addresses,
// innermost first; a caching allocator's bridge may append the Python frames
// that called into the interpreter (allocscope_block_alloc_frames). Such a
// frame is a pseudo-address: kPythonFrameTag | the trace string id of its
// text, "function (file:line)". The tag is a non-canonical x86-64 / AArch64
// address, never a real return address.
inline constexpr uint64_t kPythonFrameTag = 0xF1ull << 56;
inline constexpr bool is_python_frame(uint64_t address) noexcept {
    return (address >> 56) == 0xF1;
}
inline constexpr uint64_t python_frame_address(uint32_t string_id) noexcept {
    return kPythonFrameTag | string_id;
}
inline constexpr uint32_t python_frame_string(uint64_t address) noexcept {
    return static_cast<uint32_t>(address);
}
std::string python_frame_text(std::string_view function, std::string_view file, int line);

std::string_view to_string(EventKind kind) noexcept;
std::string_view to_string(Level level) noexcept;
std::string_view to_string(MemoryKind memory) noexcept;
std::string_view to_string(Api api) noexcept;

}  // namespace allocscope
