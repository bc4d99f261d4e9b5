#include "collective/communicator.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "model/bf16.h"

namespace allocscope::harness::collective {

namespace {

enum CollectiveKind : uint32_t {
    kJoin = 1,
    kBarrier,
    kAllGather,
    kReduceScatter,
    kReduceScatterBf16,
    kAllReduce,
    kBroadcast,
};

// How often a waiting rank looks for dead peers and aborts; a peer's death
// wakes nobody, so this bounds how late it is noticed.
constexpr auto kPollSlice = std::chrono::milliseconds(20);

template <class T>
std::atomic_ref<T> shared(T& field) {
    static_assert(std::atomic_ref<T>::is_always_lock_free, "shared across processes");
    return std::atomic_ref<T>(field);
}

// Not FUTEX_PRIVATE_FLAG: the word lives in a mapping shared between processes.
void futex_wait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    timespec relative{static_cast<time_t>(seconds.count()),
                      static_cast<long>((timeout - seconds).count())};
    syscall(SYS_futex, word, FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futex_wake_all(uint32_t* word) {
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string describe(uint32_t kind, uint64_t sequence, uint64_t count, int root) {
    const std::string n = std::to_string(count);
    std::string text;
    switch (kind) {
        case kJoin:
            text = "join";
            break;
        case kBarrier:
            text = "barrier";
            break;
        case kAllGather:
            text = "all_gather(" + n + " B per rank)";
            break;
        case kReduceScatter:
            text = "reduce_scatter(" + n + " fp32 per rank)";
            break;
        case kReduceScatterBf16:
            text = "reduce_scatter_bf16(" + n + " bf16 per rank)";
            break;
        case kAllReduce:
            text = "all_reduce(" + n + " fp32)";
            break;
        case kBroadcast:
            text = "broadcast(" + n + " B from rank " + std::to_string(root) + ")";
            break;
        default:
            text = "unknown collective " + std::to_string(kind);
            break;
    }
    return text + " #" + std::to_string(sequence);
}

// bf16 travels as its bit pattern; the model's conversions give it meaning.
float widen(float value) {
    return value;
}
float widen(uint16_t bf16) {
    return model::to_float(model::Bf16{bf16});
}
void narrow(float value, float& out) {
    out = value;
}
void narrow(float value, uint16_t& out) {
    out = model::to_bf16(value).bits;
}

// out[i] = source(0)[i] + source(1)[i] + ... in rank order, in fp32, so every
// rank that reduces the same inputs gets the same bits.
template <class Elem, class Source>
void reduce_in_rank_order(Source source, int world_size, size_t n, Elem* out, Op op) {
    constexpr size_t kBlock = 512;
    float acc[kBlock];
    for (size_t base = 0; base < n; base += kBlock) {
        const size_t m = std::min(kBlock, n - base);
        const Elem* first = source(0) + base;
        for (size_t i = 0; i < m; ++i)
            acc[i] = widen(first[i]);
        for (int s = 1; s < world_size; ++s) {
            const Elem* in = source(s) + base;
            for (size_t i = 0; i < m; ++i)
                acc[i] += widen(in[i]);
        }
        if (op == Op::avg) {
            const float divisor = static_cast<float>(world_size);
            for (size_t i = 0; i < m; ++i)
                acc[i] /= divisor;
        }
        for (size_t i = 0; i < m; ++i)
            narrow(acc[i], out[base + i]);
    }
}

void copy_bytes(void* to, const void* from, size_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);
}

RankInfo checked(const RankInfo& rank) {
    if (rank.world_size < 1 || rank.world_size > Communicator::kMaxWorldSize) {
        throw std::invalid_argument("world size " + std::to_string(rank.world_size) +
                                    " is outside [1, " +
                                    std::to_string(Communicator::kMaxWorldSize) + "]");
    }
    if (rank.rank < 0 || rank.rank >= rank.world_size) {
        throw std::invalid_argument("rank " + std::to_string(rank.rank) + " is outside [0, " +
                                    std::to_string(rank.world_size) + ")");
    }
    if (rank.local_rank != rank.rank) {
        throw std::invalid_argument("rank " + std::to_string(rank.rank) + " has local rank " +
                                    std::to_string(rank.local_rank) +
                                    ": the shared-memory communicator needs all ranks on one host");
    }
    return rank;
}

CommunicatorOptions checked(CommunicatorOptions options, int world_size) {
    if (options.timeout.count() <= 0) throw std::invalid_argument("timeout must be positive");
    // Halves stay 64-byte aligned, and a reduce-scatter step carries at least
    // 16 fp32 elements per destination.
    options.slot_bytes -= options.slot_bytes % 128;
    if (options.slot_bytes / 2 < 64 * static_cast<size_t>(world_size)) {
        throw std::invalid_argument("slot size " + std::to_string(options.slot_bytes) +
                                    " B is too small for " + std::to_string(world_size) +
                                    " ranks (need at least " + std::to_string(128 * world_size) +
                                    " B)");
    }
    return options;
}

SharedSegment open_segment(const RankInfo& rank, std::string_view rendezvous,
                           const CommunicatorOptions& options) {
    const std::string name = SharedSegment::name_for(rendezvous);
    try {
        if (rank.rank == 0) return SharedSegment::create(name, rank.world_size, options.slot_bytes);
        return SharedSegment::attach(name, rank.world_size, options.slot_bytes,
                                     std::chrono::steady_clock::now() + options.timeout);
    } catch (const std::runtime_error& error) {
        throw CollectiveError("allocscope collective: rank " + std::to_string(rank.rank) +
                              ": join: " + error.what());
    }
}

}  // namespace

struct Communicator::Call {
    uint32_t kind;
    uint64_t sequence;
    uint64_t count;
    int root;
    bool verified;
};

Communicator::Communicator(const RankInfo& rank, std::string_view rendezvous,
                           CommunicatorOptions options)
    : rank_(checked(rank)),
      options_(checked(options, rank.world_size)),
      segment_(open_segment(rank_, rendezvous, options_)) {
    Call call = begin(kJoin, 0, -1);
    RankRecord& me = segment_.record(rank_.rank);
    if (const int rc = pthread_mutex_trylock(&me.alive); rc != 0) {
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(&me.alive);
            pthread_mutex_unlock(&me.alive);
        }
        fail(call, "rank " + std::to_string(rank_.rank) + " of " + segment_.name() +
                       " is held by another process (two processes with one RANK, or a stale "
                       "segment of a crashed run)");
    }
    me.pid = static_cast<int32_t>(getpid());
    uint32_t absent = static_cast<uint32_t>(RankState::absent);
    if (!shared(me.state).compare_exchange_strong(
            absent, static_cast<uint32_t>(RankState::attached), std::memory_order_acq_rel)) {
        pthread_mutex_unlock(&me.alive);
        fail(call, "rank " + std::to_string(rank_.rank) + " was attached before to " +
                       segment_.name() + " (a stale segment, or two processes with one RANK)");
    }
    joined_ = true;
    try {
        sync(call);
    } catch (...) {
        depart();
        throw;
    }
    segment_.unlink();
}

Communicator::~Communicator() {
    depart();
}

void Communicator::depart() {
    if (!joined_) return;
    joined_ = false;
    RankRecord& me = segment_.record(rank_.rank);
    shared(me.state).store(static_cast<uint32_t>(RankState::departed), std::memory_order_release);
    pthread_mutex_unlock(&me.alive);
    futex_wake_all(&segment_.header().generation);  // waiters notice at once, not next slice
}

void Communicator::remove_segment(std::string_view rendezvous) {
    shm_unlink(SharedSegment::name_for(rendezvous).c_str());
}

Communicator::Call Communicator::begin(uint32_t kind, uint64_t count, int root) {
    Call call{kind, ++calls_, count, root, false};
    if (!broken_.empty()) fail(call, "unusable after an earlier failure (" + broken_ + ")");
    segment_.record(rank_.rank).calls[call.sequence & 1] =
        CallRecord{call.sequence, count, kind, root};
    return call;
}

std::byte* Communicator::half(int rank, uint64_t step) const {
    return segment_.slot(rank) + (step & 1) * half_bytes();
}

void Communicator::sync(Call& call) {
    SegmentHeader& header = segment_.header();
    const uint64_t target = ++barriers_;
    shared(segment_.record(rank_.rank).arrivals).store(target, std::memory_order_release);
    const uint32_t generation = shared(header.generation).load(std::memory_order_acquire);
    if (shared(header.arrived).fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<uint32_t>(rank_.world_size)) {
        // Reset before the bump: nobody re-enters until they see the new generation.
        shared(header.arrived).store(0, std::memory_order_relaxed);
        shared(header.generation).fetch_add(1, std::memory_order_release);
        futex_wake_all(&header.generation);
    } else {
        wait_for_generation(generation, target, call);
    }
    // A rank that failed in this call has arrived too, so the barrier can
    // complete around it; the call fails on every rank all the same. An abort
    // from a later call means the aborting rank finished this one.
    check_abort(call, call.sequence);
    if (!call.verified) {
        verify_records(call);
        call.verified = true;
    }
}

void Communicator::wait_for_generation(uint32_t generation, uint64_t target, const Call& call) {
    SegmentHeader& header = segment_.header();
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
        // Abort before generation: an abort from a later call is published
        // after the aborting rank saw this barrier complete, so whoever sees
        // it then sees the new generation too.
        const bool aborted = shared(header.abort_rank).load(std::memory_order_acquire) != 0;
        if (shared(header.generation).load(std::memory_order_acquire) != generation) return;
        if (aborted) check_abort(call, UINT64_MAX);
        check_peers(generation, target, call);
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            std::string behind;
            for (int p = 0; p < rank_.world_size; ++p) {
                RankRecord& peer = segment_.record(p);
                if (shared(peer.arrivals).load(std::memory_order_acquire) >= target) continue;
                behind += (behind.empty() ? "" : ", ") + std::to_string(p);
                if (shared(peer.state).load(std::memory_order_acquire) ==
                    static_cast<uint32_t>(RankState::absent)) {
                    behind += " (never attached)";
                }
            }
            char seconds[32];
            std::snprintf(seconds, sizeof seconds, "%.1f", options_.timeout.count() / 1000.0);
            fail(call, std::string("timed out after ") + seconds + " s waiting for rank " + behind);
        }
        futex_wait(&header.generation, generation,
                   std::min<std::chrono::nanoseconds>(kPollSlice, deadline - now));
    }
}

