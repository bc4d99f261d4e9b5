// Quantization on the GPU for every recipe, bit-identical to the CPU
// reference in fp8/quantize.h: the same bytes in the same buffers
// (fp8::layout order), padding scales zero. The sim backend calls
// fp8::quantize on host memory; the cuda backend calls these on device
// memory, so both backends store the same quantized weights.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "fp8/columnwise.h"
#include "fp8/layout.h"
#include "fp8/quantize.h"

namespace allocscope::harness::cuda {

// Device scratch quantize() needs (the amax reduction's word; 4-byte
// aligned). Throws std::invalid_argument where fp8::layout throws.
std::size_t quantize_scratch_bytes(fp8::Shape shape, const fp8::QuantSpec& spec);

// values: device fp32 [rows × cols], row-major. buffers: device pointers, one
// per fp8::layout(shape, spec) entry, each at least that entry's bytes.
// delayed_scale: the AmaxHistory's scale for Recipe::delayed (ignored by the
// others; the caller records the returned amax into its history). scratch:
// device memory of quantize_scratch_bytes. Returns the tensor's amax (max |x|,
// NaN ignored), as fp8::QuantizedTensor::amax; synchronizes `stream` to read
// it, then enqueues the writes of the buffers on `stream` and returns without
// waiting for them. Throws std::invalid_argument where fp8::layout throws,
// when buffers.size() differs from the layout's, or for a null pointer, and
// std::runtime_error on a CUDA error.
float quantize(const float* values, fp8::Shape shape, const fp8::QuantSpec& spec,
               float delayed_scale, std::span<void* const> buffers, void* scratch,
               cudaStream_t stream);

// The inverse, as fp8::dequantize: Usage::rowwise writes [rows × cols],
// Usage::columnwise the transpose [cols × rows] (row-major). out: device fp32.
// Asynchronous on `stream`. Throws std::invalid_argument where quantize()
// does, or if the tensor was not quantized for `usage` (bf16's one buffer
// serves both). NaN elements dequantize to a NaN, not to the CPU's payload.
void dequantize(std::span<const void* const> buffers, fp8::Shape shape, const fp8::QuantSpec& spec,
                fp8::Usage usage, float* out, cudaStream_t stream);

// As fp8::build_columnwise on device memory (gathered and out: device
// pointers): each output zeroed, then the plan's byte transposes.
// Asynchronous on `stream`. Throws std::invalid_argument where
// fp8::build_columnwise does, or for a null pointer.
void build_columnwise(const fp8::ColumnwisePlan& plan, std::span<const void* const> gathered,
                      std::span<void* const> out, cudaStream_t stream);

}  // namespace allocscope::harness::cuda
