// The live set: which allocation is alive at each address, matched to its
// free by one set of rules. Replay keeps one LiveTable per memory pool, and
// live and peak totals per pool. It is the only place where an alloc is
// matched to its free: the interposer's writer thread (filling in each free's
// size and flags before the event is written, apply_written), reports and
// exports, plugins (a host fed standalone keeps one; the traced process's
// host is a view of the writer's, core/plugin_host.h), offline replays and
// tests all go through it, and what they keep beside it (tags, scopes, the
// segments that held blocks) they keep per change it reports (LiveChange).
//
// Matching rules:
//   * an alloc enters its pool's table (pool_of); at an address already live
//     there (its free never seen) it replaces the old record;
//   * a free removes the record at its address in its pool: found (freed),
//     never seen (unknown) or already freed (double free, LiveTable);
//   * a free the runtime refused (result != 0) releases nothing: the record
//     stays live and the free counts as failed;
//   * a range free (kFlagRange: one cuMemUnmap call) frees, in address order,
//     every live mapping (a device segment of api cuMemMap) whose start lies
//     in [address, address + size), each whole, as the driver hooks did
//     before the split moved here. A mapping that starts before the range
//     is not freed by it, even where the range covers its tail. A range that
//     covers no live mapping is a free of `address` alone (unknown or
//     double, as the table says).
#pragma once

#include <array>
#include <cstdint>
#include <set>

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

// One change an event made to the live set, reported by Replay::apply. An
// alloc makes one. A free makes one per allocation it releases (a range free
// one per mapping it covers), or one that releases nothing (unknown, double).
struct LiveChange {
    enum class Kind : uint8_t { alloc, free };
    Kind kind = Kind::alloc;
    Pool pool = Pool::device_segment;
    FreeOutcome outcome = FreeOutcome::freed;  // a free: what the table found
    bool failed = false;                       // a free the runtime refused: the record stays live
    bool replaced = false;                     // an alloc at a live address (its free never seen)
    uint64_t address = 0;          // the address allocated or freed (a range: each mapping's)
    LiveRecord record;             // alloc: the new record; free found: the allocation's
    LiveRecord old;                // an alloc that replaced: the record replaced
    const Event* event = nullptr;  // the event that made the change
    // The record's index in its pool's table (alloc: the new record, which
    // a replaced one shared; free found: the allocation's), for
    // Replay::note and set_note during the callback.
    uint32_t index = 0;

    // Whether live bytes were released (record is what was).
    bool released() const noexcept {
        return kind == Kind::free && outcome == FreeOutcome::freed && !failed;
    }
};

class Replay {
  public:
    // Applies alloc/free/oom events; other kinds only advance the clock.
    // Calls on_change(const LiveChange&) for each change, in order. Returns
    // the outcome for frees (FreeOutcome::freed for other events, and for a
    // range free that covered a mapping). Throws only when out of memory
    // growing a table; then nothing has changed for that change.
    template <class F>
    FreeOutcome apply(const Event& event, F&& on_change);
    // The same without a callback; a free that found its allocation copies
    // its record (a range free's first) to `freed` when given.
    FreeOutcome apply(const Event& event, LiveRecord* freed = nullptr);
    // What the writer does before an event reaches the trace: applies it,
    // then fills a free in with what the table knew. A free found gets its
    // allocation's size, device and memory kind; one not found is flagged
    // kFlagUnknownAddress or kFlagDoubleFree. A range free keeps its range
    // in `size`, takes device and memory from its first mapping, and is
    // flagged only when it covered none.
    template <class F>
    FreeOutcome apply_written(Event& event, F&& on_change);

    const PoolTotals& totals(Pool pool) const noexcept { return totals_[int(pool)]; }
    const LiveTable& table(Pool pool) const noexcept { return tables_[int(pool)]; }
    // The user's word kept with a live record (LiveTable::note), by a
    // change's index; a record is made with 0.
    uint64_t note(Pool pool, uint32_t index) const noexcept {
        return tables_[int(pool)].note(index);
    }
    void set_note(Pool pool, uint32_t index, uint64_t note) noexcept {
        tables_[int(pool)].set_note(index, note);
    }
    uint64_t unknown_frees() const noexcept;
    uint64_t double_frees() const noexcept;
    uint64_t failed_frees() const noexcept { return failed_frees_; }
    uint64_t oom_events() const noexcept { return oom_events_; }
    uint64_t largest_failed_request() const noexcept { return largest_failed_request_; }
    // Plain driver allocations live (is_direct_driver_allocation: device
    // segments libraries take for themselves), a part of device_segment's.
    uint64_t direct_driver_live_bytes() const noexcept { return direct_bytes_; }
    uint64_t direct_driver_live_count() const noexcept { return direct_count_; }
    // Blocks of CUDA graphs' private pools (kFlagGraphPool), a part of
    // device_block's: live now, and over the stream (allocations, their
    // bytes, the most live at once).
    struct GraphPoolTotals {
        uint64_t live_bytes = 0;
        uint64_t live_count = 0;
        uint64_t allocations = 0;
        uint64_t allocated_bytes = 0;
        uint64_t peak_bytes = 0;

