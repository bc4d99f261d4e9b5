// Replays a recorded event stream through the same LiveTable the interposer
// uses, keeping live and peak totals per memory pool. Reports, plugins run
// offline and tests all account through this one class.
#pragma once

#include <array>
#include <cstdint>

#include "event.h"
#include "live_table.h"

namespace allocscope {

// Where an allocation's bytes count. Host pinned memory is a segment-level
// allocation but never counts towards device memory.
enum class Pool : uint8_t { device_segment = 0, device_block = 1, host_pinned = 2 };
inline constexpr int kPoolCount = 3;
const char* to_string(Pool pool) noexcept;
Pool pool_of(Level level, MemoryKind memory) noexcept;

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
    // Returns the outcome for frees (FreeOutcome::freed for non-free events).
    FreeOutcome apply(const Event& event);

    const PoolTotals& totals(Pool pool) const noexcept { return totals_[int(pool)]; }
    const LiveTable& table(Pool pool) const noexcept { return tables_[int(pool)]; }
    uint64_t unknown_frees() const noexcept;
    uint64_t double_frees() const noexcept;
    uint64_t failed_frees() const noexcept { return failed_frees_; }
    uint64_t oom_events() const noexcept { return oom_events_; }
    uint64_t largest_failed_request() const noexcept { return largest_failed_request_; }

  private:
    // Frees carry no memory kind when their address was unknown; the pool is
    // found by looking the address up where it can live for that level.
    Pool pool_for_free(const Event& event) const;

    std::array<LiveTable, kPoolCount> tables_;
    std::array<PoolTotals, kPoolCount> totals_;
    uint64_t failed_frees_ = 0;
    uint64_t oom_events_ = 0;
    uint64_t largest_failed_request_ = 0;
};

}  // namespace allocscope
