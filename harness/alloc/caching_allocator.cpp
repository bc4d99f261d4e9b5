#include "alloc/caching_allocator.h"

#include <string>
#include <utility>

namespace allocscope::harness::alloc {

namespace {

PoolKind pool_for(size_t rounded) {
    return rounded <= kSmallSize ? PoolKind::small : PoolKind::large;
}

// should_split: a small-pool remainder is kept from 512 B on; a large-pool
// remainder only above 1 MiB, so a large block carries at most 1 MiB of
// slack, and that slack counts as allocated.
bool should_split(PoolKind pool, size_t block_size, size_t size) {
    size_t remaining = block_size - size;
    return pool == PoolKind::small ? remaining >= kMinBlockSize : remaining > kSmallSize;
}

uintptr_t stream_key(Stream stream) {
    return reinterpret_cast<uintptr_t>(stream);
}

void increase(Stat& stat, uint64_t amount) {
    stat.current += amount;
    if (stat.current > stat.peak) stat.peak = stat.current;
}

void decrease(Stat& stat, uint64_t amount) {
    stat.current -= amount;
}

void reset_peak(Stat& stat) {
    stat.peak = stat.current;
}

}  // namespace

size_t segment_size_for(size_t rounded) {
    if (rounded <= kSmallSize) return kSmallBuffer;
    if (rounded < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

OutOfMemoryError::OutOfMemoryError(size_t requested_bytes, size_t segment_bytes,
                                   const MemoryStats& stats)
    : std::runtime_error("out of device memory: tried to allocate " +
                         std::to_string(requested_bytes) + " bytes (a segment of " +
                         std::to_string(segment_bytes) + " bytes); " +
                         std::to_string(stats.allocated_bytes.current) + " bytes allocated, " +
                         std::to_string(stats.reserved_bytes.current) +
                         " bytes reserved by the caching allocator"),
      requested(requested_bytes),
      segment_size(segment_bytes) {}

bool CachingAllocator::BySizeOnStream::operator()(const Block* a, const Block* b) const {
    uintptr_t sa = stream_key(a->segment->stream), sb = stream_key(b->segment->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
}

bool CachingAllocator::BySizeOnStream::operator()(const Block* a, const FitKey& b) const {
    uintptr_t sa = stream_key(a->segment->stream), sb = stream_key(b.stream);
    if (sa != sb) return sa < sb;
    return a->size < b.size;
}

bool CachingAllocator::BySizeOnStream::operator()(const FitKey& a, const Block* b) const {
    uintptr_t sa = stream_key(a.stream), sb = stream_key(b->segment->stream);
    if (sa != sb) return sa < sb;
    return a.size <= b->size;
}

CachingAllocator::CachingAllocator(int device, SegmentSource segments, BlockEventSink events)
    : device_(device), segments_(std::move(segments)), events_(std::move(events)) {}

CachingAllocator::~CachingAllocator() {
    release_free_segments();
    for (auto& [base, segment] : segments_by_base_) {
        for (Block* b = segment->first; b != nullptr;) {
            Block* next = b->next;
            delete b;
            b = next;
        }
    }
}

void* CachingAllocator::allocate(size_t bytes, Stream stream) {
    if (bytes == 0) return nullptr;
    const size_t size = round_size(bytes);
    const PoolKind kind = pool_for(size);

    std::lock_guard lock(mutex_);
    FreeBlocks& pool = pool_of(kind);
    Block* block = take_free_block(pool, stream, size);
    if (block == nullptr) {
        const size_t segment_size = segment_size_for(size);
        block = new_segment(kind, stream, segment_size);
        if (block == nullptr) {
            // PyTorch's malloc: release_cached_blocks, then alloc_block once
            // more (counted in num_alloc_retries), then OOM.
            release_free_segments();
            ++stats_.num_alloc_retries;
            block = new_segment(kind, stream, segment_size);
        }
        if (block == nullptr) {
            ++stats_.num_ooms;
            if (events_.on_oom) events_.on_oom(size, device_, stream);
            throw OutOfMemoryError(bytes, segment_size, stats_);
        }
    }
    if (should_split(kind, block->size, size)) split(block, size, pool);

    block->allocated = true;
    block->requested_size = bytes;
    allocated_.emplace(block->ptr, block);
    increase(stats_.allocated_bytes, block->size);
    increase(stats_.requested_bytes, bytes);
    increase(stats_.allocations, 1);
    void* ptr = reinterpret_cast<void*>(block->ptr);
    events_.on_alloc(ptr, block->size, device_, stream);
    return ptr;
}

void CachingAllocator::free(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard lock(mutex_);
    auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocated_.end()) {
        throw std::invalid_argument("caching allocator: free of a pointer it did not hand out");
    }
    Block* block = it->second;
    allocated_.erase(it);
    decrease(stats_.allocated_bytes, block->size);
    decrease(stats_.requested_bytes, block->requested_size);
    decrease(stats_.allocations, 1);
    events_.on_free(ptr);

    block->allocated = false;
    block->requested_size = 0;
    FreeBlocks& pool = pool_of(block->segment->pool);
    // try_merge_blocks with both neighbours. Folding into the lower block
    // keeps Segment::first valid; a block's size is its set key, so a
    // neighbour leaves the set before it grows.
    if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
        pool.erase(prev);
        prev->size += block->size;
        prev->next = block->next;
        if (prev->next != nullptr) prev->next->prev = prev;
        delete block;
        block = prev;
    }
    if (Block* next = block->next; next != nullptr && !next->allocated) {
        pool.erase(next);
        block->size += next->size;
        block->next = next->next;
        if (block->next != nullptr) block->next->prev = block;
        delete next;
    }
    pool.insert(block);
}

void CachingAllocator::empty_cache() {
    std::lock_guard lock(mutex_);
    release_free_segments();
}

MemoryStats CachingAllocator::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

void CachingAllocator::reset_peak_stats() {
    std::lock_guard lock(mutex_);
    for (Stat* stat : {&stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.requested_bytes,
                       &stats_.allocations, &stats_.segments}) {
        reset_peak(*stat);
    }
}

std::vector<SegmentInfo> CachingAllocator::snapshot() const {
    std::lock_guard lock(mutex_);
    std::vector<SegmentInfo> result;
    result.reserve(segments_by_base_.size());
    for (const auto& [base, segment] : segments_by_base_) {
        SegmentInfo info{
            reinterpret_cast<void*>(base), segment->size, segment->stream, segment->pool, 0, {}};
        for (const Block* b = segment->first; b != nullptr; b = b->next) {
            info.blocks.push_back(
                {reinterpret_cast<void*>(b->ptr), b->size, b->requested_size, b->allocated});
            if (b->allocated) info.allocated_size += b->size;
        }
        result.push_back(std::move(info));
    }
    return result;
}

CachingAllocator::Block* CachingAllocator::take_free_block(FreeBlocks& pool, Stream stream,
                                                           size_t size) {
    auto it = pool.lower_bound(FitKey{stream, size});
    if (it == pool.end() || (*it)->segment->stream != stream) return nullptr;
    Block* block = *it;
    pool.erase(it);
    return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(PoolKind kind, Stream stream,
                                                       size_t segment_size) {
    void* ptr = segments_.allocate(segment_size);
    if (ptr == nullptr) return nullptr;
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    auto segment = std::make_unique<Segment>(Segment{base, segment_size, stream, kind, nullptr});
    segment->first = new Block{segment.get(), base, segment_size, 0, false, nullptr, nullptr};
    Block* block = segment->first;
    segments_by_base_.emplace(base, std::move(segment));
    increase(stats_.reserved_bytes, segment_size);
    increase(stats_.segments, 1);
    return block;
}

void CachingAllocator::split(Block* block, size_t size, FreeBlocks& pool) {
    auto* remainder = new Block{block->segment, block->ptr + size, block->size - size, 0, false,
                                block,          block->next};
    if (block->next != nullptr) block->next->prev = remainder;
    block->next = remainder;
    block->size = size;
    pool.insert(remainder);
}

void CachingAllocator::release_free_segments() {
    // release_blocks: only a free block that is its whole segment (no
    // neighbours) can go back; a free block beside an allocated one stays.
    for (FreeBlocks* pool : {&small_free_, &large_free_}) {
        for (auto it = pool->begin(); it != pool->end();) {
            Block* block = *it++;
            if (block->prev == nullptr && block->next == nullptr) release_segment(block);
        }
    }
}

void CachingAllocator::release_segment(Block* whole) {
    const Segment& segment = *whole->segment;
    const uintptr_t base = segment.base;
    // The source may throw; the segment is forgotten only once it is back.
    segments_.release(reinterpret_cast<void*>(base));
    decrease(stats_.reserved_bytes, segment.size);
    decrease(stats_.segments, 1);
    pool_of(segment.pool).erase(whole);
    delete whole;
    segments_by_base_.erase(base);
}

}  // namespace allocscope::harness::alloc
