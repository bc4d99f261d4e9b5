// The live-allocation table: address -> record of the allocation that is
// alive there. Used only through core/replay.h's Replay, one per pool: the
// one live set the interposer's writer thread (whose plugin host views it),
// a plugin host fed standalone, reports and exports all keep, so all of
// them count exactly the same way.
//
// One open-addressing table with linear probing over the slots' keys (an
// address, its state and the index of its record, 16 bytes), the records
// in a dense array beside them (its free entries reused), so a probe reads
// keys only and a rehash moves keys only; not thread-safe (its one
// user in the traced process is the writer thread). A freed address stays
// as a tombstone so a second free of it is told apart from a free of an
// address never seen; tombstones are dropped when the table rehashes, after
// which such a free counts as unknown. Invariants:
//   live_count() == number of live entries
//   live_bytes() == sum of their sizes
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "event.h"

namespace allocscope {

struct LiveRecord {
    uint64_t address = 0;
    uint64_t size = 0;
    uint64_t seq = 0;  // seq of the alloc event
    uint64_t step = 0;
    uint64_t stream = 0;
    uint32_t stack = 0;
    uint32_t layer = 0;
    uint32_t phase = 0;
    uint32_t tid = 0;
    int32_t device = -1;
    MemoryKind memory = MemoryKind::none;
    Api api = Api::none;
    bool graph_pool = false;  // a CUDA graph's private pool holds it (kFlagGraphPool)

    // The record an alloc event leaves in the table.
    static LiveRecord from(const Event& alloc) noexcept;
};

enum class FreeOutcome {
    freed,        // the address was live; its record was removed
    unknown,      // never seen (allocated before allocscope was loaded)
    double_free,  // already freed and not allocated again since
};

class LiveTable {
  public:
    // Records a new allocation. If the address was already live (its free was
    // never seen) the old record is replaced, copied to `replaced` when
    // given, and false is returned.
    bool insert(const LiveRecord& record, LiveRecord* replaced = nullptr);
    // Removes the record at `address`, copying it to `removed` when freed.
    FreeOutcome remove(uint64_t address, LiveRecord* removed);
    bool contains(uint64_t address) const;

    // The index of the record the last insert or remove touched (one that
    // found nothing: unchanged), valid until the next insert or remove:
    // what note() and set_note() take.
    uint32_t last_index() const noexcept { return last_index_; }
    // A word its user keeps with each live record (the analysis: the scope
    // an allocation was made in), 0 for a record inserted new. A record
    // that replaces a live one at its address keeps the replaced one's
    // note until it is set, so that the replaced record's can still be read.
    uint64_t note(uint32_t index) const noexcept { return notes_[index]; }
    void set_note(uint32_t index, uint64_t note) noexcept { notes_[index] = note; }

    uint64_t live_bytes() const noexcept { return live_bytes_; }
    uint64_t live_count() const noexcept { return live_; }
    uint64_t unknown_frees() const noexcept { return unknown_; }
    uint64_t double_frees() const noexcept { return doubles_; }
    uint64_t replaced() const noexcept { return replaced_; }

    // The live records, in no particular order.
    std::vector<LiveRecord> snapshot() const;
    // Calls f(record) on the live records, in no particular order, until it
    // returns true; returns whether it did.
    template <class F>
    bool any_of(F&& f) const {
        for (size_t i = 0; i < keys_.size(); ++i)
            if (keys_[i].state == SlotState::live &&
                f(static_cast<const LiveRecord&>(records_[keys_[i].record])))
                return true;
        return false;
    }

  private:
    enum class SlotState : uint8_t { empty = 0, live = 1, freed = 2 };
    struct Key {
        uint64_t address = 0;  // a live record's, or a tombstone's
        uint32_t record = 0;   // a live one's: its index in records_
        SlotState state = SlotState::empty;
    };
    size_t probe(uint64_t address, bool& found) const noexcept;
    void rehash();

    std::vector<Key> keys_;            // size is 0 or a power of two
    std::vector<LiveRecord> records_;  // the live keys' records, and free entries
    std::vector<uint64_t> notes_;      // each record entry's note (set_note)
    std::vector<uint32_t> free_;       // indexes of records_'s free entries
    std::vector<Key> spare_;           // a rehash in place: the live keys
    uint64_t live_ = 0;
    uint64_t freed_ = 0;  // tombstones
    uint64_t live_bytes_ = 0;
    uint64_t unknown_ = 0;
    uint64_t doubles_ = 0;
    uint64_t replaced_ = 0;
    uint32_t last_index_ = 0;
};

}  // namespace allocscope
