#include "replay.h"

namespace allocscope {

const char* to_string(Pool pool) noexcept {
    switch (pool) {
        case Pool::device_segment:
            return "segment";
        case Pool::device_block:
            return "block";
        case Pool::host_pinned:
            return "host-pinned";
        case Pool::physical:
            return "physical";
        case Pool::address_range:
            return "va-reserved";
    }
    return "unknown";
}

Pool pool_of(Level level, MemoryKind memory) noexcept {
    if (level == Level::block) return Pool::device_block;
    switch (memory) {
        case MemoryKind::host_pinned:
            return Pool::host_pinned;
        case MemoryKind::physical:
            return Pool::physical;
        case MemoryKind::address_range:
            return Pool::address_range;
        default:
            return Pool::device_segment;
    }
}

Pool pool_of_free(Level level, Api api) noexcept {
    if (level == Level::block) return Pool::device_block;
    switch (api) {
        case Api::cudaFreeHost:
            return Pool::host_pinned;
        case Api::cuMemRelease:
            return Pool::physical;
        case Api::cuMemAddressFree:
            return Pool::address_range;
        default:
            return Pool::device_segment;
    }
}

Pool pool_of(const Event& e) noexcept {
    if (e.level == Level::block) return Pool::device_block;
    if (e.memory != MemoryKind::none) return pool_of(e.level, e.memory);
    return pool_of_free(e.level, e.api);
}

FreeOutcome Replay::apply(const Event& e, LiveRecord* freed) {
    switch (e.kind) {
        case EventKind::alloc: {
            Pool pool = pool_of(e);
            const LiveRecord rec = LiveRecord::from(e);
            LiveTable& table = tables_[int(pool)];
            PoolTotals& t = totals_[int(pool)];
            LiveRecord old;
            if (table.insert(rec, &old)) {
                ++t.live_count;
            } else {
                t.live_bytes -= old.size;  // its free was never recorded
            }
            t.live_bytes += e.size;
            t.allocated_bytes += e.size;
            ++t.allocations;
            if (t.live_bytes > t.peak_bytes) {
                t.peak_bytes = t.live_bytes;
                t.peak_event = e;
            }
            return FreeOutcome::freed;
        }
        case EventKind::free: {
            Pool pool = pool_of(e);
            LiveTable& table = tables_[int(pool)];
            PoolTotals& t = totals_[int(pool)];
            LiveRecord removed;
            FreeOutcome outcome = table.remove(e.address, &removed);
            if (outcome == FreeOutcome::freed && freed) *freed = removed;
            if (e.result != 0) {
                // The real free failed and released nothing: the record goes
                // back, into its own tombstone (LiveTable::insert: no growth).
                ++failed_frees_;
                if (outcome == FreeOutcome::freed) table.insert(removed);
            } else if (outcome == FreeOutcome::freed) {
                t.live_bytes -= removed.size;
                --t.live_count;
            }
            return outcome;
        }
        case EventKind::oom:
            ++oom_events_;
            if (e.size > largest_failed_request_) largest_failed_request_ = e.size;
            return FreeOutcome::freed;
        default:
            return FreeOutcome::freed;
    }
}

uint64_t Replay::unknown_frees() const noexcept {
    uint64_t n = 0;
    for (const LiveTable& t : tables_)
        n += t.unknown_frees();
    return n;
}

uint64_t Replay::double_frees() const noexcept {
    uint64_t n = 0;
    for (const LiveTable& t : tables_)
        n += t.double_frees();
    return n;
}

}  // namespace allocscope
