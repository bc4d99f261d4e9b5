// allocscope-demo: a small training-shaped CUDA workload for `tools/demo`.
//
// Four "layers", three steps. Forward allocates per-layer activations and a
// quantized weight copy per layer that is kept until that layer's backward
// (the accumulation pattern allocscope is built to catch); backward frees
// them and leaves one "transpose cache" per layer alive until exit. Tags go
// through <allocscope/allocscope_dl.h>, so the program also runs without the
// interposer. Memory comes from cudaMallocAsync (per tensor), cudaMalloc (a
// workspace) and cudaMallocHost (a pinned staging buffer).
#include <allocscope/allocscope_dl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_decls.h"

namespace {

constexpr int kLayers = 4;
constexpr int kSteps = 3;
constexpr size_t kHidden = 256;
constexpr size_t kTokens = 64;
constexpr size_t kWeightBytes = kHidden * kHidden * 2;  // bf16
constexpr size_t kFp8CopyBytes = kHidden * kHidden;     // one byte per element
constexpr size_t kActivationBytes = kTokens * kHidden * 2;

void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) {
        std::fprintf(stderr, "allocscope-demo: %s failed: %s\n", what, cudaGetErrorString(rc));
        std::exit(1);
    }
}

void* device_alloc(size_t bytes) {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, nullptr), "cudaMallocAsync");
    return p;
}

void device_free(void* p) {
    check(cudaFreeAsync(p, nullptr), "cudaFreeAsync");
}

}  // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "allocscope-demo: no CUDA device\n");
        return 1;
    }
    std::vector<std::string> names;
    for (int l = 0; l < kLayers; ++l)
        names.push_back("layers." + std::to_string(l));

    void* workspace = nullptr;
    check(cudaMalloc(&workspace, 4 << 20), "cudaMalloc");
    void* staging = nullptr;
    check(cudaMallocHost(&staging, 1 << 20), "cudaMallocHost");

    std::vector<void*> weights(kLayers), transpose_cache(kLayers, nullptr);
    for (int l = 0; l < kLayers; ++l) {
        weights[l] = device_alloc(kWeightBytes);
        allocscope_dl_register_param(names[l].c_str(), "weight", kHidden * kHidden, "bf16",
                                     kHidden * kHidden);
    }

    for (int step = 0; step < kSteps; ++step) {
        allocscope_dl_step(step);
        std::vector<void*> saved(kLayers), fp8_copy(kLayers);
        for (int l = 0; l < kLayers; ++l) {
            allocscope::ScopedTag tag(names[l].c_str(), "forward");
            if (transpose_cache[l]) {  // the next forward finally drops it
                device_free(transpose_cache[l]);
                transpose_cache[l] = nullptr;
            }
            fp8_copy[l] = device_alloc(kFp8CopyBytes);  // kept for backward
            saved[l] = device_alloc(kActivationBytes);
            void* scratch = device_alloc(kActivationBytes);
            device_free(scratch);
        }
        for (int l = kLayers - 1; l >= 0; --l) {
            allocscope::ScopedTag tag(names[l].c_str(), "backward");
            void* grad = device_alloc(kWeightBytes);
            transpose_cache[l] = device_alloc(kFp8CopyBytes);  // outlives backward
            device_free(fp8_copy[l]);
            device_free(saved[l]);
            device_free(grad);
        }
        allocscope::ScopedTag tag("optimizer", "optimizer");
        allocscope_dl_mark("optimizer step");
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (void* w : weights)
        device_free(w);
    check(cudaFreeHost(staging), "cudaFreeHost");
    check(cudaFree(workspace), "cudaFree");
    std::printf("allocscope-demo: %d steps of %d layers done; %d transpose caches still alive\n",
                kSteps, kLayers, kLayers);
    return 0;
}
