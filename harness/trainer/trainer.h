// One rank of the FSDP2-style FP8 trainer, on either backend (compute.h).
//
// Every tensor a PyTorch + TransformerEngine rank would hold on the GPU is a
// block of the caching allocator (so allocscope sees block events and, via
// cudaMalloc, segments) and is made under a tag: layer (`layers.<i>`, or the
// sub-module for weight-derived tensors) and phase (`forward`,
// `forward/all_gather`, `forward/quantize`, `backward`, ...). The math runs
// in the Compute's fp32 scratch outside the allocator (on the GPU: kernel
// registers, GEMM workspaces).
//
// Lifecycle per layer i, as TE-FSDP2-FP8-MEMORY.md's "Healthy FSDP2
// lifecycle" describes it:
//   forward  : copy-out of the all-gathered flat buffer into 12 unsharded
//              parameters, free the previous layer's flat buffer, all-gather
//              layer i+1 (prefetch), run, save activations, reshard;
//   backward : same unshard (prefetch i-1), run, free the saved activations,
//              reduce-scatter input allocated, unsharded gradients freed,
//              sharded gradients allocated (alive until zero_grad), the
//              previous layer's reduce-scatter input freed, reshard.
// With an FP8 recipe, each GEMM weight is quantized in forward:
//   --te seed : both usages, kept until the layer's backward (problem 1);
//   --te fixed: row-wise only, freed after the forward GEMM; backward
//               re-quantizes column-wise and frees it after dgrad.
// With --quantized-init, where the backward needs a column-wise form
// (fp8/columnwise.h), it is moved out of the gathered bytes in the backward's
// unshard (the block's all-gather tag), freed after dgrad (--te fixed) or
// at the layer's next forward (--te seed, problem 2). Weight-derived blocks
// are declared with allocscope_derived unless Options::provenance is off.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "alloc/caching_allocator.h"
#include "collective/communicator.h"
#include "trainer/compute.h"
#include "trainer/options.h"

namespace allocscope::harness::trainer {

// memory_allocated() at the points the reference test samples.
struct StepMemory {
    std::vector<uint64_t> after_layer_forward;  // after each layer's reshard
    uint64_t after_forward = 0;
    uint64_t after_backward = 0;
    uint64_t after_optimizer = 0;
};

struct StepResult {
    double loss = 0;  // mean over ranks
    double milliseconds = 0;
    StepMemory memory;
    uint64_t allocated = 0;  // at the end of the step
    uint64_t reserved = 0;
};

class Trainer {
  public:
    // `arch` is the resolved --arch. The allocator, communicator and compute
    // outlive the trainer; the allocator's segments and the compute's memory
    // are of the same domain (host for sim, the rank's GPU for cuda).
    Trainer(const Options& options, fp8::Arch arch, alloc::CachingAllocator& allocator,
            collective::Communicator& comm, Compute& compute);
    ~Trainer();
    Trainer(const Trainer&) = delete;
    Trainer& operator=(const Trainer&) = delete;

    // Runs training step `step` (0-based): forward, backward, optimizer.
    StepResult step(int step);

  private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace allocscope::harness::trainer
