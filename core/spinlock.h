// A test-and-test-and-set lock for critical sections of a few dozen
// instructions (live-table shards). Falls back to sched_yield under long
// contention so a preempted holder cannot make waiters burn a core.
#pragma once

#include <sched.h>

#include <atomic>

namespace allocscope {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

class SpinLock {
  public:
    void lock() noexcept {
        for (int spins = 0;; ++spins) {
            if (!locked_.exchange(true, std::memory_order_acquire)) return;
            while (locked_.load(std::memory_order_relaxed)) {
                if (spins++ < 64) {
                    cpu_relax();
                } else {
                    sched_yield();
                }
            }
        }
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

  private:
    std::atomic<bool> locked_{false};
};

}  // namespace allocscope
