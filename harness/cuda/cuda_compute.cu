#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "cuda_compute.h"
#include "device_layer.h"
#include "device_quantize.h"
#include "quant/device_formats.cuh"

namespace allocscope::harness::cuda {

namespace {

using model::Bf16;

void check_nccl(ncclResult_t status, const char* what, const char* file, int line) {
    if (status != ncclSuccess) fail(what, ncclGetErrorString(status), file, line);
}
#define ALLOCSCOPE_NCCL_CHECK(call) check_nccl((call), #call, __FILE__, __LINE__)

constexpr int kThreads = 256;

unsigned blocks_for(std::size_t n) {
    const std::size_t b = (n + kThreads - 1) / kThreads;
    return unsigned(b < 65535 ? (b ? b : 1) : 65535);
}

using quant::bf16_from_float;
using quant::float_from_bf16;

__global__ void to_bf16_kernel(const float* src, std::size_t n, std::uint16_t* dst) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x)
        dst[i] = bf16_from_float(src[i]);
}

__global__ void to_float_kernel(const std::uint16_t* src, std::size_t n, float* dst) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x)
        dst[i] = float_from_bf16(src[i]);
}

__global__ void transpose_kernel(const float* src, std::size_t rows, std::size_t cols, float* dst) {
    const std::size_t n = rows * cols;
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        const std::size_t r = i / cols, c = i % cols;
        dst[c * rows + r] = src[i];
    }
}

// One block: the sum of squared differences in double, in a fixed order, so
// the loss is reproducible; then dy = 2 (y − t) / n as mse_loss_backward.
__global__ void mse_kernel(const std::uint16_t* y, const std::uint16_t* target, std::size_t n,
                           float* loss, std::uint16_t* dy) {
    __shared__ double partial[kThreads];
    double sum = 0.0;
    const float scale = 2.0f / static_cast<float>(n);
    for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float yi = float_from_bf16(y[i]), ti = float_from_bf16(target[i]);
        const double d = double(yi) - double(ti);
        sum += d * d;
        dy[i] = bf16_from_float(scale * (yi - ti));
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = static_cast<float>(partial[0] / double(n));
}

// model::adam_step's per-element math (fp32), bias corrections from the host.
__global__ void adam_kernel(model::AdamConfig c, float correction1, float correction2,
                            float* master, const std::uint16_t* grad, float* exp_avg,
                            float* exp_avg_sq, std::uint16_t* weights, std::size_t n) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        const float g = float_from_bf16(grad[i]);
        const float m = c.beta1 * exp_avg[i] + (1.0f - c.beta1) * g;
        const float v = c.beta2 * exp_avg_sq[i] + (1.0f - c.beta2) * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float denom = sqrtf(v / correction2) + c.eps;
        const float update = (m / correction1) / denom + c.weight_decay * master[i];
        master[i] -= c.lr * update;
        if (weights) weights[i] = bf16_from_float(master[i]);
    }
}

class CudaCompute final : public trainer::Compute {
  public:
    CudaCompute(int device, collective::Communicator& bootstrap, const model::LayerConfig& config)
        : device_(device) {
        ALLOCSCOPE_CUDA_CHECK(cudaSetDevice(device));
        ALLOCSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        blas_ = std::make_unique<Blas>(stream_);
        forward_workspace_ = scratch(cuda::layer_forward_workspace_bytes(config));
        backward_workspace_ = scratch(cuda::layer_backward_workspace_bytes(config));
        loss_ = scratch(sizeof(float));
        ncclUniqueId id{};
        if (bootstrap.rank() == 0) ALLOCSCOPE_NCCL_CHECK(ncclGetUniqueId(&id));
        bootstrap.broadcast(&id, sizeof id, 0);
        ALLOCSCOPE_NCCL_CHECK(
            ncclCommInitRank(&nccl_, bootstrap.world_size(), id, bootstrap.rank()));
    }

    ~CudaCompute() override {
        // Teardown errors cannot be reported from here; the process is ending.
        (void)cudaStreamSynchronize(stream_);
        if (nccl_) (void)ncclCommDestroy(nccl_);
        forward_workspace_.reset();
        backward_workspace_.reset();
        loss_.reset();
        quantize_scratch_.reset();
        blas_.reset();
        for (void* arena : arenas_)
            (void)cudaFree(arena);
        (void)cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }

