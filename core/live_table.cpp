#include "live_table.h"

#include <bit>
#include <mutex>

namespace allocscope {

namespace {

enum class SlotState : uint8_t { empty = 0, live = 1, freed = 2 };

uint64_t mix(uint64_t x) noexcept {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

// Counter updates are plain load+store under the lock; atomics only so that
// readers summing without the lock see whole values.
void bump(std::atomic<uint64_t>& counter, int64_t delta) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + static_cast<uint64_t>(delta),
                  std::memory_order_relaxed);
}

}  // namespace

struct alignas(64) LiveTable::Shard {
    struct Slot {
        SlotState state = SlotState::empty;
        LiveRecord record;
    };
    mutable SpinLock lock;
    std::vector<Slot> slots;  // size is 0 or a power of two
    size_t live = 0;
    size_t freed = 0;
    std::atomic<uint64_t> live_bytes{0};
    std::atomic<uint64_t> live_count{0};
    std::atomic<uint64_t> unknown{0};
    std::atomic<uint64_t> doubles{0};
    std::atomic<uint64_t> replaced{0};

    // Index of `address`'s slot, or of the first reusable slot on its probe
    // path when absent (a tombstone of another address or an empty slot).
    size_t probe(uint64_t address, bool& found) const noexcept {
        const size_t mask = slots.size() - 1;
        size_t first_reusable = SIZE_MAX;
        for (size_t i = mix(address) & mask;; i = (i + 1) & mask) {
            const Slot& s = slots[i];
            if (s.state == SlotState::empty) {
                found = false;
                return first_reusable != SIZE_MAX ? first_reusable : i;
            }
            if (s.record.address == address) {
                found = true;
                return i;
            }
            if (s.state == SlotState::freed && first_reusable == SIZE_MAX) first_reusable = i;
        }
    }

    // Keeps at least a quarter of the slots empty so probes terminate.
    void reserve_one() {
        if (!slots.empty() && (live + freed + 1) * 4 <= slots.size() * 3) return;
        size_t want = std::bit_ceil(std::max<size_t>(16, (live + 1) * 2));
        std::vector<Slot> old = std::move(slots);
        slots.assign(want, Slot{});
        freed = 0;
        const size_t mask = want - 1;
        for (const Slot& s : old) {
            if (s.state != SlotState::live) continue;
            size_t i = mix(s.record.address) & mask;
            while (slots[i].state != SlotState::empty)
                i = (i + 1) & mask;
            slots[i] = s;
        }
    }
};

LiveRecord LiveRecord::from(const Event& e) noexcept {
    LiveRecord r;
    r.address = e.address;
    r.size = e.size;
    r.seq = e.seq;
    r.step = e.step;
    r.stream = e.stream;
    r.stack = e.stack;
    r.layer = e.layer;
    r.phase = e.phase;
    r.tid = e.tid;
    r.device = e.device;
    r.memory = e.memory;
    r.api = e.api;
    return r;
}

LiveTable::LiveTable() : shards_(new Shard[size_t{1} << kShardBits]) {}
LiveTable::~LiveTable() = default;

LiveTable::Shard& LiveTable::shard_for(uint64_t address) const noexcept {
    return shards_[mix(address ^ 0x5bd1e995) >> (64 - kShardBits)];
}

bool LiveTable::insert(const LiveRecord& record, LiveRecord* replaced) {
    Shard& sh = shard_for(record.address);
    std::lock_guard lock(sh.lock);
    sh.reserve_one();
    bool found = false;
    size_t i = sh.probe(record.address, found);
    Shard::Slot& slot = sh.slots[i];
    bool fresh = true;
    if (found && slot.state == SlotState::live) {
        if (replaced) *replaced = slot.record;
        bump(sh.live_bytes, -static_cast<int64_t>(slot.record.size));
        bump(sh.replaced, 1);
        fresh = false;
    } else {
        if (slot.state == SlotState::freed) --sh.freed;
        ++sh.live;
        bump(sh.live_count, 1);
    }
    slot.state = SlotState::live;
    slot.record = record;
    bump(sh.live_bytes, static_cast<int64_t>(record.size));
    return fresh;
}

FreeOutcome LiveTable::remove(uint64_t address, LiveRecord* removed) {
    Shard& sh = shard_for(address);
    std::lock_guard lock(sh.lock);
    bool found = false;
    if (!sh.slots.empty()) {
        size_t i = sh.probe(address, found);
        if (found) {
            Shard::Slot& slot = sh.slots[i];
            if (slot.state == SlotState::freed) {
                bump(sh.doubles, 1);
                return FreeOutcome::double_free;
            }
            if (removed) *removed = slot.record;
            slot.state = SlotState::freed;
            --sh.live;
            ++sh.freed;
            bump(sh.live_count, -1);
            bump(sh.live_bytes, -static_cast<int64_t>(slot.record.size));
            return FreeOutcome::freed;
        }
    }
    bump(sh.unknown, 1);
    return FreeOutcome::unknown;
}

bool LiveTable::contains(uint64_t address) const {
    Shard& sh = shard_for(address);
    std::lock_guard lock(sh.lock);
    if (sh.slots.empty()) return false;
    bool found = false;
    size_t i = sh.probe(address, found);
    return found && sh.slots[i].state == SlotState::live;
}

template <typename Field>
uint64_t LiveTable::sum(Field field) const noexcept {
    uint64_t total = 0;
    for (size_t s = 0; s < (size_t{1} << kShardBits); ++s) {
        total += (shards_[s].*field).load(std::memory_order_relaxed);
    }
    return total;
}

uint64_t LiveTable::live_bytes() const noexcept {
    return sum(&Shard::live_bytes);
}
uint64_t LiveTable::live_count() const noexcept {
    return sum(&Shard::live_count);
}
uint64_t LiveTable::unknown_frees() const noexcept {
    return sum(&Shard::unknown);
}
uint64_t LiveTable::double_frees() const noexcept {
    return sum(&Shard::doubles);
}
uint64_t LiveTable::replaced() const noexcept {
    return sum(&Shard::replaced);
}

std::vector<LiveRecord> LiveTable::snapshot() const {
    std::vector<LiveRecord> out;
    out.reserve(live_count());
    for (size_t s = 0; s < (size_t{1} << kShardBits); ++s) {
        Shard& sh = shards_[s];
        std::lock_guard lock(sh.lock);
        for (const Shard::Slot& slot : sh.slots) {
            if (slot.state == SlotState::live) out.push_back(slot.record);
        }
    }
    return out;
}

}  // namespace allocscope
