// A caching allocator for device memory with the accounting of PyTorch's
// native CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
// DeviceCachingAllocator), so that `allocated` and `reserved` read here equal
// what torch.cuda.memory_allocated() / memory_reserved() read for the same
// sequence of requests, and blocks land at the same offsets in their segments.
//
// Rules followed (constants below carry PyTorch's names):
//   * a request is rounded up to a multiple of kMinBlockSize (512 B), at
//     least 512 B (round_size);
//   * rounded sizes up to kSmallSize (1 MiB) use the small pool, larger ones
//     the large pool (get_pool);
//   * a new segment is kSmallBuffer (2 MiB) for the small pool, kLargeBuffer
//     (20 MiB) for large requests below kMinLargeAlloc (10 MiB), and the
//     request rounded up to kRoundLarge (2 MiB) from 10 MiB on
//     (get_allocation_size);
//   * a free block is found best-fit in the request's pool, ordered by
//     (stream, size, address), and only among blocks of the request's
//     stream (BlockComparatorSize, get_free_block);
//   * the block is split, the caller getting the low-address part, when the
//     remainder is >= 512 B in the small pool or > 1 MiB in the large pool
//     (should_split);
//   * a freed block merges with free neighbours of its segment
//     (try_merge_blocks);
//   * when a new segment cannot be had, every cached segment with no block in
//     use is released and the segment is asked for once more; a second
//     failure is an out-of-memory error (release_cached_blocks, then
//     alloc_block with isRetry);
//   * empty_cache() releases every segment with no block in use.
// Not modelled, all off by default in PyTorch: max_split_size_mb,
// roundup_power2_divisions, expandable segments, garbage collection
// thresholds, CUDA-graph private pools, and recordStream's cross-stream
// events (a block here is reusable as soon as it is freed).
//
// Every block handed out or taken back is reported to a BlockEventSink with
// the block's size, which is what memory_allocated() counts: the rounded
// request, or the whole unsplit block when the remainder was too small to
// split off. The sink runs under the allocator's lock, so the events of all
// threads form one sequence in which a free of an address always comes
// before the allocation that reuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace allocscope::harness::alloc {

inline constexpr size_t kMinBlockSize = 512;
inline constexpr size_t kSmallSize = size_t{1} << 20;
inline constexpr size_t kSmallBuffer = size_t{2} << 20;
inline constexpr size_t kLargeBuffer = size_t{20} << 20;
inline constexpr size_t kMinLargeAlloc = size_t{10} << 20;
inline constexpr size_t kRoundLarge = size_t{2} << 20;

// The size of the block serving a request of `bytes` (before any unsplit
// remainder is added). The one 512-byte rounding of the harness: the FP8
// layouts and the parameter sizes use it too.
inline constexpr size_t round_size(size_t bytes) {
    return bytes < kMinBlockSize ? kMinBlockSize
                                 : kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}
// The size of the segment allocated for a block of `rounded` bytes.
size_t segment_size_for(size_t rounded);

// A cudaStream_t, kept opaque so this header needs no CUDA headers;
// nullptr is the legacy default stream.
using Stream = void*;

enum class PoolKind { small, large };

// Where segments come from. `allocate` returns nullptr when the device is out
// of memory and throws on any other failure; `release` throws on failure.
struct SegmentSource {
    std::function<void*(size_t bytes)> allocate;
    std::function<void(void* ptr)> release;
};

// cudaMalloc/cudaFree on `device` (made current for the call and restored),
// through whatever libcudart the process binds: the real runtime, or
// harness/sim_cudart on machines without a GPU.
SegmentSource cuda_runtime_segments(int device);

// Receives every block allocation and free, under the allocator's lock; it
// must not throw or call back into the allocator.
struct BlockEventSink {
    std::function<void(void* ptr, size_t size, int device, Stream stream)> on_alloc;
    std::function<void(void* ptr)> on_free;
    // A request the allocator gave up on (after releasing its cached
    // segments and retrying), right before OutOfMemoryError is thrown:
    // the rounded size. May be empty.
    std::function<void(size_t size, int device, Stream stream)> on_oom;
};

// allocscope_dl_block_alloc / _free / _oom: recorded by the
// interposer when it is preloaded, no-ops otherwise.
BlockEventSink allocscope_block_events();