        bool operator==(const GraphPoolTotals&) const = default;
    };
    const GraphPoolTotals& graph_pools() const noexcept { return graph_; }
    // The live mappings' addresses (device segments of api cuMemMap).
    const std::set<uint64_t>& mappings() const noexcept { return mappings_; }

  private:
    // The change apply() reports, as a LiveChange{} made for `e` would be:
    // one kept from call to call, so that its 160 bytes are not cleared
    // whole for each event; only what the last change set beyond what every
    // change sets is cleared (record: by apply_free where it found none).
    LiveChange& blank_change(const Event& e) noexcept {
        LiveChange& c = change_;
        c.kind = LiveChange::Kind::alloc;
        c.pool = Pool::device_segment;
        c.outcome = FreeOutcome::freed;
        c.failed = false;
        c.replaced = false;
        c.address = 0;
        c.event = &e;
        if (old_set_) {
            c.old = LiveRecord{};
            old_set_ = false;
        }
        return c;
    }
    void apply_alloc(const Event& e, LiveChange& c);
    void apply_free(const Event& e, uint64_t address, LiveChange& c);
    void entered(Pool pool, const LiveRecord& r) noexcept;
    // `still_mapped`: an alloc of a mapping replaced it (the index keeps it).
    void left(Pool pool, const LiveRecord& r, bool still_mapped) noexcept;
    // The first live mapping at or after `from` and before `end`, or false.
    bool next_mapping(uint64_t from, uint64_t end, uint64_t& address) const noexcept;

    std::array<LiveTable, kPoolCount> tables_;
    std::array<PoolTotals, kPoolCount> totals_;
    uint64_t failed_frees_ = 0;
    uint64_t oom_events_ = 0;
    uint64_t largest_failed_request_ = 0;
    uint64_t direct_bytes_ = 0;
    uint64_t direct_count_ = 0;
    GraphPoolTotals graph_;
    std::set<uint64_t> mappings_;
    LiveChange change_;     // blank_change's
    bool old_set_ = false;  // change_.old holds a replaced record
};

template <class F>
FreeOutcome Replay::apply(const Event& e, F&& on_change) {
    // The change is made only where there is one: most events (tags, marks,
    // steps) are none, and it is large.
    switch (e.kind) {
        case EventKind::alloc: {
            LiveChange& c = blank_change(e);
            apply_alloc(e, c);
            old_set_ = c.replaced;
            on_change(static_cast<const LiveChange&>(c));
            return FreeOutcome::freed;
        }
        case EventKind::free: {
            LiveChange& c = blank_change(e);
            if ((e.flags & kFlagRange) == 0) {
                apply_free(e, e.address, c);
                on_change(static_cast<const LiveChange&>(c));
                return c.outcome;
            }
            const uint64_t end = e.address + e.size < e.address ? UINT64_MAX : e.address + e.size;
            bool covered = false;
            uint64_t at = 0;
            for (uint64_t from = e.address; from < end && next_mapping(from, end, at);
                 from = at + 1) {
                covered = true;
                blank_change(e);
                apply_free(e, at, c);
                on_change(static_cast<const LiveChange&>(c));
                if (at == UINT64_MAX) break;
            }
            if (covered) return FreeOutcome::freed;
            apply_free(e, e.address, c);
            on_change(static_cast<const LiveChange&>(c));
            return c.outcome;
        }
        case EventKind::oom:
            ++oom_events_;
            if (e.size > largest_failed_request_) largest_failed_request_ = e.size;
            return FreeOutcome::freed;
        default:
            return FreeOutcome::freed;
    }
}

template <class F>
FreeOutcome Replay::apply_written(Event& e, F&& on_change) {
    bool first = true;
    const FreeOutcome outcome = apply(e, [&](const LiveChange& c) {
        if (c.kind == LiveChange::Kind::free && first && c.outcome == FreeOutcome::freed) {
            if ((e.flags & kFlagRange) == 0) e.size = c.record.size;
            e.device = c.record.device;
            e.memory = c.record.memory;
            first = false;
        }
        on_change(c);
    });
    if (e.kind == EventKind::free && outcome == FreeOutcome::unknown)
        e.flags |= kFlagUnknownAddress;
    else if (e.kind == EventKind::free && outcome == FreeOutcome::double_free)
        e.flags |= kFlagDoubleFree;
    return outcome;
}

}  // namespace allocscope
