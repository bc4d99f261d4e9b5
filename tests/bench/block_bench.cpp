// block_bench: what the caching-allocator bridge's calls cost the
// allocating thread (allocscope_block_alloc_frames + allocscope_block_free,
// the path of every tensor under PyTorch's native allocator), with a
// chosen native depth below the calls and a chosen number of Python
// frames. Run with the interposer preloaded:
//
//   LD_PRELOAD=build/interposer/liballocscope.so ALLOCSCOPE_OUT=/tmp/bb
//   build/tests/block_bench [--pairs N] [--depth D] [--python P] [--live L]
//                           [--pollute KIB]
//
// Prints ns per alloc/free pair (wall and CPU). --pollute writes KIB KiB of
// other memory between pairs, as a training step's own work does between
// its tensor allocations (so the hooks find their data out of cache); then
// only the calls are timed, each pair on its own (the clock reads add about
// the same to every run), and each pair's call chain below main is made
// anew, as a program's call into its allocator is. Not a test.
#include <dlfcn.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using BlockAllocFrames = void (*)(void*, size_t, int, void*, const uint64_t*, size_t);
using BlockFree = void (*)(void*);
using PythonFrame = uint64_t (*)(const char*, const char*, int);

struct Api {
    BlockAllocFrames alloc;
    BlockFree release;
};

struct Options {
    long pairs = 200000;
    int depth = 20;
    int python = 10;
    int live = 64;
    long pollute_kib = 0;
};

// Touches one byte per cache line of `buffer` (another program's work).
__attribute__((noinline)) void pollute(std::vector<unsigned char>& buffer) {
    for (size_t i = 0; i < buffer.size(); i += 64)
        buffer[i] = static_cast<unsigned char>(buffer[i] + 1);
    asm volatile("" ::: "memory");
}

double now_ns(clockid_t clock) {
    timespec ts;
    clock_gettime(clock, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

// One alloc (and the free of the allocation `live` before it), `depth`
// frames below the caller, timed: the call chain is made anew for each
// pair, so its stack lines are as fresh as a program's own call into the
// allocator leaves them, while the recorder's data is whatever the
// program's work left of it.
__attribute__((noinline)) double one_pair(const Api& api, const Options& o,
                                          const std::vector<uint64_t>& frames, int depth, long i) {
    if (depth > 0) {
        const double ns = one_pair(api, o, frames, depth - 1, i);
        asm volatile("" ::: "memory");  // not a tail call
        return ns;
    }
    const uintptr_t base = uintptr_t{0x7f0000000000};
    const double start = now_ns(CLOCK_MONOTONIC);
    api.alloc(reinterpret_cast<void*>(base + uintptr_t(i) * 4096), 4096, 0, nullptr, frames.data(),
              frames.size());
    if (i >= o.live) api.release(reinterpret_cast<void*>(base + uintptr_t(i - o.live) * 4096));
    return now_ns(CLOCK_MONOTONIC) - start;
}

// The loop, `depth` frames below main.
__attribute__((noinline)) void run(const Api& api, const Options& o,
                                   const std::vector<uint64_t>& frames, int depth) {
    if (depth > 0) {
        run(api, o, frames, depth - 1);
        asm volatile("" ::: "memory");  // not a tail call
        return;
    }
    const uintptr_t base = uintptr_t{0x7f0000000000};
    for (long i = 0; i < o.pairs; ++i) {
        api.alloc(reinterpret_cast<void*>(base + uintptr_t(i) * 4096), 4096, 0, nullptr,
                  frames.data(), frames.size());
        if (i >= o.live) api.release(reinterpret_cast<void*>(base + uintptr_t(i - o.live) * 4096));
    }
    for (long i = o.pairs > o.live ? o.pairs - o.live : 0; i < o.pairs; ++i)
        api.release(reinterpret_cast<void*>(base + uintptr_t(i) * 4096));
}

// --pollute: between pairs, `other` written over; each pair's call chain
// made anew below it.
void run_polluted(const Api& api, const Options& o, const std::vector<uint64_t>& frames,
                  std::vector<unsigned char>& other) {
    double calls_ns = 0;
    for (long i = 0; i < o.pairs; ++i) {
        pollute(other);
        calls_ns += one_pair(api, o, frames, o.depth, i);
    }
    const uintptr_t base = uintptr_t{0x7f0000000000};
    for (long i = o.pairs > o.live ? o.pairs - o.live : 0; i < o.pairs; ++i)
        api.release(reinterpret_cast<void*>(base + uintptr_t(i) * 4096));
    std::printf("polluted_ns_per_pair %.1f\n", calls_ns / double(o.pairs));
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const long value = std::strtol(argv[i + 1], nullptr, 10);
        if (flag == "--pairs")
            o.pairs = value;
        else if (flag == "--depth")
            o.depth = int(value);
        else if (flag == "--python")
            o.python = int(value);
        else if (flag == "--live")
            o.live = int(value);
        else if (flag == "--pollute")
            o.pollute_kib = value;
        else {
            std::fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    Api api{
        reinterpret_cast<BlockAllocFrames>(dlsym(RTLD_DEFAULT, "allocscope_block_alloc_frames")),
        reinterpret_cast<BlockFree>(dlsym(RTLD_DEFAULT, "allocscope_block_free"))};
    auto name = reinterpret_cast<PythonFrame>(dlsym(RTLD_DEFAULT, "allocscope_python_frame"));
    if (!api.alloc || !api.release || !name) {
        std::fprintf(stderr, "block_bench: run it with liballocscope.so preloaded\n");
        return 2;
    }
    std::vector<uint64_t> frames;
    for (int i = 0; i < o.python; ++i)
        frames.push_back(name(("f" + std::to_string(i)).c_str(), "/src/model.py", 10 + i));
    std::vector<unsigned char> other(size_t(o.pollute_kib) * 1024);
    const double wall = now_ns(CLOCK_MONOTONIC), cpu = now_ns(CLOCK_THREAD_CPUTIME_ID);
    if (!other.empty()) {  // prints the calls' own time
        run_polluted(api, o, frames, other);
        return 0;
    }
    run(api, o, frames, o.depth);
    const double n = double(o.pairs);
    std::printf("ns_per_pair %.1f\ncpu_ns_per_pair %.1f\n", (now_ns(CLOCK_MONOTONIC) - wall) / n,
                (now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu) / n);
    return 0;
}
