// Plugin SDK: SizeSet, byte counts matched the way allocation events
// report them (raw requests or PyTorch caching allocator blocks).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace allocscope::plugins {

// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, and
// harness/alloc/caching_allocator.h): requests are rounded up to multiples of
// 512 B (at least 512 B); blocks above 1 MiB come from the large pool, where
// a free block is handed out unsplit when the remainder is at most 1 MiB.
inline constexpr uint64_t kCachingMinBlock = 512;
inline constexpr uint64_t kCachingSmallSize = uint64_t{1} << 20;

inline constexpr uint64_t caching_round(uint64_t bytes) {
    return bytes < kCachingMinBlock
               ? kCachingMinBlock
               : kCachingMinBlock * ((bytes + kCachingMinBlock - 1) / kCachingMinBlock);
}

// A set of byte counts, matched the way allocation events report them: the
// raw request (cudaMallocAsync, an allocator that reports requests), the
// caching allocator's rounded block, or a large-pool block handed out
// unsplit (up to 1 MiB above the rounded request).
class SizeSet {
  public:
    void add(uint64_t raw) {
        if (raw == 0) return;
        raw_.push_back(raw);
        rounded_.push_back(caching_round(raw));
        sealed_ = false;
    }
    void seal() {
        if (sealed_) return;
        for (std::vector<uint64_t>* v : {&raw_, &rounded_}) {
            std::sort(v->begin(), v->end());
            v->erase(std::unique(v->begin(), v->end()), v->end());
        }
        sealed_ = true;
    }
    bool contains(uint64_t size) const {
        if (!sealed_) throw std::logic_error("SizeSet used before seal()");
        if (std::binary_search(raw_.begin(), raw_.end(), size)) return true;
        auto it = std::upper_bound(rounded_.begin(), rounded_.end(), size);
        if (it == rounded_.begin()) return false;
        const uint64_t r = *(it - 1);  // the largest rounded size <= size
        return r == size || (r > kCachingSmallSize && size - r <= kCachingSmallSize);
    }
    std::size_t size() const { return raw_.size(); }

  private:
    std::vector<uint64_t> raw_;
    std::vector<uint64_t> rounded_;
    bool sealed_ = true;
};

}  // namespace allocscope::plugins
