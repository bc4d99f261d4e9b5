// Internal to the exports (core/export*.cpp): Replay, plus each pool's live
// records by address, so an export knows what a free released (its layer,
// stack, device...). The records mirror Replay's tables exactly: a record is
// added where Replay adds one and removed from the pool whose live count
// Replay lowered.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <allocscope/sdk/flat_map.h>

#include "event.h"
#include "live_table.h"
#include "replay.h"
#include "trace_reader.h"

namespace allocscope::export_detail {

class LiveTracker {
  public:
    struct Change {
        enum class Kind { none, alloc, free } kind = Kind::none;
        Pool pool = Pool::device_segment;
        LiveRecord record;      // alloc: the new record; free: the one released
        bool replaced = false;  // alloc at a live address (its free was never recorded)
        LiveRecord old;         // ...the record it replaced
    };

    Change apply(const Event& e) {
        Change c;
        if (e.kind == EventKind::free) {
            std::array<uint64_t, kPoolCount> before{};
            for (int p = 0; p < kPoolCount; ++p)
                before[p] = replay_.totals(Pool(p)).live_count;
            replay_.apply(e);
            for (int p = 0; p < kPoolCount; ++p) {
                if (replay_.totals(Pool(p)).live_count >= before[p]) continue;
                c.kind = Change::Kind::free;
                c.pool = Pool(p);
                if (const LiveRecord* r = live_[p].find(e.address)) c.record = *r;
                live_[p].erase(e.address);
                break;
            }
            return c;
        }
        replay_.apply(e);
        if (e.kind != EventKind::alloc) return c;
        c.kind = Change::Kind::alloc;
        c.pool = pool_of(e);
        c.record = LiveRecord::from(e);
        FlatMap<uint64_t, LiveRecord>& live = live_[int(c.pool)];
        if (const LiveRecord* old = live.find(e.address)) {
            c.replaced = true;
            c.old = *old;
        }
        live[e.address] = c.record;
        return c;
    }

    const Replay& replay() const noexcept { return replay_; }
    const FlatMap<uint64_t, LiveRecord>& live(Pool pool) const noexcept { return live_[int(pool)]; }

  private:
    Replay replay_;
    std::array<FlatMap<uint64_t, LiveRecord>, kPoolCount> live_;
};

// Calls `progress` every 64 Ki events and at the end.
template <class F>
inline void report_progress(const F& progress, size_t i, size_t n) {
    if (progress && ((i & 0xFFFF) == 0 || i == n)) progress(i, n);
}

}  // namespace allocscope::export_detail
