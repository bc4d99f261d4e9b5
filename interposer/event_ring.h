// Multi-producer, single-consumer ring of events between the hooks and the
// writer thread. Producers never allocate or lock.
//
// Invariants:
//   * a slot's sequence number is its event's seq; seq values are handed out
//     densely by reserve(), so the consumer sees events in seq order;
//   * slot (seq & mask) is free for seq when seq - consumed < capacity;
//   * slot.ready == seq + 1 exactly when the event for seq is published.
#pragma once

#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <new>

#include "event.h"

namespace allocscope {

// A spin-wait hint: the waiting core yields to its sibling hyperthread.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

class EventRing {
  public:
    static constexpr uint64_t kCapacity = 1u << 16;

    // Two cache lines, aligned: producers filling neighbouring slots never
    // write to the same line.
    struct alignas(128) Slot {
        std::atomic<uint64_t> ready{0};
        Event event;
    };

    // The slots live in their own mapping (6 MiB): the ring is created once
    // per process and never destroyed.
    EventRing() {
        void* mem = mmap(nullptr, kCapacity * sizeof(Slot), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) throw std::bad_alloc();
        slots_ = static_cast<Slot*>(mem);
        for (uint64_t i = 0; i < kCapacity; ++i)
            new (&slots_[i]) Slot();
    }
    EventRing(const EventRing&) = delete;
    EventRing& operator=(const EventRing&) = delete;

    // Reserves the next seq, waiting while the ring is full. Gives up and
    // returns nullptr once the consumer has released nothing for
    // `patience_ns` (the writer is stalled), so a hook can never hang its
    // caller; the event is then dropped. A consumer that keeps releasing,
    // however slowly, keeps its producers waiting: with many producers
    // competing for the slots it frees, one of them may wait longer than
    // the patience without the writer ever stalling.
    Slot* reserve(uint64_t patience_ns) noexcept {
        // Fast path: with the ring at most half full, a fetch_add cannot run
        // past a slot the writer still owns (that would take kCapacity / 2
        // producers racing between the check and the add).
        if (next_.load(std::memory_order_relaxed) - consumed_.load(std::memory_order_acquire) <
            kCapacity / 2) {
            uint64_t n = next_.fetch_add(1, std::memory_order_acq_rel);
            while (n - consumed_.load(std::memory_order_acquire) >= kCapacity)
                cpu_relax();
            Slot& slot = slots_[n & (kCapacity - 1)];
            slot.event.seq = n;
            prefetch_next(n);
            return &slot;
        }
        // Slow path near full: claim a seq only once its slot is free, so a
        // producer can give up without leaving a hole in the sequence.
        uint64_t n = next_.load(std::memory_order_relaxed);
        uint64_t waited_since = 0;
        uint64_t seen_consumed = consumed_.load(std::memory_order_acquire);
        for (int spins = 0;;) {
            const uint64_t consumed = consumed_.load(std::memory_order_acquire);
            if (n - consumed >= kCapacity) {
                if (consumed != seen_consumed) {  // the consumer moved: patience starts over
                    seen_consumed = consumed;
                    waited_since = 0;
                }
                if (!wait_for_space(waited_since, spins, patience_ns)) return nullptr;
                n = next_.load(std::memory_order_relaxed);
                continue;
            }
            if (next_.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel,
                                            std::memory_order_relaxed)) {
                Slot& slot = slots_[n & (kCapacity - 1)];
                slot.event.seq = n;
                return &slot;
            }
        }
    }

    static void publish(Slot* slot) noexcept {
        slot->ready.store(slot->event.seq + 1, std::memory_order_release);
    }

    // Consumer side: number of published events starting at `consumed()`, up
    // to `max`, without gaps.
    uint64_t published_run(uint64_t max) const noexcept {
        uint64_t start = consumed_.load(std::memory_order_relaxed);
        uint64_t n = 0;
        while (n < max && slots_[(start + n) & (kCapacity - 1)].ready.load(
                              std::memory_order_acquire) == start + n + 1) {
            ++n;
        }
        return n;
    }
    const Event& at(uint64_t seq) const noexcept { return slots_[seq & (kCapacity - 1)].event; }
    uint64_t consumed() const noexcept { return consumed_.load(std::memory_order_relaxed); }
    void release_until(uint64_t seq) noexcept { consumed_.store(seq, std::memory_order_release); }
    uint64_t reserved() const noexcept { return next_.load(std::memory_order_relaxed); }

  private:
    // The slot after `seq`, for writing: a slot comes round again only after
    // kCapacity events (8 MiB later), long out of every cache, so the next
    // event's two lines are asked for while this one is filled.
    void prefetch_next(uint64_t seq) const noexcept {
        const Slot* next = &slots_[(seq + 1) & (kCapacity - 1)];
        __builtin_prefetch(next, 1);
        __builtin_prefetch(reinterpret_cast<const char*>(next) + 64, 1);
    }

    static bool wait_for_space(uint64_t& waited_since, int& spins, uint64_t patience_ns) noexcept {
        if (spins < 128) {
            ++spins;
            cpu_relax();
            return true;
        }
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t t = uint64_t(now.tv_sec) * 1000000000ull + uint64_t(now.tv_nsec);
        if (waited_since == 0) waited_since = t;
        if (t - waited_since > patience_ns) return false;
        timespec pause{0, 50000};
        nanosleep(&pause, nullptr);
        return true;
    }

    // Read-only after construction, on its own line; the two counters below
    // are written (by producers, by the writer) and must not share it.
    alignas(64) Slot* slots_;
    alignas(64) std::atomic<uint64_t> next_{0};
    alignas(64) std::atomic<uint64_t> consumed_{0};
};

}  // namespace allocscope
