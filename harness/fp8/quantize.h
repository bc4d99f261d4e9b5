// Real quantization of a row-major [rows × cols] float tensor for each
// recipe, into exactly the buffers layout() lists, and back to float.
//
// Numerics follow TE's kernels: per-tensor and Float8BlockScaling multiply by
// an fp32 scale and cast with satfinite (scale = fp8_max / amax; block scales
// are powers of two, TE's default); MXFP8 multiplies by 2^(127 − e) with
// e = E8M0 round-up of amax / fp8_max; NVFP4 uses a global encode scale
// S = 448·6 / amax and per-block E4M3 scales of block_amax · S / 6. The amax
// of every recipe ignores NaN elements (fmaxf), which still encode as NaN in
// the FP8 formats. Not emulated: NVFP4's random Hadamard transform and
// stochastic rounding (they change values, not sizes), and the GEMM-swizzled
// scale order of MXFP8/NVFP4 (a permutation of the same bytes; we store the
// compact row-major order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fp8/amax_history.h"
#include "fp8/layout.h"
#include "fp8/usage_plan.h"

namespace allocscope::harness::fp8 {

struct QuantizedBuffer {
    BufferSpec spec;
    std::vector<std::uint8_t> bytes;  // spec.bytes long; padding scales are 0
};

struct QuantizedTensor {
    Shape shape;
    QuantSpec spec;
    float amax = 0.0f;                     // max |x| of the source, NaN ignored
    std::vector<QuantizedBuffer> buffers;  // layout(shape, spec), in that order

    // nullptr when this tensor has no buffer of that kind.
    const QuantizedBuffer* find(BufferKind kind) const;
};

// Every recipe except delayed. Throws std::invalid_argument if
// values.size() != rows × cols, for Recipe::delayed (use the overload below),
// or where layout() throws.
QuantizedTensor quantize(std::span<const float> values, Shape shape, const QuantSpec& spec);

// Recipe::delayed: quantizes with history.scale() and records the tensor's
// amax into the history's current step.
QuantizedTensor quantize(std::span<const float> values, Shape shape, const QuantSpec& spec,
                         AmaxHistory& history);

// Rowwise: the [rows × cols] tensor. Columnwise: its transpose, [cols × rows]
// row-major, as the GEMM consumes it (for MXFP8, whose column-wise data is
// stored untransposed, the transpose is taken here). Throws
// std::invalid_argument if the tensor was not quantized for that usage.
std::vector<float> dequantize(const QuantizedTensor& tensor, Usage usage);

}  // namespace allocscope::harness::fp8
