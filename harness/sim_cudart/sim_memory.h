// The host-memory allocator behind the tests' CUDA runtime
// (sim_cudart.cpp: pinned host memory) and driver (sim_cuda.cpp: device and
// managed memory). Each library has its own instance.
//
//   * every allocation is 256-byte aligned host memory, zero-filled;
//   * a request that would take the instance above ALLOCSCOPE_SIM_MEMORY_LIMIT
//     bytes (default 1 TiB) fails, like an out-of-memory GPU;
//   * freeing a pointer it did not hand out (or twice, or as the wrong kind)
//     fails and changes nothing;
//   * sharded by address so that threads allocating at once do not queue on
//     one lock (the interposer's benchmarks run through it);
//   * a child forked while other threads allocate can allocate too: every
//     shard is locked around fork() and unlocked in both processes, as
//     glibc's malloc does for its arenas (tests check allocscope's fork
//     policy with it).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace sim {

enum class Status { ok, invalid, out_of_memory };

class Memory {
  public:
    // The process's instance for this library; never destroyed (frees may
    // come during exit).
    static Memory& instance() {
        static Memory* m = [] {
            auto* mem = new Memory();
            if (const char* v = std::getenv("ALLOCSCOPE_SIM_MEMORY_LIMIT")) {
                mem->limit_ = std::strtoull(v, nullptr, 10);
            }
            s_forking = mem;
            pthread_atfork(lock_all, unlock_all, unlock_all);
            return mem;
        }();
        return *m;
    }

    // `kind` is the caller's label (device, managed, host...): a release must
    // name the same kind.
    Status allocate(void** out, size_t size, int kind) {
        if (!out) return Status::invalid;
        *out = nullptr;
        if (!reserve(size)) return Status::out_of_memory;
        size_t rounded = ((size == 0 ? 1 : size) + 255) / 256 * 256;
        void* p = std::aligned_alloc(256, rounded);
        if (!p) {
            in_use_.fetch_sub(size);
            return Status::out_of_memory;
        }
        std::memset(p, 0, rounded);
        auto key = reinterpret_cast<uintptr_t>(p);
        Shard& sh = shard_for(key);
        std::lock_guard lock(sh.mutex);
        sh.live[key] = {size, kind};
        *out = p;
        return Status::ok;
    }

    Status release(void* p, int kind) {
        if (!p) return Status::ok;
        auto key = reinterpret_cast<uintptr_t>(p);
        Shard& sh = shard_for(key);
        {
            std::lock_guard lock(sh.mutex);
            auto it = sh.live.find(key);
            if (it == sh.live.end() || it->second.kind != kind) return Status::invalid;
            in_use_.fetch_sub(it->second.size);
            sh.live.erase(it);
        }
        std::free(p);
        return Status::ok;
    }

    // Accounting only, for memory that lives elsewhere (the driver's
    // cuMemCreate handles): false when `size` does not fit under the limit.
    bool reserve(size_t size) {
        if (size > limit_ || in_use_.fetch_add(size) > limit_ - size) {
            if (size <= limit_) in_use_.fetch_sub(size);
            return false;
        }
        return true;
    }
    void unreserve(size_t size) { in_use_.fetch_sub(size); }

  private:
    struct Allocation {
        size_t size;
        int kind;
    };
    struct Shard {
        std::mutex mutex;
        std::unordered_map<uintptr_t, Allocation> live;
    };
    static constexpr size_t kShards = 64;

    Shard& shard_for(uintptr_t p) { return shards_[(p >> 8) * 0x9E3779B97F4A7C15ull >> 58]; }

    static void lock_all() {
        for (Shard& sh : s_forking->shards_)
            sh.mutex.lock();
    }
    static void unlock_all() {
        for (Shard& sh : s_forking->shards_)
            sh.mutex.unlock();
    }

    static inline Memory* s_forking = nullptr;
    Shard shards_[kShards];
    std::atomic<uint64_t> in_use_{0};
    uint64_t limit_ = uint64_t{1} << 40;
};

}  // namespace sim
