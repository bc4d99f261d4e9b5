// Replays an event stream through one LiveTable per memory pool, keeping
// live and peak totals per pool. The interposer's writer thread (filling in
// each free's size and flags before the event is written), reports, plugins
// run offline and tests all account through this one class.
#pragma once

#include <array>
#include <cstdint>

#include "event.h"
#include "live_table.h"

namespace allocscope {

// Where an allocation's bytes count. Host pinned memory is a segment-level
// allocation but never counts towards device memory. Driver VMM memory is
// counted once: mappings are device segments; the physical handles behind
// them (cuMemCreate) and the VA reservations they live in are pools of their
// own, which no device total includes.
enum class Pool : uint8_t {
    device_segment = 0,
    device_block = 1,
    host_pinned = 2,
    physical = 3,
    address_range = 4,
};
inline constexpr int kPoolCount = 5;
const char* to_string(Pool pool) noexcept;
Pool pool_of(Level level, MemoryKind memory) noexcept;
// The pool a free through `api` at `level` acts on, before its address is
// looked up (the interposer's free hooks).
Pool pool_of_free(Level level, Api api) noexcept;
// The pool an alloc or free event acts on. A free carries no memory kind when
// its address was unknown; then its api decides.
Pool pool_of(const Event& e) noexcept;
// Device memory a tag can own: the segment and block pools.
inline bool is_device_pool(Pool pool) noexcept {
    return pool == Pool::device_segment || pool == Pool::device_block;
}

struct PoolTotals {
    uint64_t live_bytes = 0;
    uint64_t live_count = 0;
    uint64_t allocated_bytes = 0;  // sum over all allocations
    uint64_t allocations = 0;
    uint64_t peak_bytes = 0;
    Event peak_event;  // the allocation that reached the peak (first time)
};

class Replay {
  public:
    // Applies alloc/free/oom events; other kinds only advance the clock.
    // Returns the outcome for frees (FreeOutcome::freed for non-free events);
    // a free that found its allocation copies the allocation's record to
    // `freed` when given. Throws only when out of memory growing a table;
    // then nothing has changed.
    FreeOutcome apply(const Event& event, LiveRecord* freed = nullptr);

    const PoolTotals& totals(Pool pool) const noexcept { return totals_[int(pool)]; }
    const LiveTable& table(Pool pool) const noexcept { return tables_[int(pool)]; }
    uint64_t unknown_frees() const noexcept;
    uint64_t double_frees() const noexcept;
    uint64_t failed_frees() const noexcept { return failed_frees_; }
    uint64_t oom_events() const noexcept { return oom_events_; }
    uint64_t largest_failed_request() const noexcept { return largest_failed_request_; }

  private:
    std::array<LiveTable, kPoolCount> tables_;
    std::array<PoolTotals, kPoolCount> totals_;
    uint64_t failed_frees_ = 0;
    uint64_t oom_events_ = 0;
    uint64_t largest_failed_request_ = 0;
};

}  // namespace allocscope
