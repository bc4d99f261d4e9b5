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
    // device segments and blocks, it matches no free itself. Inline: a
    // block's allocation looks for its segment only while a live segment
    // has held no block yet, and other changes are none of its business.
    void apply(const LiveChange& c) {
        if (c.pool == Pool::device_segment) {
            apply_segment(c);
        } else if (c.pool == Pool::device_block && c.kind == LiveChange::Kind::alloc &&
                   unclaimed_ > 0) {
            claim(c.address, c.record.size);
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
    [[gnu::noinline]] void apply_segment(const LiveChange& c) {
        if (c.kind == LiveChange::Kind::alloc) {
            drop(c.address);  // the record it replaced
            // A bounded trace's carried segment that held a block in the
            // events it dropped (kFlagHeldBlock).
            const bool held = c.event && (c.event->flags & kFlagHeldBlock) != 0;
            live_[c.address] = {c.record.size, held};
            if (held)
                allocator_bytes_ += c.record.size;
            else
                ++unclaimed_;
        } else if (c.released()) {
            drop(c.address);
        }
    }
    void drop(uint64_t address) {
        auto it = live_.find(address);
        if (it == live_.end()) return;
        if (it->second.allocator)
            allocator_bytes_ -= it->second.size;
        else
            --unclaimed_;
        live_.erase(it);
    }
    // Every segment the block [address, address + size) lies in: one, or
    // several mappings of an expandable segment.
    [[gnu::noinline]] void claim(uint64_t address, uint64_t size) {
        auto it = live_.upper_bound(address);
        if (it != live_.begin()) --it;
        for (; it != live_.end() && it->first < address + std::max<uint64_t>(size, 1); ++it) {
            if (it->first + it->second.size <= address || it->second.allocator) continue;
            it->second.allocator = true;
            allocator_bytes_ += it->second.size;
            --unclaimed_;
        }
    }
    std::map<uint64_t, Segment> live_;
    uint64_t allocator_bytes_ = 0;
    uint64_t unclaimed_ = 0;  // live segments that have held no block yet
};

}  // namespace allocscope
