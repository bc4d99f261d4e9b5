// Where the trainer's tensors live and where its math runs. The trainer
// (trainer.h) decides what is allocated, when, and under which tag; a
// Compute moves and transforms the bytes of those blocks. The two backends
// differ only here, so their block allocation sequences are the same:
//
//   HostCompute (sim)  : blocks are host memory; the math is harness/model's
//                        CPU code, quantization fp8::quantize, collectives
//                        the shared-memory Communicator.
//   CudaCompute (cuda) : blocks are device memory; kernels, cuBLASLt GEMMs,
//                        device quantization, NCCL (harness/cuda/).
//
// Every pointer a Compute takes is memory of its own domain: a block of the
// caching allocator or a Scratch it handed out. Scratch is the math's own
// memory outside the allocator (a GPU kernel's registers, a GEMM workspace):
// the trainer allocates it once, before the first step.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

#include "fp8/amax_history.h"
#include "fp8/columnwise.h"
#include "fp8/layout.h"
#include "fp8/quantize.h"
#include "model/adam.h"
#include "model/bf16.h"
#include "model/transformer_layer.h"
#include "trainer/model_spec.h"

namespace allocscope::harness::collective {
class Communicator;
}

namespace allocscope::harness::trainer {

class Scratch {
  public:
    Scratch() = default;
    Scratch(void* ptr, std::size_t bytes, std::function<void(void*)> release)
        : ptr_(ptr), bytes_(bytes), release_(std::move(release)) {}
    Scratch(Scratch&& other) noexcept { *this = std::move(other); }
    Scratch& operator=(Scratch&& other) noexcept {
        if (this != &other) {
            reset();
            ptr_ = std::exchange(other.ptr_, nullptr);
            bytes_ = std::exchange(other.bytes_, 0);
            release_ = std::move(other.release_);
        }
        return *this;
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() { reset(); }

    void reset() {
        if (ptr_ && release_) release_(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    float* floats() const { return static_cast<float*>(ptr_); }
    void* data() const { return ptr_; }
    std::size_t bytes() const { return bytes_; }

  private:
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
    std::function<void(void*)> release_;
};

// A GEMM operand or 1-D parameter as the layer consumes it: fp32 values
// always ([rows × cols]; GEMM weights [out × in]); for per-tensor FP8 weights
// also their E4M3 bytes and scale_inv, which a backend with an FP8 GEMM uses
// (fprop on the row-wise data, dgrad on the transpose).
struct WeightOperand {
    const float* values = nullptr;
    const std::uint8_t* rowwise = nullptr;
    const float* rowwise_scale_inv = nullptr;
    const std::uint8_t* columnwise = nullptr;
    const float* columnwise_scale_inv = nullptr;
};
using LayerOperands = std::array<WeightOperand, model::kLayerParamCount>;

class Compute {
  public:
    virtual ~Compute() = default;

    virtual const char* name() const = 0;
    virtual Scratch scratch(std::size_t bytes) = 0;

    // Host ↔ compute memory, and within compute memory.
    virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
    virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
    virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
    virtual void zero(void* dst, std::size_t bytes) = 0;

    virtual void to_bf16(const float* src, std::size_t n, model::Bf16* dst) = 0;
    virtual void to_float(const model::Bf16* src, std::size_t n, float* dst) = 0;
    // [rows × cols] → [cols × rows], row-major fp32.
    virtual void transpose(const float* src, std::size_t rows, std::size_t cols, float* dst) = 0;

    // As fp8::quantize into the buffers of fp8::layout(shape, spec) (one
    // pointer per entry). Recipe::delayed quantizes with history->scale()
    // and records the amax into *history; the others take nullptr.
    virtual void quantize(const float* values, fp8::Shape shape, const fp8::QuantSpec& spec,
                          fp8::AmaxHistory* history, std::span<void* const> buffers) = 0;
    // As fp8::dequantize: [rows × cols], or the transpose for columnwise.
    virtual void dequantize(std::span<const void* const> buffers, fp8::Shape shape,
                            const fp8::QuantSpec& spec, fp8::Usage usage, float* out) = 0;
    // As fp8::build_columnwise: the column-wise form of an all-gathered
    // quantized parameter, moved out of its gathered row-wise bytes.
    virtual void build_columnwise(const fp8::ColumnwisePlan& plan,
                                  std::span<const void* const> gathered,
                                  std::span<void* const> out) = 0;

    // model::layer_forward<Bf16> / layer_backward<Bf16>.
    virtual void layer_forward(const model::LayerConfig& config, const LayerOperands& weights,
                               const model::Bf16* x, model::Bf16* y,
                               const model::LayerSaved<model::Bf16>& saved) = 0;
    virtual void layer_backward(const model::LayerConfig& config, const LayerOperands& weights,
                                const model::Bf16* x, const model::LayerSaved<model::Bf16>& saved,
                                const model::Bf16* dy, model::Bf16* dx,
                                const model::LayerGrads& grads) = 0;

    // MSE of y against target (returned to the host) and dy = its gradient.
    virtual float mse(const model::Bf16* y, const model::Bf16* target, std::size_t n,
                      model::Bf16* dy) = 0;
    // model::adam_step on one shard; grad is the bf16 sharded gradient;
    // weights (bf16 model parameters) may be null.
    virtual void adam(const model::AdamConfig& config, std::int64_t step, float* master,
                      const model::Bf16* grad, float* exp_avg, float* exp_avg_sq,
                      model::Bf16* weights, std::size_t n) = 0;

    // FSDP2's collectives on compute memory (NCCL on cuda).
    virtual void all_gather(const void* mine, std::size_t bytes_per_rank, void* out) = 0;
    virtual void reduce_scatter_avg(const model::Bf16* in, std::size_t count_per_rank,
                                    model::Bf16* out) = 0;

    // Waits for queued work (step timing).
    virtual void synchronize() = 0;

    // The device memory in use by the driver's count (cudaMemGetInfo:
    // total - free), for the report's self-check; 0 where not known.
    virtual std::uint64_t device_memory_used() { return 0; }
};

inline model::LayerConfig layer_config(const ModelShape& s) {
    return {std::size_t(s.hidden), std::size_t(s.heads), std::size_t(s.ffn), std::size_t(s.seq),
            std::size_t(s.batch)};
}

// The sim backend's Compute: host memory, harness/model's CPU math and the
// shared-memory collectives of `comm`.
std::unique_ptr<Compute> make_host_compute(collective::Communicator& comm,
                                           const model::LayerConfig& config);

}  // namespace allocscope::harness::trainer
