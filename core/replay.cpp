#include "replay.h"

#include <algorithm>

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
    bool first = true;
    return apply(e, [&](const LiveChange& c) {
        if (freed && first && c.kind == LiveChange::Kind::free && c.outcome == FreeOutcome::freed) {
            *freed = c.record;
            first = false;
        }
    });
}

namespace {

bool is_mapping(Pool pool, const LiveRecord& r) noexcept {
    return pool == Pool::device_segment && r.api == Api::cuMemMap;
}

bool is_direct(Pool pool, const LiveRecord& r) noexcept {
    return pool == Pool::device_segment && is_direct_driver_allocation(r.api);
}

}  // namespace

void Replay::entered(Pool pool, const LiveRecord& r) noexcept {
    if (is_direct(pool, r)) {
        direct_bytes_ += r.size;
        ++direct_count_;
    }
    if (r.graph_pool) {
        graph_.live_bytes += r.size;
        ++graph_.live_count;
        ++graph_.allocations;
        graph_.allocated_bytes += r.size;
        graph_.peak_bytes = std::max(graph_.peak_bytes, graph_.live_bytes);
    }
}

void Replay::left(Pool pool, const LiveRecord& r, bool still_mapped) noexcept {
    if (is_direct(pool, r)) {
        direct_bytes_ -= r.size;
        --direct_count_;
    }
    if (r.graph_pool) {
        graph_.live_bytes -= r.size;
        --graph_.live_count;
    }
    if (is_mapping(pool, r) && !still_mapped) mappings_.erase(r.address);
}

void Replay::apply_alloc(const Event& e, LiveChange& c) {
    c.kind = LiveChange::Kind::alloc;
    c.pool = pool_of(e);
    c.address = e.address;
    c.record = LiveRecord::from(e);
    const Pool pool = c.pool;
    LiveTable& table = tables_[int(pool)];
    PoolTotals& t = totals_[int(pool)];
    // The mapping index first: out of memory, nothing has changed.
    const bool mapping = is_mapping(pool, c.record);
    const bool indexed = mapping && mappings_.insert(e.address).second;
    try {
        c.replaced = !table.insert(c.record, &c.old);
    } catch (...) {
        if (indexed) mappings_.erase(e.address);
        throw;
    }
    c.index = table.last_index();
    if (c.replaced) {
        t.live_bytes -= c.old.size;  // its free was never recorded
        left(pool, c.old, mapping);
    } else {
        ++t.live_count;
    }
    entered(pool, c.record);
    t.live_bytes += e.size;
    t.allocated_bytes += e.size;
    ++t.allocations;
    if (t.live_bytes > t.peak_bytes) {
        t.peak_bytes = t.live_bytes;
        t.peak_event = e;
    }
}

void Replay::apply_free(const Event& e, uint64_t address, LiveChange& c) {
    c.kind = LiveChange::Kind::free;
    c.pool = pool_of(e);
    c.address = address;
    c.failed = e.result != 0;
    LiveTable& table = tables_[int(c.pool)];
    PoolTotals& t = totals_[int(c.pool)];
    c.outcome = table.remove(address, &c.record);
    if (c.outcome != FreeOutcome::freed) c.record = LiveRecord{};  // none found
    c.index = table.last_index();
    if (c.failed) {
        // The real free failed and released nothing: the record goes back,
        // into its own tombstone (LiveTable::insert: no growth), its note
        // with it.
        ++failed_frees_;
        if (c.outcome == FreeOutcome::freed) {
            const uint64_t note = table.note(c.index);
            table.insert(c.record);
            c.index = table.last_index();
            table.set_note(c.index, note);
        }
    } else if (c.outcome == FreeOutcome::freed) {
        t.live_bytes -= c.record.size;
        --t.live_count;
        left(c.pool, c.record, false);
    }
}

bool Replay::next_mapping(uint64_t from, uint64_t end, uint64_t& address) const noexcept {
    auto it = mappings_.lower_bound(from);
    if (it == mappings_.end() || *it >= end) return false;
    address = *it;
    return true;
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
