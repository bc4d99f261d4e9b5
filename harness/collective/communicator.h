// Collectives between the rank processes of one host through POSIX shared
// memory: the sim backend's stand-in for NCCL.
//
// Protocol. Rank 0 creates the segment (shm_segment.h), the others attach;
// each rank then joins (locks its robust "alive" mutex, marks itself attached)
// and all meet in a first barrier, after which rank 0 unlinks the name. Every
// collective call first writes a CallRecord (kind, sequence, size, root),
// then runs one or more steps. A step: each rank copies at most half of its
// slot into the half selected by the step counter's parity, all ranks meet
// in the barrier, each reads what it needs from its peers' halves. The two
// halves alternate, so one barrier per step suffices: half p is rewritten
// two barriers later, which no rank passes before every rank has finished
// reading it. After the first barrier of a call every rank compares all
// records with its own and refuses a mismatch.
//
// Barrier: a counter plus a generation word; the last arrival resets the
// counter and bumps the generation (FUTEX_WAKE); the others FUTEX_WAIT on the
// generation in slices, checking between slices for an abort published by a
// peer, a peer that died (its alive mutex is owner-dead) or left, and the
// timeout. Any failure marks this communicator broken, publishes an abort
// (reason and call number) so the peers stop waiting at once, and throws
// CollectiveError naming the rank, the collective and the reason. A rank
// fails a call when the abort was published in that call or an earlier one,
// so all ranks fail the same call. Messages number calls from the join (#1).
//
// Reductions read the peers' contributions in rank order and accumulate in
// fp32, so every rank computes bit-identical sums and runs are reproducible.
//
// Fork policy: a forked child inherits the mapping but is not a rank; it
// must not use the communicator. Threads: one thread per rank calls the
// collectives, and the thread that constructs the communicator must destroy
// it and outlive it (the alive mutex is owned by that thread; if it exits,
// the peers see this rank as dead).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "collective/rank_info.h"
#include "collective/shm_segment.h"

namespace allocscope::harness::collective {

enum class Op { sum, avg };

class CollectiveError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

struct CommunicatorOptions {
    // Longest wait for peers in one barrier (and for attaching): a peer that
    // is alive but stuck makes every call fail after this long.
    std::chrono::milliseconds timeout{60'000};
    // Shared memory per rank; messages larger than half of it go in steps.
    size_t slot_bytes = size_t{8} << 20;
};

class Communicator {
  public:
    static constexpr int kMaxWorldSize = 256;

    // Creates (rank 0) or attaches to the segment named after `rendezvous`
    // and waits until all ranks have joined. Throws std::invalid_argument for
    // an impossible RankInfo or options (including ranks on several hosts:
    // local_rank != rank), CollectiveError when the ranks cannot meet.
    Communicator(const RankInfo& rank, std::string_view rendezvous,
                 CommunicatorOptions options = {});
    ~Communicator();
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_.rank; }
    int world_size() const { return rank_.world_size; }

    void barrier();
    // recv (world_size * bytes_per_rank bytes) = every rank's send, in rank
    // order. send may be recv + rank * bytes_per_rank (in place).
    void all_gather(const void* send, size_t bytes_per_rank, void* recv);
    // send holds world_size chunks of count_per_rank elements; recv gets the
    // reduction of every rank's chunk number rank(). send may be
    // recv - rank * count_per_rank (in place).
    void reduce_scatter(const float* send, size_t count_per_rank, float* recv, Op op);
    // Same for bf16 bit patterns: widened to fp32, reduced in fp32, rounded to
    // nearest even once at the end.
    void reduce_scatter_bf16(const uint16_t* send, size_t count_per_rank, uint16_t* recv, Op op);
    // recv = reduction of every rank's send; send may equal recv.
    void all_reduce(const float* send, float* recv, size_t count, Op op = Op::sum);
    // Every rank's data = root's data.
    void broadcast(void* data, size_t bytes, int root);

    // Removes a segment left behind by ranks that died before they all
    // attached; launch_ranks calls it after the ranks exit. No error if absent.
    static void remove_segment(std::string_view rendezvous);

  private:
    struct Call;

    Call begin(uint32_t kind, uint64_t count, int root);
    void sync(Call& call);
    void wait_for_generation(uint32_t generation, uint64_t target, const Call& call);
    void check_abort(const Call& call, uint64_t up_to_sequence);
    void check_peers(uint32_t generation, uint64_t target, const Call& call);
    [[noreturn]] void fail(const Call& call, const std::string& reason);
    void verify_records(const Call& call);
    std::byte* half(int rank, uint64_t step) const;
    size_t half_bytes() const { return options_.slot_bytes / 2; }
    template <class Elem>
    void reduce_scatter_impl(uint32_t kind, const Elem* send, size_t count_per_rank, Elem* recv,
                             Op op);
    void depart();

    RankInfo rank_;
    CommunicatorOptions options_;
    SharedSegment segment_;
    uint64_t calls_ = 0;     // collective calls begun, this one included
    uint64_t barriers_ = 0;  // barrier waits entered; its parity picks the slot half
    bool joined_ = false;    // holds the alive mutex, state attached
    std::string broken_;     // the first failure; every later call repeats it
};

}  // namespace allocscope::harness::collective
