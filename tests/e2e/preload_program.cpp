// The program the LD_PRELOAD end-to-end tests run. Linked against a CUDA
// runtime (the host-memory one in CI, the real one on a GPU machine), so its
// references are `cudaMalloc@libcudart.so.13` etc., exactly like a real
// training program's.
//
// Usage: preload_program MODE [ARGS]
//   probe        exit 0 when a CUDA device is usable, 77 otherwise
//   script       every hooked function, tags, threads, failures (see below)
//   fork         start recording, fork, allocate in the child, then the parent
//   exec         re-exec itself in `script` mode (RANK removed)
//   exit N       allocate once, then exit with status N
//   churn N      N alloc/free pairs (for quick load checks)
//   deep-tags    a pop without push, then 70 nested tags around one allocation
//   keyed-tags   the keyed tag calls (allocscope_enter ...) as module hooks
//                make them, one allocation of 20001, 20002, ... bytes after
//                each step; checks every return value
//   fork-busy    fork 50 times while 4 threads allocate and tag without pause;
//                each child uses the C API and exits (it must not hang)
//   stress T P   T threads, P cudaMalloc/cudaFree pairs each, every fourth
//                allocation freed by the next thread; kStressKeep per thread
//                stay alive until exit. Prints the exact call counts.
//   fork-alloc   fork 50 times while 4 threads call cudaMalloc/cudaFree
//                without pause; each child allocates (2222 B), frees, marks
//                and exit()s within 10 s (tests/e2e/faults_test.cpp)
//   dlopen-late LIB  cudaMalloc first, then dlopen LIB (liballocscope.so) and
//                use its C API and allocator hooks around more CUDA calls
//   until-killed allocate in a loop (steps, tags, some kept) until killed;
//                creates $E2E_READY after the first 2000 allocations
//   term-handler FILE [late]  until-killed with a SIGTERM handler of its own
//                (it creates FILE and _exits 7), installed before the first
//                CUDA call, or with `late` after it (replacing allocscope's)
//   term-threads until-killed while a second thread allocates without pause
//   fork-term    start recording, fork; the child reports its SIGTERM
//                disposition and sends itself SIGTERM; the parent reports
//                how the child ended (tests/e2e/sigterm_test.cpp)
//   fail-calls   allocations the runtime refuses (out of memory with
//                ALLOCSCOPE_SIM_MEMORY_LIMIT, invalid value), bad frees, and
//                a free of live memory refused (the 4th cudaFree, with
//                ALLOCSCOPE_SIM_REFUSE_FREE=4) then repeated; prints every
//                return code and cudaGetLastError
//   oom-exit     in layers.3's forward at step 2, keeps 1 MiB, then asks
//                for 1 PiB and exits 1 when the runtime refuses (a program
//                without a caching allocator dying of out-of-memory)
//   hostile-symbol  keeps 32 MiB allocated from a function whose symbol
//                name is markup (x86-64; elsewhere an ordinary name)
//
// It checks every return code it gets against what the runtime must return
// and exits 1 on a mismatch, so a changed result is caught with or without
// the interposer. With E2E_LOG=<file> it writes one line per call:
//   alloc <api> <hex ptr> <bytes>   free <api> <hex ptr> <rc>   oom <api> <bytes> <rc>
// stdout carries only output that must be identical with and without
// allocscope.
// Longer than 600 lines: one program holds every scripted scenario the end-to-
// end tests run, so they all go through the same linked runtime.
#include <allocscope/allocscope_dl.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_decls.h"

namespace {

std::FILE* g_log = nullptr;
int g_failures = 0;

void expect_rc(cudaError_t got, cudaError_t want, const char* what) {
    if (got != want) {
        std::fprintf(stderr, "preload_program: %s returned %d, expected %d\n", what, int(got),
                     int(want));
        ++g_failures;
    }
}

// Runtimes differ in which error they return for a bad free (the host-memory
// one says cudaErrorInvalidValue, the real one may name the pointer); what
// matters is that it is an error and that allocscope passes it on unchanged.
void expect_error(cudaError_t got, const char* what) {
    if (got == cudaSuccess) {
        std::fprintf(stderr, "preload_program: %s succeeded, expected an error\n", what);
        ++g_failures;
    }
}

void log_alloc(const char* api, void* p, size_t bytes) {
    if (g_log) std::fprintf(g_log, "alloc %s %p %zu\n", api, p, bytes);
}
void log_free(const char* api, void* p, cudaError_t rc) {
    if (g_log) std::fprintf(g_log, "free %s %p %d\n", api, p, int(rc));
}

void* checked_malloc(size_t bytes) {
    void* p = nullptr;
    expect_rc(cudaMalloc(&p, bytes), cudaSuccess, "cudaMalloc");
    log_alloc("cudaMalloc", p, bytes);
    return p;
}

void checked_free(void* p) {
    cudaError_t rc = cudaFree(p);
    expect_rc(rc, cudaSuccess, "cudaFree");
    log_free("cudaFree", p, rc);
}

bool device_usable() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
    void* p = nullptr;
    if (cudaMalloc(&p, 256) != cudaSuccess) return false;
    cudaFree(p);
    return true;
}

