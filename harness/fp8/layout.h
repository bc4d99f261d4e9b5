// The buffers TransformerEngine allocates for one quantized tensor, computed
// without quantizing. Rules read from TE's pytorch/csrc/quantizer.cpp
// (create_tensor and get_scale_shape of each quantizer, TE main, 2026):
//
//   recipe     | buffers (in TE's allocation order)
//   bf16       | data [R, C] bf16 (no quantization; both usages share it)
//   delayed    | scale_inv [1] f32, data [R, C] u8, transpose [C, R] u8
//   current    | data [R, C] u8, transpose [C, R] u8, scale_inv [1] f32
//   block      | rowwise_data [R, C], rowwise_scale_inv, columnwise_data [C, R],
//              | columnwise_scale_inv (f32; shapes below)
//   mxfp8      | rowwise_data [R, C], rowwise_scale_inv, columnwise_data [R, C],
//              | columnwise_scale_inv (E8M0 bytes)
//   nvfp4      | rowwise_data [R, C/2], rowwise_scale_inv, amax_rowwise [1] f32,
//              | columnwise_data [C, R/2], columnwise_scale_inv, amax_columnwise [1]
//
// Per-tensor recipes: `data` exists for rowwise usage, or for any usage where
// the FP8 GEMM accepts non-TN layouts (sm100); `transpose` exists for
// columnwise usage only where it does not (sm90). The other recipes allocate
// the rowwise / columnwise pair for exactly the usages asked for.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fp8/formats.h"

namespace allocscope::harness::fp8 {

enum class Recipe { bf16, delayed, current, block, mxfp8, nvfp4 };

// Whether the emulated FP8 GEMM needs TN layouts (Hopper) or accepts any.
enum class Arch { sm90, sm100 };

// Weights get 2-D blocks (128×128 for Float8BlockScaling, 16×16 for NVFP4);
// activations and gradients 1-D blocks along the row.
enum class TensorRole { activation, weight };

struct Shape {
    std::size_t rows = 0;
    std::size_t cols = 0;
};

// One quantizer's configuration, as TE's Quantizer objects carry it.
struct QuantSpec {
    Recipe recipe = Recipe::bf16;
    // Element format of the FP8 recipes (E4M3 forward, E5M2 gradients under
    // HYBRID); NVFP4 ignores it (E2M1 data, E4M3 scales).
    Fp8Dtype dtype = Fp8Dtype::e4m3;
    bool rowwise = true;
    bool columnwise = true;
    TensorRole role = TensorRole::activation;
    Arch arch = Arch::sm90;
};

enum class BufferKind {
    rowwise_data,       // per-tensor recipes: TE's `_data`
    columnwise_data,    // per-tensor recipes: TE's `_transpose`
    rowwise_scale_inv,  // per-tensor recipes: the one `_scale_inv` both usages share
    columnwise_scale_inv,
    rowwise_amax,
    columnwise_amax,
};

struct BufferSpec {
    BufferKind kind;
    std::string name;                // TE's attribute name without the underscore
    std::vector<std::size_t> shape;  // the at::empty shape TE passes
    std::size_t element_bytes;
    std::size_t bytes;  // product of shape × element_bytes: what TE asks the allocator for
};

// Throws std::invalid_argument for an empty shape, no usage, or dimensions the
// recipe rejects (MXFP8: both divisible by 32; NVFP4: both divisible by 16).
std::vector<BufferSpec> layout(Shape shape, const QuantSpec& spec);

// PyTorch's CUDA caching allocator hands out multiples of 512 B (a request
// below 512 B still takes 512 B); an empty tensor allocates nothing.
std::size_t caching_allocator_size(std::size_t bytes);

std::size_t requested_bytes(const std::vector<BufferSpec>& buffers);
std::size_t allocated_bytes(const std::vector<BufferSpec>& buffers);

// Block sizes of the recipes (elements along the blocked dimension).
inline constexpr std::size_t kFloat8BlockLength = 128;
inline constexpr std::size_t kMxfp8BlockLength = 32;
inline constexpr std::size_t kNvfp4BlockLength = 16;

}  // namespace allocscope::harness::fp8
