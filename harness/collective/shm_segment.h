// The POSIX shared-memory segment behind a Communicator: its name, its layout
// and the create/attach handshake.
//
// Layout (offsets from the mapping's start; every region 4 KiB aligned):
//   SegmentHeader                       magic, geometry, barrier words, abort
//   RankRecord[world_size]              one per rank, at records_offset
//   slot[world_size] of slot_bytes      rank r writes only slot r, at slots_offset
//
// Fields that peers change concurrently are plain integers accessed through
// std::atomic_ref, so the layout is fixed by this header and needs no
// constructor to run in the attaching processes.
#pragma once

#include <pthread.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace allocscope::harness::collective {

inline constexpr uint64_t kSegmentMagic = 0x3130'4c4c'4f43'5341;  // "ASCOLL01"
inline constexpr uint32_t kSegmentVersion = 1;

enum class RankState : uint32_t {
    absent = 0,    // not attached yet
    attached = 1,  // holds its RankRecord::alive mutex
    departed = 2,  // destroyed its Communicator
    dead = 3,      // a peer found its alive mutex owner-dead
};

// What a rank announced for one collective call, so peers can refuse a
// mismatched call instead of exchanging garbage.
struct CallRecord {
    uint64_t sequence;
    uint64_t count;  // bytes or elements, as the collective defines it
    uint32_t kind;   // CollectiveKind
    int32_t root;    // broadcast root, else -1
};

struct alignas(64) RankRecord {
    // Robust and process-shared; locked by the rank's constructing thread for
    // as long as it is attached. A peer's trylock returning EOWNERDEAD is how
    // a dead rank is noticed (a pid would be a zombie, or reused).
    pthread_mutex_t alive;
    uint32_t state;     // RankState, atomic
    int32_t pid;        // for messages only
    uint64_t arrivals;  // barrier waits this rank has entered, atomic
    // Indexed by sequence parity: a rank writes call s+2's record only after
    // every peer has passed a barrier of call s+1, so after checking call s.
    CallRecord calls[2];
};

struct alignas(64) SegmentHeader {
    uint64_t magic;  // stored last by the creator (release): all else is set up
    uint32_t version;
    uint32_t world_size;
    uint64_t slot_bytes;
    uint64_t records_offset;
    uint64_t slots_offset;
    uint64_t total_bytes;
    alignas(64) uint32_t arrived;      // ranks inside the current barrier, atomic
    alignas(64) uint32_t generation;   // futex word; bumped when a barrier completes
    alignas(64) uint32_t abort_claim;  // first aborting rank wins the right to write the reason
    uint32_t abort_rank;               // 0, or 1 + the aborting rank (stored after the two below)
    uint64_t abort_sequence;           // the call in which it failed
    char abort_reason[512];
};

class SharedSegment {
  public:
    using Deadline = std::chrono::steady_clock::time_point;

    // Rank 0: O_EXCL creation, memory reserved up front (a tmpfs short of
    // space fails here with a message instead of SIGBUS on first touch).
    static SharedSegment create(const std::string& name, int world_size, size_t slot_bytes);
    // Other ranks: retries until the creator has published the segment or the
    // deadline passes; checks that the geometry matches.
    static SharedSegment attach(const std::string& name, int world_size, size_t slot_bytes,
                                Deadline deadline);

    // "/allocscope-coll-<id>" with characters outside [A-Za-z0-9._-] replaced.
    static std::string name_for(std::string_view rendezvous);
    static size_t total_bytes(int world_size, size_t slot_bytes);

    SharedSegment(SharedSegment&& other) noexcept;
    SharedSegment& operator=(SharedSegment&&) = delete;
    SharedSegment(const SharedSegment&) = delete;
    ~SharedSegment();  // unmaps; the creator also unlinks if it has not yet

    SegmentHeader& header() const { return *static_cast<SegmentHeader*>(base_); }
    RankRecord& record(int rank) const;
    std::byte* slot(int rank) const;
    const std::string& name() const { return name_; }

    // Removes the name once every rank has attached (the mapping stays), so
    // no /dev/shm entry outlives the run however the ranks end. Idempotent.
    void unlink();

  private:
    SharedSegment(std::string name, void* base, size_t size, bool linked)
        : name_(std::move(name)), base_(base), size_(size), linked_(linked) {}

    std::string name_;
    void* base_;
    size_t size_;
    bool linked_;  // created by this process and not unlinked yet
};

}  // namespace allocscope::harness::collective
