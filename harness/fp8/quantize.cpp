#include "fp8/quantize.h"

#include "model/bf16.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace allocscope::harness::fp8 {

namespace {

constexpr float kFloatMax = std::numeric_limits<float>::max();

UsagePlan plan_for(const QuantizedTensor& t, Usage usage) {
    return usage_plan(t.spec.recipe, t.spec.role, t.shape, usage,
                      t.find(BufferKind::columnwise_data) != nullptr);
}

QuantizedBuffer& buffer_of(QuantizedTensor& t, BufferKind kind) {
    for (auto& b : t.buffers) {
        if (b.spec.kind == kind) return b;
    }
    throw std::logic_error("quantization plan names a buffer the layout lacks");
}

std::size_t scale_index(const UsagePlan& p, const QuantizedBuffer& scales, std::size_t m,
                        std::size_t k) {
    const std::size_t stride = scales.spec.shape.size() == 2 ? scales.spec.shape[1] : 1;
    const std::size_t r = m / p.scale_rows, c = k / p.scale_cols;
    return p.scale_transposed ? c * stride + r : r * stride + c;
}

std::size_t data_index(const UsagePlan& p, Shape s, std::size_t m, std::size_t k) {
    return p.data_transposed ? k * s.rows + m : m * s.cols + k;
}

void store_f32(std::uint8_t* at, float value) {
    std::memcpy(at, &value, sizeof value);
}

float load_f32(const std::uint8_t* at) {
    float value = 0;
    std::memcpy(&value, at, sizeof value);
    return value;
}

// TE's compute_scale_from_amax with epsilon 0: amax of 0, inf or NaN gives
// scale 1; a scale that overflows becomes FLT_MAX; power-of-two scales keep
// only sign and exponent bits.
float scale_from_amax(float amax, float max_value, bool power_of_two) {
    if (amax == 0.0f || !std::isfinite(amax)) return 1.0f;
    float scale = max_value / amax;
    if (std::isinf(scale)) scale = kFloatMax;
    if (power_of_two)
        scale = std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) & 0xFF800000u);
    return scale;
}

// 2^(127 − e): the factor an MXFP8 block is multiplied by before the cast.
float e8m0_reciprocal(std::uint8_t e) {
    if (e == 0xFF) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, 127 - static_cast<int>(e));
}

// TE's compute_global_encode_scaling_factor_FP4.
float nvfp4_global_encode_scale(float amax) {
    const float scale = std::fmin(kE4m3Max * kE2m1Max / amax, kFloatMax);
    if (amax == 0.0f || scale == 0.0f) return 1.0f;
    return scale;
}

float tile_amax(std::span<const float> x, Shape s, std::size_t r0, std::size_t r1, std::size_t c0,
                std::size_t c1) {
    float amax = 0.0f;
    for (std::size_t m = r0; m < r1; ++m) {
        for (std::size_t k = c0; k < c1; ++k)
            amax = std::fmax(amax, std::fabs(x[m * s.cols + k]));
    }
    return amax;
}

