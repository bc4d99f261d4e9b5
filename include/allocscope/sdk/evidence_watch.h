// Plugin SDK: allocations held as evidence while a plugin follows the
// stream (HeldAlloc, by ids) and EvidenceWatch, which follows their frees
// until the finding is emitted.
#pragma once

#include <allocscope/sdk/evidence.h>
#include <allocscope/sdk/flat_map.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace allocscope::plugins {

// An allocation kept as evidence, by ids: cheap to copy while a plugin
// follows the stream; made an Evidence (text) only when a finding is emitted.
struct HeldAlloc {
    uint64_t size = 0;
    uint64_t step = 0;
    uint64_t alloc_seq = 0;
    uint32_t stack_id = 0;
    uint32_t layer = 0;  // Interner ids
    uint32_t phase = 0;
};

// The allocations a plugin holds as evidence for a finding it emits later
// (at finish): follows their frees, so the emitted evidence says which were
// freed since (free_seq) and which are still alive (0). Held seqs are
// reference counted, so one allocation may prove several findings.
class EvidenceWatch {
  public:
    void hold(uint64_t alloc_seq) { ++watched_[alloc_seq].refs; }
    void release(uint64_t alloc_seq) {
        Watched* w = watched_.find(alloc_seq);
        if (w && --w->refs == 0) watched_.erase(alloc_seq);
    }
    // Every alloc_seq of a list of Evidence or HeldAlloc.
    template <class T>
    void hold(const std::vector<T>& evidence) {
        for (const T& e : evidence)
            hold(e.alloc_seq);
    }
    template <class T>
    void release(const std::vector<T>& evidence) {
        for (const T& e : evidence)
            release(e.alloc_seq);
    }
    // A FREE event of a known allocation.
    void on_free(uint64_t alloc_seq, uint64_t free_seq) {
        if (Watched* w = watched_.find(alloc_seq)) w->free_seq = free_seq;
    }
    // Sets free_seq of each held entry from the frees seen since.
    void fill(std::vector<Evidence>& evidence) const {
        for (Evidence& e : evidence) {
            if (const Watched* w = watched_.find(e.alloc_seq)) e.free_seq = w->free_seq;
        }
    }
    std::size_t size() const { return watched_.size(); }

  private:
    struct Watched {
        uint64_t refs = 0;
        uint64_t free_seq = 0;
    };
    FlatMap<uint64_t, Watched> watched_;
};

}  // namespace allocscope::plugins
