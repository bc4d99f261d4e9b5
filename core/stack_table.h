// Deduplicates raw call stacks into dense ids.
//
// Lookups are lock-free (the hook hot path); inserts take a mutex. A slot is
// published by a release store of its hash after its id, depth and frames are
// written, so a reader that acquires a non-zero hash sees a complete entry.
// Invariant: the `on_new` callback of intern() runs before the new id becomes
// visible to any other thread, so whatever it records (the trace's stack
// definition) precedes every event that can refer to the id.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace allocscope {

class StackTable {
  public:
    // Room for `capacity` distinct stacks (the hash index is twice as large).
    explicit StackTable(uint32_t capacity = 1u << 17);
    ~StackTable();
    StackTable(const StackTable&) = delete;
    StackTable& operator=(const StackTable&) = delete;

    // Returns the id (>= 1) of `frames`, inserting it if new, or 0 when the
    // table is full (counted in dropped()). `on_new(id, frames)` is called
    // under the insert lock for a stack seen for the first time.
    template <typename OnNew>
    uint32_t intern(std::span<const uint64_t> frames, OnNew&& on_new) {
        return intern(hash(frames), frames, std::forward<OnNew>(on_new));
    }
    // The same, for a caller that already has hash(frames).
    template <typename OnNew>
    uint32_t intern(uint64_t hash_of_frames, std::span<const uint64_t> frames, OnNew&& on_new);

    // The frames of stack `id` into `out` (replacing its contents); false
    // when no published slot has that id. Scans every slot, so it is for
    // rare callers (a check's end), never the hook path. Safe against
    // concurrent inserts: a slot's id, depth and frames are written before
    // its hash is release-stored and never change after, so a slot whose
    // non-zero hash this acquires is complete; one still being inserted
    // reads as empty (its id was not handed out yet).
    bool frames_of(uint32_t id, std::vector<uint64_t>& out) const;

    uint32_t size() const noexcept { return count_.load(std::memory_order_relaxed); }
    uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

    static uint64_t hash(std::span<const uint64_t> frames) noexcept;

  private:
    struct Slot {
        std::atomic<uint64_t> hash;  // 0 = empty
        uint32_t id;
        uint32_t depth;
        const uint64_t* frames;
    };

    uint32_t find(uint64_t h, std::span<const uint64_t> frames, size_t& index) const noexcept;
    const uint64_t* store_frames(std::span<const uint64_t> frames);

    Slot* slots_;
    uint64_t mask_;
    uint32_t capacity_;
    std::atomic<uint32_t> count_{0};
    std::atomic<uint64_t> dropped_{0};
    std::mutex insert_mutex_;
    std::vector<uint64_t*> chunks_;
    size_t chunk_used_ = 0;
};

template <typename OnNew>
uint32_t StackTable::intern(uint64_t h, std::span<const uint64_t> frames, OnNew&& on_new) {
    size_t index = 0;
    if (uint32_t id = find(h, frames, index)) return id;
    std::lock_guard lock(insert_mutex_);
    if (uint32_t id = find(h, frames, index)) return id;  // raced with another inserter
    uint32_t n = count_.load(std::memory_order_relaxed);
    if (n >= capacity_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    const uint32_t id = n + 1;
    Slot& slot = slots_[index];
    slot.id = id;
    slot.depth = static_cast<uint32_t>(frames.size());
    slot.frames = store_frames(frames);
    on_new(id, frames);
    count_.store(n + 1, std::memory_order_relaxed);
    slot.hash.store(h, std::memory_order_release);
    return id;
}

}  // namespace allocscope
