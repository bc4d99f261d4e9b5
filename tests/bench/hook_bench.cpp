// hook_bench: time per cudaMallocAsync + cudaFreeAsync pair as seen by the
// caller. Run it plain and under LD_PRELOAD=liballocscope.so; the difference
// is what allocscope adds (tools/bench-hooks does that and prints a table).
//
// usage: hook_bench [--pairs N] [--threads T] [--depth D] [--size BYTES] [--streams S]
//                   [--sites 0|1] [--touch KB]
//   --depth D   make the calls from D nested frames, like a framework would
//               (stack capture cost grows with the frames walked)
//   --sites 1   each pair from one of 64 call paths of 16 distinct frames
//               each (1,024 return addresses, like a framework's many
//               call sites), below the D nested frames
//   --touch KB  write one byte per cache line of a KB-sized buffer of the
//               thread's after each pair (the program's own work, evicting
//               what the hooks left in the caches); plain runs do it too
//   --streams legacy|per-thread   all threads on the legacy default stream
//               (default), or each on a stream of its own
// Prints: "ns_per_pair <median over threads' runs>" (the latency a thread
// sees, waits for a core included when threads outnumber cores),
// "cpu_ns_per_pair <process CPU time / all pairs>" (every thread's CPU,
// allocscope's writer included: the cost that does not depend on how many
// cores there are) and "wall_ns_per_pair <wall time / all pairs>" (inverse
// throughput), the last two over the threads' whole run.
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_decls.h"

namespace {

long g_pairs = 200000;
int g_threads = 1;
int g_depth = 20;
size_t g_size = 4096;
bool g_stream_per_thread = false;
bool g_sites = false;
size_t g_touch_bytes = 0;

__attribute__((noinline)) void one_pair(void*& p, cudaStream_t stream) {
    if (cudaMallocAsync(&p, g_size, stream) != cudaSuccess) std::abort();
    if (cudaFreeAsync(p, stream) != cudaSuccess) std::abort();
    asm volatile("" ::: "memory");  // no tail call
}

// Call path `Site`, frame `Level`: a distinct function (and return address)
// for each of the 64 x 16 pairs.
template <int Site, int Level>
__attribute__((noinline)) void site_frame(void*& p, cudaStream_t stream) {
    if constexpr (Level == 0) {
        one_pair(p, stream);
    } else {
        site_frame<Site, Level - 1>(p, stream);
    }
    asm volatile("" ::: "memory");
}

using SiteFn = void (*)(void*&, cudaStream_t);
template <int... Site>
constexpr std::array<SiteFn, sizeof...(Site)> make_sites(std::integer_sequence<int, Site...>) {
    return {&site_frame<Site, 15>...};
}
constexpr auto kSites = make_sites(std::make_integer_sequence<int, 64>());

__attribute__((noinline)) double run_loop(cudaStream_t stream) {
    std::vector<void*> ptrs(64, nullptr);
    std::vector<char> scratch(g_touch_bytes);
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < g_pairs; ++i) {
        void*& p = ptrs[static_cast<size_t>(i) & 63];
        if (g_sites) {
            kSites[static_cast<size_t>(i * 7) & 63](p, stream);
        } else {
            one_pair(p, stream);
        }
        for (size_t at = 0; at < scratch.size(); at += 64)
            scratch[at] = static_cast<char>(i);
        asm volatile("" : : "r"(scratch.data()) : "memory");
    }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(g_pairs);
}

// Each level is a distinct frame with its own return address.
__attribute__((noinline)) double nest(int depth, cudaStream_t stream) {
    if (depth <= 0) return run_loop(stream);
    double r = nest(depth - 1, stream);
    asm volatile("" ::: "memory");  // no tail call: keep the frame
    return r;
}

double process_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--pairs")
            g_pairs = std::atol(argv[i + 1]);
        else if (a == "--threads")
            g_threads = std::atoi(argv[i + 1]);
        else if (a == "--depth")
            g_depth = std::atoi(argv[i + 1]);
        else if (a == "--size")
            g_size = std::strtoull(argv[i + 1], nullptr, 10);
        else if (a == "--streams")
            g_stream_per_thread = std::string(argv[i + 1]) == "per-thread";
        else if (a == "--sites")
            g_sites = std::string(argv[i + 1]) != "0";
        else if (a == "--touch")
            g_touch_bytes = std::strtoull(argv[i + 1], nullptr, 10) * 1024;
        else {
            std::fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "hook_bench: no CUDA device\n");
        return 77;
    }
    {  // warm up: runtime init, allocscope init, first stacks
        long saved = g_pairs;
        g_pairs = 1000;
        nest(g_depth, nullptr);
        g_pairs = saved;
    }
    std::vector<double> per_thread(static_cast<size_t>(g_threads));
    std::vector<std::thread> threads;
    const double cpu0 = process_cpu_ns();
    const auto wall0 = std::chrono::steady_clock::now();
    for (int t = 0; t < g_threads; ++t) {
        threads.emplace_back([t, &per_thread] {
            cudaStream_t stream = nullptr;
            if (g_stream_per_thread && cudaStreamCreate(&stream) != cudaSuccess) std::abort();
            per_thread[static_cast<size_t>(t)] = nest(g_depth, stream);
            if (stream) cudaStreamDestroy(stream);
        });
    }
    for (auto& th : threads)
        th.join();
    const double wall =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - wall0).count();
    const double cpu = process_cpu_ns() - cpu0;
    const double all_pairs = double(g_pairs) * g_threads;
    std::sort(per_thread.begin(), per_thread.end());
    std::printf("ns_per_pair %.1f\n", per_thread[per_thread.size() / 2]);
    std::printf("cpu_ns_per_pair %.1f\n", cpu / all_pairs);
    std::printf("wall_ns_per_pair %.1f\n", wall / all_pairs);
    return 0;
}
