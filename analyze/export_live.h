// Internal to the exports (core/export*.cpp): Replay, and the changes it
// reports (LiveChange), so an export knows what a free released (its layer,
// stack, device...). A view of the one live set: it keeps no table of its own.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "event.h"
#include "live_table.h"
#include "replay.h"
#include "trace_reader.h"

namespace allocscope::export_detail {

class LiveTracker {
  public:
    // Calls f(const LiveChange&) for each allocation the event made or
    // released (a range unmap releases one per mapping it covers); not for
    // frees that released nothing.
    template <class F>
    void apply(const Event& e, F&& f) {
        replay_.apply(e, [&](const LiveChange& c) {
            if (c.kind == LiveChange::Kind::alloc || c.released()) f(c);
        });
    }

    const Replay& replay() const noexcept { return replay_; }
    const LiveTable& live(Pool pool) const noexcept { return replay_.table(pool); }

  private:
    Replay replay_;
};

// Calls `progress` every 64 Ki events and at the end.
template <class F>
inline void report_progress(const F& progress, size_t i, size_t n) {
    if (progress && ((i & 0xFFFF) == 0 || i == n)) progress(i, n);
}

}  // namespace allocscope::export_detail
