// ns per capture_stack() at depths 8/24/64: _Unwind_Backtrace (the previous
// implementation) against the cached CFI walk, warm and cold. Prints medians.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "unwind.h"
#include "unwind_cfi.h"

namespace {

constexpr int kChainLength = 64;
constexpr int kRuns = 9;
constexpr int kWarmCaptures = 20000;
constexpr int kColdCaptures = 300;

__attribute__((noinline)) size_t capture_baseline(uint64_t* frames, size_t max_depth) {
    return allocscope::capture_stack_unwinder(frames, max_depth, 0);
}

enum class Method { kBaseline, kCachedWarm, kCachedCold };

struct Job {
    Method method;
    size_t max_depth;
    double ns_per_capture[kRuns];
    size_t frames_captured;
};

using Clock = std::chrono::steady_clock;

double elapsed_ns(Clock::time_point start, Clock::time_point end) {
    return std::chrono::duration<double, std::nano>(end - start).count();
}

__attribute__((noinline)) void measure(Job& job) {
    uint64_t frames[kChainLength + 16];
    for (double& result : job.ns_per_capture) {
        if (job.method == Method::kCachedCold) {
            double total = 0;
            for (int i = 0; i < kColdCaptures; ++i) {
                allocscope::clear_frame_rule_cache();
                Clock::time_point start = Clock::now();
                job.frames_captured = allocscope::capture_stack(frames, job.max_depth, 0);
                total += elapsed_ns(start, Clock::now());
            }
            result = total / kColdCaptures;
            continue;
        }
        Clock::time_point start = Clock::now();
        for (int i = 0; i < kWarmCaptures; ++i) {
            job.frames_captured = job.method == Method::kBaseline
                                      ? capture_baseline(frames, job.max_depth)
                                      : allocscope::capture_stack(frames, job.max_depth, 0);
            asm volatile("" : : "r"(frames) : "memory");
        }
        result = elapsed_ns(start, Clock::now()) / kWarmCaptures;
    }
}

// Distinct functions, so every frame of the walk has its own return address
// and cache slot; every third one keeps a buffer on the stack.
template <int N>
__attribute__((noinline)) void descend(Job& job) {
    if constexpr (N == 0) {
        measure(job);
    } else if constexpr (N % 3 == 0) {
        char buffer[64 + N];
        asm volatile("" : : "r"(buffer) : "memory");
        descend<N - 1>(job);
        asm volatile("" : : "r"(buffer) : "memory");
    } else {
        descend<N - 1>(job);
        asm volatile("" ::: "memory");
    }
}

double median(const double (&values)[kRuns]) {
    std::vector<double> sorted(std::begin(values), std::end(values));
    std::sort(sorted.begin(), sorted.end());
    return sorted[kRuns / 2];
}

}  // namespace

int main() {
    std::printf("%-6s %-7s %14s %14s %14s %8s\n", "depth", "frames", "baseline ns",
                "cached warm ns", "cached cold ns", "speedup");
    for (size_t depth : {size_t{8}, size_t{24}, size_t{64}}) {
        Job jobs[] = {{Method::kBaseline, depth, {}, 0},
                      {Method::kCachedWarm, depth, {}, 0},
                      {Method::kCachedCold, depth, {}, 0}};
        for (Job& job : jobs)
            descend<kChainLength>(job);
        double baseline = median(jobs[0].ns_per_capture);
        double warm = median(jobs[1].ns_per_capture);
        double cold = median(jobs[2].ns_per_capture);
        std::printf("%-6zu %-7zu %14.1f %14.1f %14.1f %7.1fx\n", depth, jobs[1].frames_captured,
                    baseline, warm, cold, baseline / warm);
    }
    std::printf("captures answered by the _Unwind_Backtrace fallback: %llu\n",
                static_cast<unsigned long long>(allocscope::fallback_capture_count()));
    return 0;
}
