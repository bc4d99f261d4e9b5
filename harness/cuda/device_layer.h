// The reference transformer layer on the GPU: the same stages, in the same
// order and with the same bf16 rounding of saved activations as
// model/transformer_layer.h, on device memory. GEMMs run through cuBLASLt:
// fp32 on fp32 weight values, or — for per-tensor FP8 weights — the FP8 TN
// GEMM on the weight's E4M3 bytes with the activation (forward) or gradient
// (dgrad) quantized with current scaling to E4M3 / E5M2 (TE's HYBRID format).
// Every pointer is device memory; nothing here allocates from the caching
// allocator (scratch comes from the caller's workspace; Blas owns one
// cudaMalloc'd cuBLASLt workspace for its lifetime).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "model/bf16.h"
#include "model/transformer_layer.h"

namespace allocscope::harness::cuda {

// A cuBLASLt handle, its workspace (32 MiB) and the stream everything runs
// on. GEMMs are queued on that stream and not waited for. A cuBLASLt error
// throws std::runtime_error; arguments it cannot take, std::invalid_argument.
class Blas {
  public:
    explicit Blas(cudaStream_t stream);
    ~Blas();
    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;

    cudaStream_t stream() const { return stream_; }

    // Row-major fp32, as model::gemm: C[m × n] = op(A)[m × k] · op(B)[k × n]
    // + beta · C. lda/ldb/ldc are row-major leading dimensions of the stored
    // matrices. fp32 compute without TF32; beta == 0 does not read C; k == 0
    // leaves beta · C.
    void gemm_f32(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                  bool trans_a, const float* b, std::size_t ldb, bool trans_b, float beta, float* c,
                  std::size_t ldc);

    // FP8 TN GEMM, row-major: y[rows × out] = dequant(x)[rows × in] ·
    // dequant(w)[out × in]ᵀ with x's and w's scale_inv (device floats) applied
    // by cuBLASLt; x is E4M3 or E5M2, w E4M3; y fp32. rows, in and out must be
    // multiples of 16.
    void gemm_fp8_tn(std::size_t rows, std::size_t in, std::size_t out, const std::uint8_t* x,
                     bool x_e5m2, const float* x_scale_inv, const std::uint8_t* w,
                     const float* w_scale_inv, float* y);

  private:
    cudaStream_t stream_;
    void* handle_ = nullptr;  // cublasLtHandle_t
    void* workspace_ = nullptr;
    std::size_t workspace_bytes_ = 0;
};

// One parameter as the layer consumes it. `values` is always set: fp32
// [rows × cols] of the parameter (GEMM weights [out × in]). Per-tensor FP8
// weights (delayed, current) also give their E4M3 bytes: fprop then runs the
// FP8 GEMM on `rowwise` ([out × in]) and dgrad on `columnwise`, the
// transpose [in × out] that sm90's TN-only FP8 GEMM needs; each is used when
// set, otherwise that GEMM runs in fp32 on `values`.
struct DeviceParam {
    const float* values = nullptr;
    const std::uint8_t* rowwise = nullptr;
    const float* rowwise_scale_inv = nullptr;
    const std::uint8_t* columnwise = nullptr;
    const float* columnwise_scale_inv = nullptr;
};
using DeviceLayerWeights = std::array<DeviceParam, model::kLayerParamCount>;

// Device workspace of each pass, in bytes. The passes take it 256-byte
// aligned (as cudaMalloc returns it) and throw std::invalid_argument for a
// config whose hidden size the heads do not divide, or — with FP8 weights —
// token, in and out sizes that are not multiples of 16.
std::size_t layer_forward_workspace_bytes(const model::LayerConfig& config);
std::size_t layer_backward_workspace_bytes(const model::LayerConfig& config);

// Both passes run on blas.stream() and return without waiting for it, except
// that each FP8 GEMM's input quantization (cuda::quantize) synchronizes the
// stream once to read the amax back.
//
// As model::layer_forward<Bf16>: x, y [T × H] bf16; fills every saved field.
void layer_forward(Blas& blas, const model::LayerConfig& config, const DeviceLayerWeights& weights,
                   const model::Bf16* x, model::Bf16* y,
                   const model::LayerSaved<model::Bf16>& saved, void* workspace);

// As model::layer_backward<Bf16>: grads are device fp32, overwritten.
void layer_backward(Blas& blas, const model::LayerConfig& config, const DeviceLayerWeights& weights,
                    const model::Bf16* x, const model::LayerSaved<model::Bf16>& saved,
                    const model::Bf16* dy, model::Bf16* dx, const model::LayerGrads& grads,
                    void* workspace);

}  // namespace allocscope::harness::cuda