    // The math's own device memory, outside the caching allocator: carved
    // from a few large cudaMalloc arenas so that it adds a handful of
    // segments to a trace, not one per buffer. Released with the Compute.
    trainer::Scratch scratch(std::size_t bytes) override {
        constexpr std::size_t kAlignment = 256;
        constexpr std::size_t kArenaBytes = std::size_t{64} << 20;
        const std::size_t need =
            (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
        if (arenas_.empty() || arena_used_ + need > arena_size_) {
            void* p = nullptr;
            arena_size_ = std::max(need, kArenaBytes);
            ALLOCSCOPE_CUDA_CHECK(cudaMalloc(&p, arena_size_));
            arenas_.push_back(p);
            arena_used_ = 0;
        }
        auto* p = static_cast<std::byte*>(arenas_.back()) + arena_used_;
        arena_used_ += need;
        ALLOCSCOPE_CUDA_CHECK(cudaMemsetAsync(p, 0, need, stream_));
        return trainer::Scratch(p, bytes, nullptr);
    }

    void upload(void* dst, const void* src, std::size_t bytes) override {
        ALLOCSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        ALLOCSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void download(void* dst, const void* src, std::size_t bytes) override {
        ALLOCSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        ALLOCSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void copy(void* dst, const void* src, std::size_t bytes) override {
        if (bytes == 0 || dst == src) return;
        ALLOCSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    void zero(void* dst, std::size_t bytes) override {
        ALLOCSCOPE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
    }

    void to_bf16(const float* src, std::size_t n, Bf16* dst) override {
        if (n == 0) return;
        to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(
            src, n, reinterpret_cast<std::uint16_t*>(dst));
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }
    void to_float(const Bf16* src, std::size_t n, float* dst) override {
        if (n == 0) return;
        to_float_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(
            reinterpret_cast<const std::uint16_t*>(src), n, dst);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }
    void transpose(const float* src, std::size_t rows, std::size_t cols, float* dst) override {
        if (rows * cols == 0) return;
        transpose_kernel<<<blocks_for(rows * cols), kThreads, 0, stream_>>>(src, rows, cols, dst);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }

    void quantize(const float* values, fp8::Shape shape, const fp8::QuantSpec& spec,
                  fp8::AmaxHistory* history, std::span<void* const> buffers) override {
        const std::size_t need = quantize_scratch_bytes(shape, spec);
        if (quantize_scratch_.bytes() < need) {
            // Grows to the largest tensor's need during the first step (the
            // arena keeps the smaller one until the end).
            quantize_scratch_ = scratch(need);
        }
        const float scale = history ? history->scale() : 1.0f;
        const float amax =
            cuda::quantize(values, shape, spec, scale, buffers, quantize_scratch_.data(), stream_);
        if (history) history->record(amax);
    }
    void dequantize(std::span<const void* const> buffers, fp8::Shape shape,
                    const fp8::QuantSpec& spec, fp8::Usage usage, float* out) override {
        cuda::dequantize(buffers, shape, spec, usage, out, stream_);
    }
    void build_columnwise(const fp8::ColumnwisePlan& plan, std::span<const void* const> gathered,
                          std::span<void* const> out) override {
        cuda::build_columnwise(plan, gathered, out, stream_);
    }

    void layer_forward(const model::LayerConfig& config, const trainer::LayerOperands& weights,
                       const Bf16* x, Bf16* y, const model::LayerSaved<Bf16>& saved) override {
        cuda::layer_forward(*blas_, config, params(weights), x, y, saved,
                            forward_workspace_.data());
    }
    void layer_backward(const model::LayerConfig& config, const trainer::LayerOperands& weights,
                        const Bf16* x, const model::LayerSaved<Bf16>& saved, const Bf16* dy,
                        Bf16* dx, const model::LayerGrads& grads) override {
        cuda::layer_backward(*blas_, config, params(weights), x, saved, dy, dx, grads,
                             backward_workspace_.data());
    }

    float mse(const Bf16* y, const Bf16* target, std::size_t n, Bf16* dy) override {
        mse_kernel<<<1, kThreads, 0, stream_>>>(reinterpret_cast<const std::uint16_t*>(y),
                                                reinterpret_cast<const std::uint16_t*>(target), n,
                                                loss_.floats(),
                                                reinterpret_cast<std::uint16_t*>(dy));
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
        float loss = 0;
        download(&loss, loss_.data(), sizeof loss);
        return loss;
    }

    void adam(const model::AdamConfig& config, std::int64_t step, float* master, const Bf16* grad,
              float* exp_avg, float* exp_avg_sq, Bf16* weights, std::size_t n) override {
        if (n == 0) return;
        const double s = static_cast<double>(step);
        const auto c1 = static_cast<float>(1.0 - std::pow(double{config.beta1}, s));
        const auto c2 = static_cast<float>(1.0 - std::pow(double{config.beta2}, s));
        adam_kernel<<<blocks_for(n), kThreads, 0, stream_>>>(
            config, c1, c2, master, reinterpret_cast<const std::uint16_t*>(grad), exp_avg,
            exp_avg_sq, reinterpret_cast<std::uint16_t*>(weights), n);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }

    void all_gather(const void* mine, std::size_t bytes_per_rank, void* out) override {
        ALLOCSCOPE_NCCL_CHECK(ncclAllGather(mine, out, bytes_per_rank, ncclUint8, nccl_, stream_));
    }
    void reduce_scatter_avg(const Bf16* in, std::size_t count_per_rank, Bf16* out) override {
        ALLOCSCOPE_NCCL_CHECK(
            ncclReduceScatter(in, out, count_per_rank, ncclBfloat16, ncclAvg, nccl_, stream_));
    }

    void synchronize() override { ALLOCSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

    std::uint64_t device_memory_used() override {
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
        return total - free;
    }

  private:
    static DeviceLayerWeights params(const trainer::LayerOperands& operands) {
        DeviceLayerWeights out{};
        for (std::size_t k = 0; k < out.size(); ++k) {
            const trainer::WeightOperand& w = operands[k];
            out[k] = {w.values, w.rowwise, w.rowwise_scale_inv, w.columnwise,
                      w.columnwise_scale_inv};
        }
        return out;
    }

    int device_;
    cudaStream_t stream_ = nullptr;
    std::unique_ptr<Blas> blas_;
    ncclComm_t nccl_ = nullptr;
    trainer::Scratch forward_workspace_;
    trainer::Scratch backward_workspace_;
    trainer::Scratch loss_;
    trainer::Scratch quantize_scratch_;
    std::vector<void*> arenas_;
    std::size_t arena_size_ = 0;
    std::size_t arena_used_ = 0;
};

}  // namespace

std::unique_ptr<trainer::Compute> make_cuda_compute(int device, collective::Communicator& bootstrap,
                                                    const model::LayerConfig& config) {
    return std::make_unique<CudaCompute>(device, bootstrap, config);
}

}  // namespace allocscope::harness::cuda