// Quantizes one usage of `t` from `x`. `tensor_scale` is the per-tensor
// scale of delayed/current scaling (unused by the block recipes).
void quantize_usage(std::span<const float> x, QuantizedTensor& t, Usage usage, float tensor_scale) {
    const UsagePlan p = plan_for(t, usage);
    const Shape s = t.shape;
    const Recipe recipe = t.spec.recipe;
    const Fp8Dtype dtype = t.spec.dtype;
    QuantizedBuffer& data = buffer_of(t, p.data_kind);
    QuantizedBuffer& scales = buffer_of(t, p.scale_kind);

    const float nvfp4_encode = nvfp4_global_encode_scale(t.amax);
    const auto nvfp4_decode = static_cast<float>(1.0 / nvfp4_encode);
    if (recipe == Recipe::nvfp4) store_f32(buffer_of(t, p.amax_kind).bytes.data(), t.amax);

    for (std::size_t r0 = 0; r0 < s.rows; r0 += p.tile_rows) {
        const std::size_t r1 = std::min(s.rows, r0 + p.tile_rows);
        for (std::size_t c0 = 0; c0 < s.cols; c0 += p.tile_cols) {
            const std::size_t c1 = std::min(s.cols, c0 + p.tile_cols);
            const float amax = tile_amax(x, s, r0, r1, c0, c1);
            float multiplier = tensor_scale;
            std::uint8_t scale_byte = 0;
            switch (recipe) {
                case Recipe::block:
                    multiplier = scale_from_amax(amax, fp8_max(dtype), true);
                    break;
                case Recipe::mxfp8:
                    scale_byte = e8m0_from_float_round_up(amax * (1.0f / fp8_max(dtype)));
                    multiplier = e8m0_reciprocal(scale_byte);
                    break;
                case Recipe::nvfp4:
                    scale_byte = e4m3_from_float(amax * (nvfp4_encode * (1.0f / kE2m1Max)));
                    multiplier =
                        std::fmin(1.0f / (float_from_e4m3(scale_byte) * nvfp4_decode), kFloatMax);
                    break;
                case Recipe::delayed:
                case Recipe::current:
                case Recipe::bf16:
                    break;
            }
            for (std::size_t m = r0; m < r1; ++m) {
                for (std::size_t k = c0; k < c1; ++k) {
                    const std::size_t si = scale_index(p, scales, m, k);
                    if (scales.spec.element_bytes == 4) {
                        store_f32(scales.bytes.data() + 4 * si, 1.0f / multiplier);
                    } else {
                        scales.bytes[si] = scale_byte;
                    }
                    const float scaled = x[m * s.cols + k] * multiplier;
                    const std::size_t di = data_index(p, s, m, k);
                    if (recipe == Recipe::nvfp4) {
                        const auto nibble = e2m1_from_float(scaled);
                        std::uint8_t& byte = data.bytes[di / 2];
                        byte = (di % 2 == 0)
                                   ? static_cast<std::uint8_t>((byte & 0xF0) | nibble)
                                   : static_cast<std::uint8_t>((byte & 0x0F) | (nibble << 4));
                    } else {
                        data.bytes[di] = fp8_from_float(scaled, dtype);
                    }
                }
            }
        }
    }
}

QuantizedTensor allocate(std::span<const float> values, Shape shape, const QuantSpec& spec) {
    if (values.size() != shape.rows * shape.cols) {
        throw std::invalid_argument("quantize: values.size() != rows * cols");
    }
    QuantizedTensor t{shape, spec, 0.0f, {}};
    for (auto& b : layout(shape, spec)) {
        std::vector<std::uint8_t> bytes(b.bytes, 0);
        t.buffers.push_back({std::move(b), std::move(bytes)});
    }
    t.amax = tile_amax(values, shape, 0, shape.rows, 0, shape.cols);
    return t;
}

QuantizedTensor quantize_with(std::span<const float> values, Shape shape, const QuantSpec& spec,
                              float tensor_scale) {
    QuantizedTensor t = allocate(values, shape, spec);
    if (spec.recipe == Recipe::bf16) {
        auto& data = t.buffers.front().bytes;
        for (std::size_t i = 0; i < values.size(); ++i) {
            const std::uint16_t bits = model::to_bf16(values[i]).bits;
            data[2 * i] = static_cast<std::uint8_t>(bits & 0xFF);
            data[2 * i + 1] = static_cast<std::uint8_t>(bits >> 8);
        }
        return t;
    }
    if (spec.recipe == Recipe::current) {
        tensor_scale = scale_from_amax(t.amax, fp8_max(spec.dtype), false);
    }
    if (spec.rowwise) quantize_usage(values, t, Usage::rowwise, tensor_scale);
    if (spec.columnwise) quantize_usage(values, t, Usage::columnwise, tensor_scale);
    return t;
}

}  // namespace

