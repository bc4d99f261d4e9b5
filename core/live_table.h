// The live-allocation table: address -> record of the allocation that is
// alive there. Used in the traced process (concurrently, from the hooks) and
// offline (replaying a trace), so both count exactly the same way.
//
// Sharded by address; each shard is an open-addressing table under a
// SpinLock. A freed address stays in its shard as a tombstone so a second
// free of it is told apart from a free of an address never seen; tombstones
// are dropped when a shard rehashes, after which such a free counts as
// unknown. Counters live in the shards (written under the shard's lock, so
// threads touching different shards share no cache line) and are summed on
// read. Invariants, per shard and so per table once writers are quiet:
//   live_count() == number of live entries
//   live_bytes() == sum of their sizes
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "event.h"
#include "spinlock.h"

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
    LiveTable();
    ~LiveTable();
    LiveTable(const LiveTable&) = delete;
    LiveTable& operator=(const LiveTable&) = delete;

    // Records a new allocation. If the address was already live (its free was
    // never seen) the old record is replaced, copied to `replaced` when
    // given, and false is returned.
    bool insert(const LiveRecord& record, LiveRecord* replaced = nullptr);
    // Removes the record at `address`, copying it to `removed` when freed.
    FreeOutcome remove(uint64_t address, LiveRecord* removed);
    bool contains(uint64_t address) const;

    uint64_t live_bytes() const noexcept;
    uint64_t live_count() const noexcept;
    uint64_t unknown_frees() const noexcept;
    uint64_t double_frees() const noexcept;
    uint64_t replaced() const noexcept;

    // A consistent copy per shard (not a global snapshot under concurrency).
    std::vector<LiveRecord> snapshot() const;

    static constexpr int kShardBits = 6;

  private:
    struct Shard;
    Shard& shard_for(uint64_t address) const noexcept;

    template <typename Field>
    uint64_t sum(Field field) const noexcept;

    std::unique_ptr<Shard[]> shards_;
};

}  // namespace allocscope
