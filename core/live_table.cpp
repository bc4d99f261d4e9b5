#include "live_table.h"

#include <algorithm>
#include <bit>

namespace allocscope {

namespace {

uint64_t mix(uint64_t x) noexcept {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

}  // namespace

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
    r.graph_pool = (e.flags & kFlagGraphPool) != 0;
    return r;
}

// Index of `address`'s slot, or of the first reusable slot on its probe path
// when absent (a tombstone of another address or an empty slot).
size_t LiveTable::probe(uint64_t address, bool& found) const noexcept {
    const size_t mask = keys_.size() - 1;
    const Key* keys = keys_.data();
    size_t first_reusable = SIZE_MAX;
    for (size_t i = mix(address) & mask;; i = (i + 1) & mask) {
        const Key& k = keys[i];
        if (k.state == SlotState::empty) {
            found = false;
            return first_reusable != SIZE_MAX ? first_reusable : i;
        }
        if (k.address == address) {
            found = true;
            return i;
        }
        if (k.state == SlotState::freed && first_reusable == SIZE_MAX) first_reusable = i;
    }
}

// Called before a new address would leave less than a quarter of the slots
// empty (probes must find an empty slot to end). Keeps the live keys only,
// so it drops every tombstone. Out of memory, it throws and leaves the
// table as it was.
void LiveTable::rehash() {
    const size_t want = std::bit_ceil(std::max<size_t>(16, (live_ + 1) * 2));
    if (want == keys_.size()) {
        // The same size (tombstones, not live records, filled it): in place,
        // the live keys set aside and put back in slot order, which leaves
        // each where a fresh table would.
        spare_.reserve(live_);  // may throw: the table is still whole
        spare_.clear();
        for (const Key& k : keys_) {
            if (k.state == SlotState::live) spare_.push_back(k);
        }
        std::fill(keys_.begin(), keys_.end(), Key{});
        const size_t mask = want - 1;
        for (const Key& k : spare_) {
            size_t i = mix(k.address) & mask;
            while (keys_[i].state != SlotState::empty)
                i = (i + 1) & mask;
            keys_[i] = k;
        }
        freed_ = 0;
        return;
    }
    // A new size: the records are packed too, so that a table that shrank
    // keeps no room for more than it holds.
    std::vector<Key> fresh_keys(want);  // may throw: the table is still whole
    std::vector<LiveRecord> fresh_records;
    fresh_records.reserve(live_);
    std::vector<uint64_t> fresh_notes;
    fresh_notes.reserve(live_);
    const size_t mask = want - 1;
    for (const Key& k : keys_) {
        if (k.state != SlotState::live) continue;
        size_t i = mix(k.address) & mask;
        while (fresh_keys[i].state != SlotState::empty)
            i = (i + 1) & mask;
        fresh_keys[i] = {k.address, uint32_t(fresh_records.size()), SlotState::live};
        fresh_records.push_back(records_[k.record]);
        fresh_notes.push_back(notes_[k.record]);
    }
    keys_.swap(fresh_keys);
    records_.swap(fresh_records);
    notes_.swap(fresh_notes);
    free_.clear();
    freed_ = 0;
}

bool LiveTable::insert(const LiveRecord& record, LiveRecord* replaced) {
    // An address seen before (live, or its tombstone) keeps its slot: the
    // table grows only for a new address.
    bool found = false;
    size_t i = keys_.empty() ? 0 : probe(record.address, found);
    if (!found && (keys_.empty() || (live_ + freed_ + 1) * 4 > keys_.size() * 3)) {
        rehash();
        i = probe(record.address, found);
    }
    Key& key = keys_[i];
    if (found && key.state == SlotState::live) {
        LiveRecord& slot = records_[key.record];
        last_index_ = key.record;
        if (replaced) *replaced = slot;
        live_bytes_ -= slot.size;
        ++replaced_;
        slot = record;
        live_bytes_ += record.size;
        return false;
    }
    // A record entry for the new live key: a free one, else a new one.
    uint32_t index;
    if (!free_.empty()) {
        index = free_.back();
        free_.pop_back();
        records_[index] = record;
        notes_[index] = 0;
    } else {
        notes_.push_back(0);  // may throw: nothing has changed
        try {
            records_.push_back(record);
        } catch (...) {
            notes_.pop_back();
            throw;
        }
        index = uint32_t(records_.size() - 1);
    }
    last_index_ = index;
    if (key.state == SlotState::freed) --freed_;
    ++live_;
    key.state = SlotState::live;
    key.address = record.address;
    key.record = index;
    live_bytes_ += record.size;
    return true;
}

FreeOutcome LiveTable::remove(uint64_t address, LiveRecord* removed) {
    bool found = false;
    if (!keys_.empty()) {
        const size_t i = probe(address, found);
        if (found) {
            Key& key = keys_[i];
            if (key.state == SlotState::freed) {
                ++doubles_;
                return FreeOutcome::double_free;
            }
            free_.push_back(key.record);  // may throw: nothing has changed
            last_index_ = key.record;
            const LiveRecord& slot = records_[key.record];
            if (removed) *removed = slot;
            key.state = SlotState::freed;
            --live_;
            ++freed_;
            live_bytes_ -= slot.size;
            return FreeOutcome::freed;
        }
    }
    ++unknown_;
    return FreeOutcome::unknown;
}

bool LiveTable::contains(uint64_t address) const {
    if (keys_.empty()) return false;
    bool found = false;
    const size_t i = probe(address, found);
    return found && keys_[i].state == SlotState::live;
}

std::vector<LiveRecord> LiveTable::snapshot() const {
    std::vector<LiveRecord> out;
    out.reserve(live_);
    for (size_t i = 0; i < keys_.size(); ++i) {
        if (keys_[i].state == SlotState::live) out.push_back(records_[keys_[i].record]);
    }
    return out;
}

}  // namespace allocscope
