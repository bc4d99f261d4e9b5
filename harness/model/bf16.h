// bfloat16 storage for model weights and saved activations. Compute is fp32;
// bf16 is only ever a storage format here, so the type carries bits and
// nothing else (no arithmetic operators that would hide conversions).
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace allocscope::harness::model {

struct Bf16 {
    std::uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

// Round to nearest, ties to even (what PyTorch's .to(torch.bfloat16) and
// CUDA's __float2bfloat16_rn do). NaN stays NaN (quiet bit forced so that
// truncating a signalling NaN's payload cannot turn it into infinity);
// values past the largest bf16 round to infinity.
inline Bf16 to_bf16(float value) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return Bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    }
    const std::uint32_t lsb = (u >> 16) & 1u;
    return Bf16{static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16)};
}

// Exact: every bf16 value is a float.
inline float to_float(Bf16 value) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

// Element-wise conversions; the spans must have equal sizes.
void to_bf16(std::span<const float> in, std::span<Bf16> out);
void to_float(std::span<const Bf16> in, std::span<float> out);

}  // namespace allocscope::harness::model
