// Which live device segments have held a caching-allocator block: the
// allocator's reserve, as its own counters (PyTorch's memory_reserved) count
// it. The analysis's, and the writer's for bounded traces (what a carried
// segment held, core/trace_bound.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>

#include "event.h"
#include "replay.h"

namespace allocscope {

// The device segments live, and which of them have held a caching-allocator
// block: those are the allocator's reserve (segments it took for blocks,
// cached or in use). A segment that never held one was taken by someone
// else: a library's workspace through cudaMalloc, a plain driver
// allocation (cuMemAlloc_v2 ...: cuBLAS workspaces, NCCL buffers).
class SegmentOwners {
  public:
    // One change of the live set (Replay::apply): this follows the replay's
    // device segments and blocks, it matches no free itself.
    void apply(const LiveChange& c) {
        if (c.kind == LiveChange::Kind::alloc) {
            if (c.pool == Pool::device_segment) {
                drop(c.address);  // the record it replaced
                // A bounded trace's carried segment that held a block in the
                // events it dropped (kFlagHeldBlock).
                const bool held = c.event && (c.event->flags & kFlagHeldBlock) != 0;
                live_[c.address] = {c.record.size, held};
                if (held) allocator_bytes_ += c.record.size;
            } else if (c.pool == Pool::device_block) {
                claim(c.address, c.record.size);
            }
        } else if (c.released() && c.pool == Pool::device_segment) {
            drop(c.address);
        }
    }
    uint64_t allocator_bytes() const { return allocator_bytes_; }
    // Whether the live segment at `address` has held a block.
    bool held(uint64_t address) const {
        auto it = live_.find(address);
        return it != live_.end() && it->second.allocator;
    }

  private:
    struct Segment {
        uint64_t size = 0;
        bool allocator = false;
    };
    void drop(uint64_t address) {
        auto it = live_.find(address);
        if (it == live_.end()) return;
        if (it->second.allocator) allocator_bytes_ -= it->second.size;
        live_.erase(it);
    }
    // Every segment the block [address, address + size) lies in: one, or
    // several mappings of an expandable segment.
    void claim(uint64_t address, uint64_t size) {
        auto it = live_.upper_bound(address);
        if (it != live_.begin()) --it;
        for (; it != live_.end() && it->first < address + std::max<uint64_t>(size, 1); ++it) {
            if (it->first + it->second.size <= address || it->second.allocator) continue;
            it->second.allocator = true;
            allocator_bytes_ += it->second.size;
        }
    }
    std::map<uint64_t, Segment> live_;
    uint64_t allocator_bytes_ = 0;
};

}  // namespace allocscope