int run_script() {
    allocscope_dl_step(1);
    allocscope_dl_register_param("layers.0", "fc1.weight", 1024 * 256, "bf16", 512 * 256);
    allocscope_dl_mark("script begins");

    allocscope_dl_push("layers.0", "forward");
    void* a = checked_malloc(1000);
    // Provenance: of a registered parameter, and of one never registered.
    allocscope_dl_derived(a, "layers.0", "fc1.weight", "cast to fp8_e4m3");
    allocscope_dl_derived(a, "layers.9", "bias", nullptr);

    cudaMemPool_t pool = nullptr;
    expect_rc(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess, "cudaDeviceGetDefaultMemPool");
    void* b = nullptr;
    void* c = nullptr;
    void* d = nullptr;
    void* e = nullptr;
    expect_rc(cudaMallocAsync(&b, 2000, nullptr), cudaSuccess, "cudaMallocAsync");
    log_alloc("cudaMallocAsync", b, 2000);
    expect_rc(cudaMallocAsync_ptsz(&c, 3000, nullptr), cudaSuccess, "cudaMallocAsync_ptsz");
    log_alloc("cudaMallocAsync_ptsz", c, 3000);
    expect_rc(cudaMallocFromPoolAsync(&d, 4000, pool, nullptr), cudaSuccess,
              "cudaMallocFromPoolAsync");
    log_alloc("cudaMallocFromPoolAsync", d, 4000);
    expect_rc(cudaMallocFromPoolAsync_ptsz(&e, 5000, pool, nullptr), cudaSuccess,
              "cudaMallocFromPoolAsync_ptsz");
    log_alloc("cudaMallocFromPoolAsync_ptsz", e, 5000);

    void* managed = nullptr;
    expect_rc(cudaMallocManaged(&managed, 6000, 1 /* cudaMemAttachGlobal */), cudaSuccess,
              "cudaMallocManaged");
    log_alloc("cudaMallocManaged", managed, 6000);
    void* pitched = nullptr;
    size_t pitch = 0;
    expect_rc(cudaMallocPitch(&pitched, &pitch, 100, 10), cudaSuccess, "cudaMallocPitch");
    if (pitch < 100) {
        std::fprintf(stderr, "preload_program: pitch %zu < width 100\n", pitch);
        ++g_failures;
    }
    log_alloc("cudaMallocPitch", pitched, pitch * 10);
    void* host1 = nullptr;
    void* host2 = nullptr;
    expect_rc(cudaMallocHost(&host1, 7000), cudaSuccess, "cudaMallocHost");
    log_alloc("cudaMallocHost", host1, 7000);
    expect_rc(cudaHostAlloc(&host2, 8000, 0), cudaSuccess, "cudaHostAlloc");
    log_alloc("cudaHostAlloc", host2, 8000);

    allocscope_dl_push("layers.0.mlp", nullptr);  // keeps the phase
    void* nested = checked_malloc(9000);
    allocscope_dl_pop();

    void* from_thread = nullptr;
    std::thread([&] { from_thread = checked_malloc(10000); }).join();  // starts untagged

    // A request no device can satisfy: the error must come back unchanged and
    // the out-parameter stay untouched.
    // What the runtime leaves in the out-parameter (the real one writes
    // NULL, the host-memory one leaves it) goes to stdout, which must be the
    // same with and without allocscope.
    void* huge = reinterpret_cast<void*>(0x1234);
    cudaError_t rc = cudaMalloc(&huge, size_t{1} << 50);
    expect_rc(rc, cudaErrorMemoryAllocation, "cudaMalloc(1 PiB)");
    std::printf("failed cudaMalloc left its out-parameter %s\n",
                huge == nullptr                           ? "null"
                : huge == reinterpret_cast<void*>(0x1234) ? "unchanged"
                                                          : "changed");
    if (g_log) std::fprintf(g_log, "oom cudaMalloc %zu %d\n", size_t{1} << 50, int(rc));
    allocscope_dl_pop();

    allocscope_dl_step(2);
    allocscope_dl_push("layers.0", "backward");
    int block_storage[64];
    allocscope_dl_block_alloc(block_storage, sizeof block_storage, 0, nullptr);
    allocscope_dl_block_free(block_storage);

    checked_free(a);
    rc = cudaFreeAsync(b, nullptr);
    expect_rc(rc, cudaSuccess, "cudaFreeAsync");
    log_free("cudaFreeAsync", b, rc);
    rc = cudaFreeAsync_ptsz(c, nullptr);
    expect_rc(rc, cudaSuccess, "cudaFreeAsync_ptsz");
    log_free("cudaFreeAsync_ptsz", c, rc);
    expect_rc(cudaStreamSynchronize(nullptr), cudaSuccess, "cudaStreamSynchronize");
    checked_free(d);
    checked_free(e);
    checked_free(managed);
    checked_free(pitched);
    rc = cudaFreeHost(host1);
    expect_rc(rc, cudaSuccess, "cudaFreeHost");
    log_free("cudaFreeHost", host1, rc);
    rc = cudaFreeHost(host2);
    expect_rc(rc, cudaSuccess, "cudaFreeHost");
    log_free("cudaFreeHost", host2, rc);
    checked_free(nested);
    checked_free(from_thread);

    // A second free of the same pointer, and a pointer the runtime never gave
    // out: both are errors the runtime reports and allocscope passes through.
    rc = cudaFree(a);
    expect_error(rc, "cudaFree(already freed)");
    log_free("cudaFree", a, rc);
    alignas(256) static char not_device[256];
    rc = cudaFree(not_device);
    expect_error(rc, "cudaFree(unknown)");
    log_free("cudaFree", not_device, rc);
    allocscope_dl_pop();

    // Device attribution follows cudaSetDevice (allocscope caches the device
    // per thread and context).
    int devices = 0;
    expect_rc(cudaGetDeviceCount(&devices), cudaSuccess, "cudaGetDeviceCount");
    for (int dev = devices > 1 ? 1 : 0; dev >= 0; --dev) {
        expect_rc(cudaSetDevice(dev), cudaSuccess, "cudaSetDevice");
        void* p = checked_malloc(13000 + size_t(dev));
        if (g_log) std::fprintf(g_log, "device %d\n", dev);
        checked_free(p);
    }

    void* kept = checked_malloc(12000);  // still alive at exit, untagged
    (void)kept;
    std::printf("script done: %d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}

// CUDA must not be used in a child forked after the parent initialized it,
// so the parent starts recording through the C API only, then forks.
int run_fork() {
    allocscope_dl_mark("before fork");
    std::fflush(nullptr);
    pid_t child = fork();
    if (child == 0) {
        checked_free(checked_malloc(2222));
        std::fflush(nullptr);
        _exit(g_failures == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    checked_free(checked_malloc(3333));
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && g_failures == 0;
    std::printf("fork done: child %s\n", ok ? "ok" : "failed");
    return ok ? 0 : 1;
}

// stress: the conservation load. Thread t hands every fourth allocation to
// thread (t + 1) % T through a mutex-protected queue; the receiver frees it.
// The first kStressKeep allocations of each thread are never freed.
constexpr long kStressKeep = 2;
constexpr size_t kStressKeepBytes = size_t{1} << 20;
constexpr size_t kStressBacklog = 4096;  // a producer waits above this

struct Handoff {
    std::mutex mutex;
    std::vector<void*> items;
    std::atomic<size_t> size{0};
};

std::atomic<int> g_stress_failures{0};

void stress_rc(cudaError_t got, const char* what) {
    if (got != cudaSuccess) {
        std::fprintf(stderr, "preload_program: %s returned %d\n", what, int(got));
        ++g_stress_failures;
    }
}

struct StressCounts {
    std::atomic<uint64_t> mallocs{0}, frees{0}, handed_off{0}, tags{0}, kept_bytes{0};
};

// Frees what other threads handed to `box`; returns how many.
uint64_t drain(Handoff& box) {
    if (box.size.load(std::memory_order_acquire) == 0) return 0;
    std::vector<void*> items;
    {
        std::lock_guard lock(box.mutex);
        items.swap(box.items);
        box.size.store(0, std::memory_order_release);
    }
    for (void* p : items)
        stress_rc(cudaFree(p), "cudaFree(handed off)");
    return items.size();
}

void stress_thread(int t, int threads, long pairs, std::vector<Handoff>& boxes,
                   std::atomic<int>& finished, StressCounts& counts) {
    const std::string layer = "stress." + std::to_string(t);
    Handoff& mine = boxes[size_t(t)];
    Handoff& next = boxes[size_t((t + 1) % threads)];
    uint64_t mallocs = 0, frees = 0, handed = 0, tags = 0, kept_bytes = 0;
    for (long i = 0; i < pairs; ++i) {
        // A training loop tags part of its work: 4 of every 16 pairs.
        const bool tagged = i % 16 >= 12;
        if (tagged) {
            allocscope_dl_push(layer.c_str(), (i / 16) % 2 ? "backward" : "forward");
            ++tags;
        }
        const bool keep = i < kStressKeep;
        const size_t bytes = keep ? kStressKeepBytes : 256 + size_t((i * 7 + t) % 64) * 128;
        void* p = nullptr;
        stress_rc(cudaMalloc(&p, bytes), "cudaMalloc");
        ++mallocs;
        if (keep) {
            kept_bytes += bytes;
        } else if (i % 4 == 3) {
            while (next.size.load(std::memory_order_relaxed) > kStressBacklog) {
                frees += drain(mine);  // the receiver may be waiting on us
                std::this_thread::yield();
            }
            std::lock_guard lock(next.mutex);
            next.items.push_back(p);
            next.size.store(next.items.size(), std::memory_order_release);
            ++handed;
        } else {
            stress_rc(cudaFree(p), "cudaFree");
            ++frees;
        }
        if (tagged) allocscope_dl_pop();
        frees += drain(mine);
    }
    // Everything handed to this thread is in its box once all producers are
    // done; it drains until then, then once more.
    finished.fetch_add(1, std::memory_order_acq_rel);
    while (finished.load(std::memory_order_acquire) < threads) {
        frees += drain(mine);
        std::this_thread::yield();
    }
    frees += drain(mine);
    counts.mallocs += mallocs;
    counts.frees += frees;
    counts.handed_off += handed;
    counts.tags += tags;
    counts.kept_bytes += kept_bytes;
}

int run_stress(int threads, long pairs) {
    if (threads < 1 || pairs < kStressKeep) {
        std::fprintf(stderr, "preload_program: stress needs THREADS >= 1, PAIRS >= %ld\n",
                     kStressKeep);
        return 2;
    }
    std::vector<Handoff> boxes(static_cast<size_t>(threads));
    std::atomic<int> finished{0};
    StressCounts counts;
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back(stress_thread, t, threads, pairs, std::ref(boxes), std::ref(finished),
                             std::ref(counts));
    }
    for (auto& w : workers)
        w.join();
    const uint64_t kept = counts.mallocs - counts.frees;
    std::printf(
        "stress done: mallocs %llu frees %llu handed_off %llu kept %llu kept_bytes %llu "
        "tags %llu failures %d\n",
        (unsigned long long)counts.mallocs.load(), (unsigned long long)counts.frees.load(),
        (unsigned long long)counts.handed_off.load(), (unsigned long long)kept,
        (unsigned long long)counts.kept_bytes.load(), (unsigned long long)counts.tags.load(),
        g_stress_failures.load());
    const bool ok = g_stress_failures == 0 && kept == uint64_t(threads) * kStressKeep;
    return ok ? 0 : 1;
}

// fork-alloc: dataloader-style workers forked while other threads are
// inside the hooks. The child allocates through the hooks too.
int run_fork_alloc() {
    // CUDA is in use before the workers start, as in a training process (and
    // the runtime's own one-time setup is not what is being tested).
    checked_free(checked_malloc(1024));
    std::atomic<bool> stop{false};
    std::vector<std::thread> workers;
    for (int t = 0; t < 4; ++t) {
        workers.emplace_back([&stop, t] {
            const std::string layer = "worker." + std::to_string(t);
            size_t i = 0;
            while (!stop.load()) {
                allocscope_dl_push(layer.c_str(), "forward");
                void* p = nullptr;
                if (cudaMalloc(&p, 4096 + (i++ % 8) * 512) == cudaSuccess) cudaFree(p);
                allocscope_dl_pop();
            }
        });
    }
    int ok_children = 0;
    for (int i = 0; i < 50; ++i) {
        std::fflush(nullptr);
        pid_t child = fork();
        if (child == 0) {
            alarm(10);  // a deadlock in the child ends it with SIGALRM
            void* p = nullptr;
            if (cudaMalloc(&p, 2222) != cudaSuccess || cudaFree(p) != cudaSuccess) _exit(3);
            allocscope_dl_push("child", "forward");
            allocscope_dl_mark("in the child");
            allocscope_dl_pop();
            std::exit(0);  // atexit handlers and library destructors run
        }
        int status = 0;
        waitpid(child, &status, 0);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        ok_children += ok;
        if (!ok) {
            std::fprintf(stderr, "preload_program: child %d: %s %d\n", i,
                         WIFEXITED(status) ? "exit status" : "signal",
                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        }
    }
    stop = true;
    for (auto& w : workers)
        w.join();
    std::printf("fork-alloc done: %d of 50 children exited cleanly\n", ok_children);
    return ok_children == 50 ? 0 : 1;
}

int run_dlopen_late(const char* lib) {
    void* before = checked_malloc(1111);
    void* handle = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        std::fprintf(stderr, "preload_program: dlopen: %s\n", dlerror());
        return 1;
    }
    using Push = void (*)(const char*, const char*);
    using Pop = void (*)();
    using BlockAlloc = void (*)(void*, size_t, int, void*);
    using BlockFree = void (*)(void*);
    auto push = reinterpret_cast<Push>(dlsym(handle, "allocscope_push"));
    auto pop = reinterpret_cast<Pop>(dlsym(handle, "allocscope_pop"));
    auto block_alloc = reinterpret_cast<BlockAlloc>(dlsym(handle, "allocscope_block_alloc"));
    auto block_free = reinterpret_cast<BlockFree>(dlsym(handle, "allocscope_block_free"));
    if (!push || !pop || !block_alloc || !block_free) {
        std::fprintf(stderr, "preload_program: the C API is missing from %s\n", lib);
        return 1;
    }
    push("late", "forward");
    void* after = checked_malloc(2222);
    int storage[32];
    block_alloc(storage, sizeof storage, 0, nullptr);
    block_free(storage);
    checked_free(after);
    checked_free(before);  // allocated before allocscope was there
    pop();
    void* huge = nullptr;
    expect_rc(cudaMalloc(&huge, size_t{1} << 50), cudaErrorMemoryAllocation, "cudaMalloc(1 PiB)");
    std::printf("dlopen-late done: %d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}

// CUDA graphs' private pools as the PyTorch bridge reports them: a pool
// declared as graphs' (0, 7), one 1 MiB block of it per step in layers.0's
// forward, never freed (the graphs hold their memory for replay); a
// capture's own pool (5, 0), one 2 MiB block in the first step, kept; and
// in every step an ordinary block and a block of an undeclared pool (0, 9)
// (a torch.cuda.MemPool of the program's), made and freed. `in_pool`
// false: the kept blocks reported as ordinary ones, which grow step after
// step.
int run_graph_pool(bool in_pool) {
    using Push = void (*)(const char*, const char*);
    using Pop = void (*)();
    using Step = void (*)(uint64_t);
    using BlockAlloc = void (*)(void*, size_t, int, void*);
    using BlockAllocInPool = void (*)(void*, size_t, int, void*, uint64_t, uint64_t);
    using GraphPool = void (*)(uint64_t, uint64_t);
    using BlockFree = void (*)(void*);
    auto push = reinterpret_cast<Push>(dlsym(RTLD_DEFAULT, "allocscope_push"));
    auto pop = reinterpret_cast<Pop>(dlsym(RTLD_DEFAULT, "allocscope_pop"));
    auto step = reinterpret_cast<Step>(dlsym(RTLD_DEFAULT, "allocscope_step"));
    auto block_alloc = reinterpret_cast<BlockAlloc>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc"));
    auto pool_alloc =
        reinterpret_cast<BlockAllocInPool>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc_in_pool"));
    auto graph_pool = reinterpret_cast<GraphPool>(dlsym(RTLD_DEFAULT, "allocscope_graph_pool"));
    auto block_free = reinterpret_cast<BlockFree>(dlsym(RTLD_DEFAULT, "allocscope_block_free"));
    if (!push || !pop || !step || !block_alloc || !pool_alloc || !graph_pool || !block_free) {
        std::fprintf(stderr, "preload_program: the block calls are missing\n");
        return 1;
    }
    constexpr size_t kMiB = size_t{1} << 20;
    const uintptr_t pool_base = uintptr_t{0x7e0000000000};  // addresses only: never touched
    graph_pool(0, 7);
    for (uint64_t n = 1; n <= 6; ++n) {
        push("layers.0", "forward");
        void* kept = reinterpret_cast<void*>(pool_base + n * kMiB);
        if (in_pool) {
            pool_alloc(kept, kMiB, 0, nullptr, 0, 7);
        } else {
            block_alloc(kept, kMiB, 0, nullptr);
        }
        if (n == 1) {
            void* own = reinterpret_cast<void*>(pool_base + 32 * kMiB);
            if (in_pool) {
                pool_alloc(own, 2 * kMiB, 0, nullptr, 5, 0);
            } else {
                block_alloc(own, 2 * kMiB, 0, nullptr);
            }
        }
        void* temporary = reinterpret_cast<void*>(pool_base + 64 * kMiB);
        block_alloc(temporary, 4096, 0, nullptr);
        block_free(temporary);
        void* mine = reinterpret_cast<void*>(pool_base + 65 * kMiB);
        pool_alloc(mine, 8192, 0, nullptr, 0, 9);
        block_free(mine);
        pop();
        step(n);
    }
    std::printf("graph-pool done\n");
    return 0;
}

// The keyed tag calls of allocscope.h, looked up like a Python or hook
// library does (dlsym), in the order module hooks make them.
int run_keyed_tags() {
    using Enter = int (*)(uint64_t, uint32_t, uint64_t, const char*, const char*);
    using Leave = int64_t (*)(uint64_t, uint32_t, const char**);
    using LeaveKind = void (*)(uint32_t, uint64_t);
    using Depth = int (*)();
    using KindDepth = int (*)(uint32_t);
    using CurrentLayer = size_t (*)(char*, size_t);
    auto enter = reinterpret_cast<Enter>(dlsym(RTLD_DEFAULT, "allocscope_enter"));
    auto leave = reinterpret_cast<Leave>(dlsym(RTLD_DEFAULT, "allocscope_leave"));
    auto leave_kind = reinterpret_cast<LeaveKind>(dlsym(RTLD_DEFAULT, "allocscope_leave_kind"));
    auto nested = reinterpret_cast<Enter>(dlsym(RTLD_DEFAULT, "allocscope_enter_nested"));
    auto depth = reinterpret_cast<Depth>(dlsym(RTLD_DEFAULT, "allocscope_keyed_depth"));
    auto kind_depth =
        reinterpret_cast<KindDepth>(dlsym(RTLD_DEFAULT, "allocscope_keyed_kind_depth"));
    auto current = reinterpret_cast<CurrentLayer>(dlsym(RTLD_DEFAULT, "allocscope_current_layer"));
    if (!enter || !leave || !leave_kind || !nested || !depth || !kind_depth || !current) {
        std::fprintf(stderr, "preload_program: the keyed tag calls are missing\n");
        return 1;
    }
    auto expect = [](long long got, long long want, const char* what) {
        if (got != want) {
            std::fprintf(stderr, "preload_program: %s returned %lld, expected %lld\n", what, got,
                         want);
            ++g_failures;
        }
    };
    size_t marker = 20000;
    auto mark = [&] { checked_free(checked_malloc(++marker)); };
    constexpr uint32_t F = 1, B = 2, O = 3;

    // Forward: a leave finds its own entry under a plain push and a stray one.
    expect(enter(1, F, 7, "root", "forward"), 0, "enter root");
    mark();  // 20001 root/forward
    expect(enter(2, F, 7, "root.a", "forward"), 1, "enter root.a");
    allocscope_dl_push("x", nullptr);
    mark();  // 20002 x/forward
    const char* layer = nullptr;
    expect(leave(2, F, &layer), 7, "leave root.a");
    expect(layer && std::strcmp(layer, "root.a") == 0, 1, "the left entry's layer");
    mark();  // 20003 root/forward
    expect(leave(99, F, nullptr), -1, "leave of an entry never entered");
    mark();  // 20004 root/forward
    expect(leave(1, F, nullptr), 7, "leave root");
    expect(depth(), 0, "keyed depth after the forward");
    mark();  // 20005 untagged

    // Backward, entered only.
    expect(nested(1, B, 7, "root", "backward"), 1, "backward root");
    expect(nested(3, B, 7, "root.b", "backward"), 1, "backward root.b");
    mark();  // 20006 root.b/backward
    expect(nested(3, B, 7, "root.b", "backward"), 0, "backward root.b again");
    expect(nested(2, B, 7, "root.a", "backward"), 1, "backward root.a");
    mark();  // 20007 root.a/backward (root.b is over)
    expect(depth(), 2, "keyed depth: root, root.a");
    expect(nested(8, B, 7, "root.e.fc", "backward"), 1, "backward root.e.fc");
    expect(nested(9, B, 7, "root.e", "backward"), 1, "backward root.e after its inner module");
    mark();  // 20008 root.e.fc/backward: back on top of root.e
    expect(depth(), 3, "keyed depth: root, root.e, root.e.fc");
    // A forward entered inside the backward (a recomputation) counts among
    // the keyed entries, not among the backward ones.
    expect(enter(20, F, 7, "root.e", "backward/recompute"), 3, "enter a recomputation");
    expect(kind_depth(B), 3, "backward entries under the recomputation");
    expect(kind_depth(F), 1, "forward entries: the recomputation");
    expect(kind_depth(0), 0, "kind 0 counts nothing");
    expect(leave(20, F, nullptr), 7, "leave the recomputation");
    expect(leave(8, B, nullptr), 7, "leave root.e.fc");
    mark();  // 20009 root.e/backward
    expect(nested(10, B, 8, "root", "backward"), 1, "backward of the next generation");
    expect(depth(), 1, "keyed depth: the earlier generation is gone");
    mark();  // 20010 root/backward
    leave_kind(B, UINT64_MAX);
    expect(depth(), 0, "keyed depth after leave_kind");
    expect(kind_depth(B), 0, "backward entries after leave_kind");

    // Optimizer: a NULL layer keeps the enclosing one.
    allocscope_dl_push("model", "step");
    expect(enter(11, O, 0, nullptr, "optimizer"), 0, "enter optimizer");
    mark();  // 20011 model/optimizer
    expect(leave(11, O, nullptr), 0, "leave optimizer");
    char buf[4];
    expect(static_cast<long long>(current(buf, sizeof buf)), 5, "current layer's length");
    expect(std::strcmp(buf, "mod") == 0, 1, "current layer, cut to the buffer");
    allocscope_dl_pop();
    mark();  // 20012 untagged
    expect(enter(12, 0, 0, "kind0", "forward"), -1, "enter of kind 0");
    mark();  // 20013 untagged

    // One buffer, names of the same length one after the other: a tag's
    // text is read at every call, never taken from its address alone.
    char name[32];
    std::strcpy(name, "reused.first");
    expect(enter(13, F, 9, name, "forward"), 0, "enter reused.first");
    mark();  // 20014 reused.first/forward
    expect(leave(13, F, nullptr), 9, "leave reused.first");
    std::strcpy(name, "reused.other");
    expect(enter(14, F, 9, name, "forward"), 0, "enter reused.other");
    mark();  // 20015 reused.other/forward
    expect(leave(14, F, nullptr), 9, "leave reused.other");
    expect(enter(15, F, 9, name, "forward"), 0, "enter reused.other again");
    mark();  // 20016 reused.other/forward
    expect(leave(15, F, nullptr), 9, "leave reused.other again");
    std::printf("keyed-tags done\n");
    return g_failures == 0 ? 0 : 1;
}

// The program's own SIGTERM handler (term-handler): async-signal-safe.
const char* g_term_marker = nullptr;
void own_sigterm_handler(int) {
    const int fd = open(g_term_marker, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        ssize_t ignored = write(fd, "handled\n", 8);
        (void)ignored;
        close(fd);
    }
    _exit(7);
}

void install_own_sigterm_handler() {
    struct sigaction sa {};
    sa.sa_handler = own_sigterm_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
}

int run_until_killed() {
    const char* ready = std::getenv("E2E_READY");
    std::vector<void*> kept;
    for (uint64_t i = 0;; ++i) {
        if (i % 100 == 0) allocscope_dl_step(i / 100);
        allocscope_dl_push(("layers." + std::to_string(i % 4)).c_str(), "forward");
        void* p = checked_malloc(4096 + (i % 16) * 512);
        if (i % 50 == 0) {
            kept.push_back(p);
        } else {
            checked_free(p);
        }
        allocscope_dl_pop();
        if (i == 2000 && ready) {
            std::FILE* f = std::fopen(ready, "w");
            if (f) std::fclose(f);
        }
        if (i >= 2000) usleep(200);
    }
}

int run_fork_term() {
    checked_free(checked_malloc(5555));  // recording starts: the handler goes in
    struct sigaction parent {};
    sigaction(SIGTERM, nullptr, &parent);
    std::printf("parent: SIGTERM %s\n", parent.sa_handler == SIG_DFL ? "default" : "handled");
    std::fflush(stdout);
    const pid_t child = fork();
    if (child == 0) {
        alarm(10);  // a child that hangs ends by SIGALRM
        struct sigaction mine {};
        sigaction(SIGTERM, nullptr, &mine);
        std::printf("child: SIGTERM %s\n", mine.sa_handler == SIG_DFL ? "default" : "handled");
        std::fflush(stdout);
        checked_free(checked_malloc(6666));
        kill(getpid(), SIGTERM);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    std::printf("child ended by %s\n",
                WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? "SIGTERM" : "something else");
    return 0;
}

int run_oom_exit() {
    allocscope_dl_step(2);
    allocscope_dl_push("layers.3", "forward");
    void* kept = checked_malloc(1 << 20);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, size_t{1} << 50);
    std::printf("cudaMalloc(1 PiB) = %d\n", int(rc));
    (void)kept;
    return rc == cudaErrorMemoryAllocation ? 1 : 2;
}

int run_fail_calls() {
    // Out of memory: above ALLOCSCOPE_SIM_MEMORY_LIMIT (or no GPU's size).
    void* p = reinterpret_cast<void*>(0x1234);
    cudaError_t rc = cudaMalloc(&p, size_t{1} << 50);
    std::printf("cudaMalloc(1 PiB) = %d, last error %d\n", int(rc), int(cudaGetLastError()));
    void* q = nullptr;
    rc = cudaMallocAsync(&q, size_t{3} << 48, nullptr);
    std::printf("cudaMallocAsync(768 TiB) = %d, last error %d\n", int(rc), int(cudaGetLastError()));
    // Invalid values: no out-parameter.
    rc = cudaMalloc(nullptr, 4096);
    std::printf("cudaMalloc(NULL, 4096) = %d\n", int(rc));
    rc = cudaMallocPitch(&q, nullptr, 100, 10);
    std::printf("cudaMallocPitch(pitch NULL) = %d\n", int(rc));
    // Bad frees.
    alignas(256) static char not_device[256];
    rc = cudaFree(not_device);
    std::printf("cudaFree(unknown) = %d, last error %d\n", int(rc), int(cudaGetLastError()));
    void* ok = checked_malloc(8192);
    checked_free(ok);
    rc = cudaFree(ok);
    std::printf("cudaFree(twice) = %d\n", int(rc));
    // Live memory whose free is refused stays allocated: freed again, it goes.
    void* kept = checked_malloc(8192);
    rc = cudaFree(kept);
    std::printf("cudaFree(refused) = %d, last error %d\n", int(rc), int(cudaGetLastError()));
    if (rc != cudaSuccess) {
        rc = cudaFree(kept);
        std::printf("cudaFree(again) = %d\n", int(rc));
    }
    std::printf("fail-calls done: %d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}

}  // namespace

// hostile-symbol: the allocation is made from a function whose ELF symbol
// is HTML markup, so the report's stacks carry it.
extern "C" void hostile_entry();
extern "C" __attribute__((noinline, used)) void hostile_alloc_body() {
    void* p = nullptr;
    cudaMalloc(&p, size_t{32} << 20);  // kept: the peak's owner
    asm volatile("" ::: "memory");     // not a tail call
}
// clang-format off
#if defined(__x86_64__)
#define HOSTILE_SYMBOL "<img src=x onerror=alert(1)>&'"
__asm__(".text\n"
        ".globl hostile_entry\n"
        ".type hostile_entry, @function\n"
        "hostile_entry:\n"
        ".cfi_startproc\n"
        "  subq $8, %rsp\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  call \"" HOSTILE_SYMBOL "\"\n"
        "  addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size hostile_entry, .-hostile_entry\n"
        ".type \"" HOSTILE_SYMBOL "\", @function\n"
        "\"" HOSTILE_SYMBOL "\":\n"
        ".cfi_startproc\n"
        "  subq $8, %rsp\n"
        ".cfi_adjust_cfa_offset 8\n"
        "  call hostile_alloc_body@PLT\n"
        "  addq $8, %rsp\n"
        ".cfi_adjust_cfa_offset -8\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size \"" HOSTILE_SYMBOL "\", .-\"" HOSTILE_SYMBOL "\"\n");
#else
extern "C" __attribute__((noinline)) void hostile_entry() {
    hostile_alloc_body();
    asm volatile("" ::: "memory");
}
#endif
// clang-format on

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: preload_program probe|script|fork|exec|exit N|churn N|stress T P\n");
        return 2;
    }
    if (const char* path = std::getenv("E2E_LOG")) g_log = std::fopen(path, "a");
    std::string mode = argv[1];
    if (mode == "probe") return device_usable() ? 0 : 77;
    if (mode == "script") return run_script();
    if (mode == "fork") return run_fork();
    if (mode == "exec") {
        checked_free(checked_malloc(4444));
        unsetenv("RANK");
        std::fflush(nullptr);
        execl("/proc/self/exe", argv[0], "script", static_cast<char*>(nullptr));
        std::perror("execl");
        return 1;
    }
    if (mode == "exit" && argc > 2) {
        checked_malloc(100);
        return std::atoi(argv[2]);
    }
    if (mode == "fork-busy") {
        std::atomic<bool> stop{false};
        std::vector<std::thread> workers;
        for (int t = 0; t < 4; ++t) {
            workers.emplace_back([&stop, t] {
                const std::string layer = "worker." + std::to_string(t);
                while (!stop.load()) {
                    allocscope_dl_push(layer.c_str(), "forward");
                    void* p = nullptr;
                    if (cudaMalloc(&p, 4096) == cudaSuccess) cudaFree(p);
                    allocscope_dl_pop();
                }
            });
        }
        int ok_children = 0;
        for (int i = 0; i < 50; ++i) {
            pid_t child = fork();
            if (child == 0) {
                alarm(10);  // a deadlock in the child ends it with SIGALRM
                allocscope_dl_push("child", "forward");
                allocscope_dl_mark("in the child");
                allocscope_dl_pop();
                _exit(0);
            }
            int status = 0;
            waitpid(child, &status, 0);
            ok_children += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        }
        stop = true;
        for (auto& w : workers)
            w.join();
        std::printf("fork-busy done: %d of 50 children exited cleanly\n", ok_children);
        return ok_children == 50 ? 0 : 1;
    }
    if (mode == "deep-tags") {
        allocscope_dl_pop();  // nothing to pop: ignored
        for (int depth = 1; depth <= 70; ++depth) {
            allocscope_dl_push(("level." + std::to_string(depth)).c_str(), "forward");
        }
        checked_free(checked_malloc(7070));
        for (int depth = 70; depth >= 1; --depth)
            allocscope_dl_pop();
        checked_free(checked_malloc(7171));  // untagged again
        std::printf("deep-tags done\n");
        return g_failures == 0 ? 0 : 1;
    }
    if (mode == "keyed-tags") return run_keyed_tags();
    if (mode == "graph-pool") return run_graph_pool(true);
    if (mode == "graph-pool-control") return run_graph_pool(false);
    if (mode == "stress" && argc > 3) return run_stress(std::atoi(argv[2]), std::atol(argv[3]));
    if (mode == "fork-alloc") return run_fork_alloc();
    if (mode == "dlopen-late" && argc > 2) return run_dlopen_late(argv[2]);
    if (mode == "until-killed") return run_until_killed();
    if (mode == "term-handler" && argc > 2) {
        g_term_marker = argv[2];
        const bool late = argc > 3 && std::strcmp(argv[3], "late") == 0;
        if (!late) install_own_sigterm_handler();
        checked_free(checked_malloc(7777));  // recording starts
        if (late) install_own_sigterm_handler();
        return run_until_killed();
    }
    if (mode == "term-threads") {
        std::thread([] {
            for (uint64_t i = 0;; ++i) {
                allocscope_dl_push("busy", "forward");
                void* p = nullptr;
                if (cudaMalloc(&p, 4096 + (i % 8) * 512) == cudaSuccess) cudaFree(p);
                allocscope_dl_pop();
            }
        }).detach();
        return run_until_killed();
    }
    if (mode == "fork-term") return run_fork_term();
    if (mode == "fail-calls") return run_fail_calls();
    if (mode == "oom-exit") return run_oom_exit();
    if (mode == "hostile-symbol") {
        hostile_entry();
        std::printf("hostile-symbol done\n");
        return 0;
    }
    if (mode == "churn" && argc > 2) {
        long n = std::atol(argv[2]);
        for (long i = 0; i < n; ++i)
            checked_free(checked_malloc(512 + size_t(i % 64) * 512));
        std::printf("churn done: %ld pairs\n", n);
        return g_failures == 0 ? 0 : 1;
    }
    std::fprintf(stderr, "preload_program: unknown mode '%s'\n", mode.c_str());
    return 2;
}
