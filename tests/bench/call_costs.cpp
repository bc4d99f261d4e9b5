// call_costs: what the primitives on the hook path cost on this machine
// (clock_gettime, cudaGetDevice, an uncontended and a shared atomic add),
// to explain tools/bench-hooks' numbers. Not a test.
#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "cuda_decls.h"

namespace {

template <typename F>
double ns_per_call(F&& f, long n = 2'000'000) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i)
        f();
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n);
}

}  // namespace

int main() {
    timespec ts;
    std::printf("clock_gettime(CLOCK_MONOTONIC) %.1f ns\n",
                ns_per_call([&] { clock_gettime(CLOCK_MONOTONIC, &ts); }));
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) {
        std::printf("cudaGetDevice, no context yet %.1f ns\n",
                    ns_per_call([&] { cudaGetDevice(&device); }, 100'000));
    }
    cudaFree(nullptr);  // initializes the runtime and its primary context
    std::printf("cudaGetDevice, after cudaFree(0) %.1f ns\n",
                ns_per_call([&] { cudaGetDevice(&device); }, 100'000));
    // How interposer/device_cache.cpp finds the current context.
    using GetContext = int (*)(void**);
    auto get_context = reinterpret_cast<GetContext>(dlsym(RTLD_DEFAULT, "cuCtxGetCurrent"));
    std::printf("cuCtxGetCurrent via RTLD_DEFAULT: %s\n", get_context ? "found" : "missing");
    if (!get_context) {
        if (void* libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
            get_context = reinterpret_cast<GetContext>(dlsym(libcuda, "cuCtxGetCurrent"));
        }
        std::printf("cuCtxGetCurrent via libcuda.so.1: %s\n", get_context ? "found" : "missing");
    }
    if (get_context) {
        void* context = nullptr;
        int rc = get_context(&context);
        std::printf("current context on the main thread: rc %d, %s\n", rc,
                    context ? "set" : "none");
        std::thread([&] {
            void* c = nullptr;
            void* p = nullptr;
            cudaMalloc(&p, 256);
            get_context(&c);
            std::printf("current context on a new thread after cudaMalloc: %s\n",
                        c ? "set" : "none");
            cudaFree(p);
        }).join();
        std::printf("cuCtxGetCurrent %.1f ns\n", ns_per_call([&] { get_context(&context); }));
    }
    std::atomic<unsigned long> counter{0};
    std::printf("atomic fetch_add, 1 thread %.1f ns\n",
                ns_per_call([&] { counter.fetch_add(1, std::memory_order_acq_rel); }));
    for (int threads : {2, 4, 16}) {
        std::vector<std::thread> pool;
        std::vector<double> result(static_cast<size_t>(threads));
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                result[static_cast<size_t>(t)] =
                    ns_per_call([&] { counter.fetch_add(1, std::memory_order_acq_rel); }, 500'000);
            });
        }
        for (auto& th : pool)
            th.join();
        double sum = 0;
        for (double r : result)
            sum += r;
        std::printf("atomic fetch_add on one shared line, %d threads %.1f ns\n", threads,
                    sum / threads);
    }
    return 0;
}