struct Stat {
    uint64_t current = 0;
    uint64_t peak = 0;
};

struct MemoryStats {
    Stat allocated_bytes;            // memory_allocated(): sizes of the blocks in use
    Stat reserved_bytes;             // memory_reserved(): sizes of the segments held
    Stat requested_bytes;            // the unrounded sizes the callers asked for
    Stat allocations;                // blocks in use
    Stat segments;                   // segments held
    uint64_t num_alloc_retries = 0;  // segment requests retried after releasing the cache
    uint64_t num_ooms = 0;           // requests that failed after the retry
};

struct BlockInfo {
    void* ptr;
    size_t size;
    size_t requested_size;  // 0 for a free block
    bool allocated;
};

struct SegmentInfo {
    void* base;
    size_t size;
    Stream stream;
    PoolKind pool;
    size_t allocated_size;          // sum of the allocated blocks' sizes
    std::vector<BlockInfo> blocks;  // in address order, covering the segment
};

// Thrown when a segment cannot be had even after releasing the cache.
class OutOfMemoryError : public std::runtime_error {
  public:
    OutOfMemoryError(size_t requested, size_t segment_size, const MemoryStats& stats);
    size_t requested;     // the caller's size
    size_t segment_size;  // what was asked of the segment source
};

class CachingAllocator {
  public:
    CachingAllocator(int device, SegmentSource segments, BlockEventSink events);
    // Releases the segments with no block in use. Segments that still hold
    // allocated blocks stay with the source, so pointers the caller kept
    // remain valid and a leak stays visible in the trace (no free is
    // reported for such blocks).
    ~CachingAllocator();
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;

    // nullptr for 0 bytes, like PyTorch (no block, no event). Throws
    // OutOfMemoryError.
    void* allocate(size_t bytes, Stream stream = nullptr);
    // Returns the block to the cache of the stream it was allocated on.
    // nullptr is ignored; a pointer this allocator did not hand out (or
    // already took back) throws std::invalid_argument.
    void free(void* ptr);
    void empty_cache();

    MemoryStats stats() const;
    int device() const { return device_; }
    // torch.cuda.reset_peak_memory_stats(): every peak becomes the current
    // value.
    void reset_peak_stats();
    // Segments in address order.
    std::vector<SegmentInfo> snapshot() const;

  private:
    struct Segment;
    // A contiguous range of a segment, allocated or free. Blocks of a segment
    // form an address-ordered list through prev/next covering it exactly, and
    // two free blocks are never neighbours.
    struct Block {
        Segment* segment;
        uintptr_t ptr;
        size_t size;
        size_t requested_size;
        bool allocated;
        Block* prev;
        Block* next;
    };
    struct Segment {
        uintptr_t base;
        size_t size;
        Stream stream;
        PoolKind pool;
        // Never changes: a split keeps the low part in the old block, and a
        // merge folds the higher block into the lower one.
        Block* first;
    };
    struct FitKey {
        Stream stream;
        size_t size;
    };
    // PyTorch's BlockComparatorSize: (stream, size, address), so that
    // lower_bound on (stream, size) is the best fit on that stream.
    struct BySizeOnStream {
        using is_transparent = void;
        bool operator()(const Block* a, const Block* b) const;
        bool operator()(const Block* a, const FitKey& b) const;
        bool operator()(const FitKey& a, const Block* b) const;
    };
    using FreeBlocks = std::set<Block*, BySizeOnStream>;

    FreeBlocks& pool_of(PoolKind kind) {
        return kind == PoolKind::small ? small_free_ : large_free_;
    }
    Block* take_free_block(FreeBlocks& pool, Stream stream, size_t size);
    Block* new_segment(PoolKind kind, Stream stream, size_t segment_size);
    void split(Block* block, size_t size, FreeBlocks& pool);
    void release_free_segments();
    void release_segment(Block* whole);

    const int device_;
    const SegmentSource segments_;
    const BlockEventSink events_;

    mutable std::mutex mutex_;
    FreeBlocks small_free_;
    FreeBlocks large_free_;
    std::unordered_map<uintptr_t, Block*> allocated_;
    std::map<uintptr_t, std::unique_ptr<Segment>> segments_by_base_;
    MemoryStats stats_;
};

}  // namespace allocscope::harness::alloc