// Fails if a peer published an abort in a call numbered up to `up_to_sequence`.
void Communicator::check_abort(const Call& call, uint64_t up_to_sequence) {
    SegmentHeader& header = segment_.header();
    const uint32_t who = shared(header.abort_rank).load(std::memory_order_acquire);
    if (who == 0 || static_cast<int>(who) == rank_.rank + 1) return;
    if (header.abort_sequence > up_to_sequence) return;
    fail(call, "rank " + std::to_string(who - 1) + " failed: " + header.abort_reason);
}

void Communicator::check_peers(uint32_t generation, uint64_t target, const Call& call) {
    constexpr auto kAttached = static_cast<uint32_t>(RankState::attached);
    constexpr auto kDead = static_cast<uint32_t>(RankState::dead);
    for (int p = 0; p < rank_.world_size; ++p) {
        if (p == rank_.rank) continue;
        RankRecord& peer = segment_.record(p);
        if (shared(peer.arrivals).load(std::memory_order_acquire) >= target) continue;
        uint32_t state = shared(peer.state).load(std::memory_order_acquire);
        if (state == kAttached) {
            const int rc = pthread_mutex_trylock(&peer.alive);
            if (rc == EBUSY) continue;
            if (rc == EOWNERDEAD) {
                // Record the death before releasing the mutex: the next
                // prober then succeeds in locking and must not read that as
                // an orderly departure.
                uint32_t expected = kAttached;
                shared(peer.state)
                    .compare_exchange_strong(expected, kDead, std::memory_order_acq_rel);
                pthread_mutex_consistent(&peer.alive);
            }
            if (rc == 0 || rc == EOWNERDEAD) pthread_mutex_unlock(&peer.alive);
            state =
                rc == ENOTRECOVERABLE ? kDead : shared(peer.state).load(std::memory_order_acquire);
        }
        if (state == kAttached || state == static_cast<uint32_t>(RankState::absent)) continue;
        // It may have arrived, completed this barrier and left since we looked.
        if (shared(segment_.header().generation).load(std::memory_order_acquire) != generation ||
            shared(peer.arrivals).load(std::memory_order_acquire) >= target) {
            continue;
        }
        fail(call, "rank " + std::to_string(p) + " (pid " + std::to_string(peer.pid) + ") " +
                       (state == kDead ? "died" : "destroyed its communicator") +
                       " without joining this call");
    }
}