const QuantizedBuffer* QuantizedTensor::find(BufferKind kind) const {
    for (const auto& b : buffers) {
        if (b.spec.kind == kind) return &b;
    }
    return nullptr;
}

QuantizedTensor quantize(std::span<const float> values, Shape shape, const QuantSpec& spec) {
    if (spec.recipe == Recipe::delayed) {
        throw std::invalid_argument("delayed scaling quantizes through an AmaxHistory");
    }
    return quantize_with(values, shape, spec, 1.0f);
}

QuantizedTensor quantize(std::span<const float> values, Shape shape, const QuantSpec& spec,
                         AmaxHistory& history) {
    if (spec.recipe != Recipe::delayed) {
        throw std::invalid_argument("only delayed scaling takes an AmaxHistory");
    }
    QuantizedTensor t = quantize_with(values, shape, spec, history.scale());
    history.record(t.amax);
    return t;
}

std::vector<float> dequantize(const QuantizedTensor& t, Usage usage) {
    const Shape s = t.shape;
    std::vector<float> out(s.rows * s.cols);
    // Output position of element (m, k): row-major, or transposed for columnwise.
    const auto out_index = [&](std::size_t m, std::size_t k) {
        return usage == Usage::rowwise ? m * s.cols + k : k * s.rows + m;
    };
    if (t.spec.recipe == Recipe::bf16) {
        const auto& data = t.buffers.front().bytes;
        for (std::size_t m = 0; m < s.rows; ++m) {
            for (std::size_t k = 0; k < s.cols; ++k) {
                const std::size_t i = m * s.cols + k;
                const auto bits = static_cast<std::uint16_t>(data[2 * i] | (data[2 * i + 1] << 8));
                out[out_index(m, k)] = model::to_float(model::Bf16{bits});
            }
        }
        return out;
    }
    if ((usage == Usage::rowwise && !t.spec.rowwise) ||
        (usage == Usage::columnwise && !t.spec.columnwise)) {
        throw std::invalid_argument("dequantize: the tensor was not quantized for this usage");
    }
    const UsagePlan p = plan_for(t, usage);
    const QuantizedBuffer& data = *t.find(p.data_kind);
    const QuantizedBuffer& scales = *t.find(p.scale_kind);
    const float nvfp4_amax =
        t.spec.recipe == Recipe::nvfp4 ? load_f32(t.find(p.amax_kind)->bytes.data()) : 0.0f;
    for (std::size_t m = 0; m < s.rows; ++m) {
        for (std::size_t k = 0; k < s.cols; ++k) {
            const std::size_t si = scale_index(p, scales, m, k);
            const std::size_t di = data_index(p, s, m, k);
            float value = 0.0f;
            switch (t.spec.recipe) {
                case Recipe::delayed:
                case Recipe::current:
                case Recipe::block:
                    value = float_from_fp8(data.bytes[di], t.spec.dtype) *
                            load_f32(scales.bytes.data() + 4 * si);
                    break;
                case Recipe::mxfp8:
                    value = float_from_fp8(data.bytes[di], t.spec.dtype) *
                            float_from_e8m0(scales.bytes[si]);
                    break;
                case Recipe::nvfp4: {
                    const std::uint8_t byte = data.bytes[di / 2];
                    const auto nibble =
                        static_cast<std::uint8_t>(di % 2 == 0 ? byte & 0xF : byte >> 4);
                    value = float_from_e2m1(nibble) * (float_from_e4m3(scales.bytes[si]) *
                                                       nvfp4_amax * (1.0f / (kE4m3Max * kE2m1Max)));
                    break;
                }
                case Recipe::bf16:
                    break;
            }
            out[out_index(m, k)] = value;
        }
    }
    return out;
}

}  // namespace allocscope::harness::fp8
