#include "stack_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <new>

namespace allocscope {

namespace {
constexpr size_t kChunkWords = 1u << 16;  // 512 KiB of frames per chunk
}

StackTable::StackTable(uint32_t capacity) : capacity_(capacity) {
    uint64_t index_size = std::bit_ceil(uint64_t{capacity} * 2);
    mask_ = index_size - 1;
    // Anonymous mappings are zero-filled and only touched pages cost memory.
    void* mem = mmap(nullptr, index_size * sizeof(Slot), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) throw std::bad_alloc();
    slots_ = static_cast<Slot*>(mem);
}

StackTable::~StackTable() {
    munmap(slots_, (mask_ + 1) * sizeof(Slot));
    for (uint64_t* chunk : chunks_)
        delete[] chunk;
}

uint64_t StackTable::hash(std::span<const uint64_t> frames) noexcept {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ frames.size();
    for (uint64_t f : frames) {
        h ^= f + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
    }
    h ^= h >> 31;
    return h == 0 ? 1 : h;
}

uint32_t StackTable::find(uint64_t h, std::span<const uint64_t> frames,
                          size_t& index) const noexcept {
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
        const Slot& slot = slots_[i];
        uint64_t seen = slot.hash.load(std::memory_order_acquire);
        if (seen == 0) {
            index = i;
            return 0;
        }
        if (seen == h && slot.depth == frames.size() &&
            std::memcmp(slot.frames, frames.data(), frames.size_bytes()) == 0) {
            return slot.id;
        }
    }
}

const uint64_t* StackTable::store_frames(std::span<const uint64_t> frames) {
    if (chunks_.empty() || chunk_used_ + frames.size() > kChunkWords) {
        chunks_.push_back(new uint64_t[std::max(kChunkWords, frames.size())]);
        chunk_used_ = 0;
    }
    uint64_t* dst = chunks_.back() + chunk_used_;
    std::memcpy(dst, frames.data(), frames.size_bytes());
    chunk_used_ += frames.size();
    return dst;
}

}  // namespace allocscope