void Communicator::fail(const Call& call, const std::string& reason) {
    const std::string what = describe(call.kind, call.sequence, call.count, call.root);
    const std::string message =
        "allocscope collective: rank " + std::to_string(rank_.rank) + ": " + what + ": " + reason;
    if (broken_.empty()) broken_ = message;
    if (joined_) {
        SegmentHeader& header = segment_.header();
        uint32_t unclaimed = 0;
        if (shared(header.abort_claim)
                .compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
            const std::string shared_reason = what + ": " + reason;
            std::snprintf(header.abort_reason, sizeof header.abort_reason, "%s",
                          shared_reason.c_str());
            header.abort_sequence = call.sequence;
            shared(header.abort_rank)
                .store(static_cast<uint32_t>(rank_.rank + 1), std::memory_order_release);
        }
        futex_wake_all(&header.generation);
    }
    throw CollectiveError(message);
}

void Communicator::verify_records(const Call& call) {
    for (int p = 0; p < rank_.world_size; ++p) {
        if (p == rank_.rank) continue;
        const CallRecord& theirs = segment_.record(p).calls[call.sequence & 1];
        if (theirs.sequence != call.sequence || theirs.kind != call.kind ||
            theirs.count != call.count || theirs.root != call.root) {
            fail(call, "rank " + std::to_string(p) + " called " +
                           describe(theirs.kind, theirs.sequence, theirs.count, theirs.root) +
                           " instead");
        }
    }
}

void Communicator::barrier() {
    Call call = begin(kBarrier, 0, -1);
    sync(call);
}

void Communicator::all_gather(const void* send, size_t bytes_per_rank, void* recv) {
    Call call = begin(kAllGather, bytes_per_rank, -1);
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    size_t done = 0;
    do {
        const size_t n = std::min(half_bytes(), bytes_per_rank - done);
        const uint64_t step = barriers_;
        copy_bytes(half(rank_.rank, step), in + done, n);
        sync(call);
        for (int r = 0; r < rank_.world_size; ++r) {
            copy_bytes(out + static_cast<size_t>(r) * bytes_per_rank + done, half(r, step), n);
        }
        done += n;
    } while (done < bytes_per_rank);
}

template <class Elem>
void Communicator::reduce_scatter_impl(uint32_t kind, const Elem* send, size_t count_per_rank,
                                       Elem* recv, Op op) {
    Call call = begin(kind, count_per_rank, -1);
    // Each step carries `stripe` elements for every destination rank: rank
    // d's stripe sits at d * stripe in the sender's half.
    const size_t stripe = half_bytes() / (static_cast<size_t>(rank_.world_size) * sizeof(Elem));
    size_t done = 0;
    do {
        const size_t n = std::min(stripe, count_per_rank - done);
        const uint64_t step = barriers_;
        auto* staged = reinterpret_cast<Elem*>(half(rank_.rank, step));
        for (int d = 0; d < rank_.world_size; ++d) {
            copy_bytes(staged + static_cast<size_t>(d) * stripe,
                       send + static_cast<size_t>(d) * count_per_rank + done, n * sizeof(Elem));
        }
        sync(call);
        const size_t mine = static_cast<size_t>(rank_.rank) * stripe;
        reduce_in_rank_order(
            [&](int s) { return reinterpret_cast<const Elem*>(half(s, step)) + mine; },
            rank_.world_size, n, recv + done, op);
        done += n;
    } while (done < count_per_rank);
}

void Communicator::reduce_scatter(const float* send, size_t count_per_rank, float* recv, Op op) {
    reduce_scatter_impl(kReduceScatter, send, count_per_rank, recv, op);
}

void Communicator::reduce_scatter_bf16(const uint16_t* send, size_t count_per_rank, uint16_t* recv,
                                       Op op) {
    reduce_scatter_impl(kReduceScatterBf16, send, count_per_rank, recv, op);
}

void Communicator::all_reduce(const float* send, float* recv, size_t count, Op op) {
    Call call = begin(kAllReduce, count, -1);
    const size_t per_step = half_bytes() / sizeof(float);
    size_t done = 0;
    do {
        const size_t n = std::min(per_step, count - done);
        const uint64_t step = barriers_;
        copy_bytes(half(rank_.rank, step), send + done, n * sizeof(float));
        sync(call);
        reduce_in_rank_order([&](int s) { return reinterpret_cast<const float*>(half(s, step)); },
                             rank_.world_size, n, recv + done, op);
        done += n;
    } while (done < count);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
    if (root < 0 || root >= rank_.world_size) {
        throw std::invalid_argument("broadcast root " + std::to_string(root) + " is outside [0, " +
                                    std::to_string(rank_.world_size) + ")");
    }
    Call call = begin(kBroadcast, bytes, root);
    auto* bytes_at = static_cast<std::byte*>(data);
    size_t done = 0;
    do {
        const size_t n = std::min(half_bytes(), bytes - done);
        const uint64_t step = barriers_;
        if (rank_.rank == root) copy_bytes(half(root, step), bytes_at + done, n);
        sync(call);
        if (rank_.rank != root) copy_bytes(bytes_at + done, half(root, step), n);
        done += n;
    } while (done < bytes);
}

}  // namespace allocscope::harness::collective
