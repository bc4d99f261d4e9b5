// Device ports of the conversions in fp8/formats.cpp and model/bf16.h, bit
// for bit. cuda_fp8.h and cuda_fp4.h are not used: they disagree with the CPU
// reference in corner cases (the sign and payload of NaN results, E5M2
// overflow, E2M1 of NaN), and the GPU must store the bytes the sim backend
// stores. Every float operation is an explicit _rn intrinsic so that nvcc
// cannot contract a multiply into an FMA the CPU code does not do.
#pragma once

#include <cstdint>

namespace allocscope::harness::cuda::quant {

// 2^n exactly, for n in [-149, 127] (subnormal results included).
__device__ inline float pow2f(int n) {
    if (n >= -126) return __uint_as_float(static_cast<std::uint32_t>(n + 127) << 23);
    return __uint_as_float(1u << (n + 149));
}

// A sign-magnitude minifloat as formats.cpp's MiniFloat; max_code is the
// largest finite code without the sign (what encode_on_grid(max_finite)
// gives).
struct MiniFloat {
    int exponent_bits;
    int mantissa_bits;
    int bias;
    std::uint32_t max_code;
};

__device__ inline MiniFloat e4m3_format() {
    return {4, 3, 7, 0x7E};
}
__device__ inline MiniFloat e5m2_format() {
    return {5, 2, 15, 0x7B};
}
__device__ inline MiniFloat e2m1_format() {
    return {2, 1, 1, 0x7};
}

// formats.cpp's nearest_code: round-to-nearest-even code of a non-NaN
// magnitude as an unbounded integer (codes past max_code mean overflow).
__device__ inline std::uint32_t nearest_code(float magnitude, MiniFloat f) {
    const int min_exponent = 1 - f.bias;
    if (magnitude < pow2f(min_exponent)) {
        // An exact power-of-two scaling into [0, 2^mantissa_bits), then the
        // default (nearest-even) rounding, as std::nearbyint.
        return static_cast<std::uint32_t>(
            rintf(__fmul_rn(magnitude, pow2f(f.mantissa_bits - min_exponent))));
    }
    const std::uint32_t bits = __float_as_uint(magnitude);
    if (bits >= 0x7F800000u) return 0xFFFFFFFFu;
    const int shift = 23 - f.mantissa_bits;
    const std::uint32_t rounded =
        (bits + ((1u << (shift - 1)) - 1u) + ((bits >> shift) & 1u)) >> shift;
    return rounded - (static_cast<std::uint32_t>(127 - f.bias) << f.mantissa_bits);
}

// formats.cpp's encode with Overflow::saturate (the only form quantize uses).
__device__ inline std::uint8_t encode_saturate(float value, MiniFloat f, std::uint8_t nan_bits) {
    if (isnan(value)) return nan_bits;
    const std::uint32_t sign = signbit(value) ? 1u << (f.exponent_bits + f.mantissa_bits) : 0u;
    const std::uint32_t code = nearest_code(fabsf(value), f);
    return static_cast<std::uint8_t>(sign | (code > f.max_code ? f.max_code : code));
}

// E4M3 and E5M2 both keep the NaN's sign: S.1111111.
__device__ inline std::uint8_t fp8_from_float(float value, bool e5m2) {
    const std::uint8_t nan_bits = signbit(value) ? 0xFF : 0x7F;
    return encode_saturate(value, e5m2 ? e5m2_format() : e4m3_format(), nan_bits);
}

__device__ inline std::uint8_t e4m3_from_float(float value) {
    return fp8_from_float(value, false);
}

// NaN becomes +6 (0x7), never a small finite value.
__device__ inline std::uint8_t e2m1_from_float(float value) {
    return encode_saturate(value, e2m1_format(), 0x7);
}

// formats.cpp's decode_finite: every code is exact in float.
__device__ inline float decode_finite(std::uint32_t magnitude_bits, MiniFloat f) {
    const std::uint32_t mantissa = magnitude_bits & ((1u << f.mantissa_bits) - 1u);
    const int exponent_field = static_cast<int>(magnitude_bits >> f.mantissa_bits);
    if (exponent_field == 0) {
        return __fmul_rn(static_cast<float>(mantissa), pow2f(1 - f.bias - f.mantissa_bits));
    }
    return __fmul_rn(static_cast<float>((1u << f.mantissa_bits) + mantissa),
                     pow2f(exponent_field - f.bias - f.mantissa_bits));
}

// The NaN the CPU returns (std::numeric_limits<float>::quiet_NaN()).
__device__ inline float quiet_nan() {
    return __uint_as_float(0x7FC00000u);
}

__device__ inline float float_from_e4m3(std::uint8_t bits) {
    if ((bits & 0x7F) == 0x7F) return quiet_nan();
    const float magnitude = decode_finite(bits & 0x7Fu, e4m3_format());
    return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

__device__ inline float float_from_e5m2(std::uint8_t bits) {
    const std::uint32_t magnitude_bits = bits & 0x7Fu;
    if (magnitude_bits > 0x7C) return quiet_nan();
    const float magnitude = magnitude_bits == 0x7C ? __uint_as_float(0x7F800000u)
                                                   : decode_finite(magnitude_bits, e5m2_format());
    return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

__device__ inline float float_from_fp8(std::uint8_t bits, bool e5m2) {
    return e5m2 ? float_from_e5m2(bits) : float_from_e4m3(bits);
}

__device__ inline float float_from_e2m1(std::uint8_t nibble) {
    const float magnitude = decode_finite(nibble & 0x7u, e2m1_format());
    return (nibble & 0x8) != 0 ? -magnitude : magnitude;
}

// TE's float_to_e8m0: round up to a power of two, saturating at 2^127.
__device__ inline std::uint8_t e8m0_from_float_round_up(float value) {
    if (isnan(value)) return 0xFF;
    if (isinf(value)) return 0xFE;
    if (value == 0.0f) return 0x00;
    const std::uint32_t bits = __float_as_uint(value);
    auto exponent = static_cast<std::uint8_t>(bits >> 23);
    const std::uint32_t mantissa = bits & 0x7FFFFFu;
    const bool at_saturation = exponent == 0xFE;
    const bool fits_smallest = exponent == 0 && mantissa <= 0x400000u;
    if (mantissa > 0 && !at_saturation && !fits_smallest) ++exponent;
    return exponent;
}

__device__ inline float float_from_e8m0(std::uint8_t bits) {
    if (bits == 0xFF) return quiet_nan();
    return pow2f(static_cast<int>(bits) - 127);
}

// quantize.cpp's e8m0_reciprocal: 2^(127 − e).
__device__ inline float e8m0_reciprocal(std::uint8_t e) {
    if (e == 0xFF) return quiet_nan();
    return pow2f(127 - static_cast<int>(e));
}

// model::to_bf16: round to nearest even, NaN stays NaN with the quiet bit set.
__device__ inline std::uint16_t bf16_from_float(float value) {
    const std::uint32_t u = __float_as_uint(value);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    const std::uint32_t lsb = (u >> 16) & 1u;
    return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

__device__ inline float float_from_bf16(std::uint16_t bits) {
    return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

// The product a · b as the host CPU computes it. Only the sign of a NaN
// result reaches the FP8 bytes, and the GPU always returns its canonical,
// positive NaN (0x7FFFFFFF): x86 instead propagates a NaN operand with its
// sign (when both are NaN the compiler's operand order decides; we take a's)
// and makes a negative default NaN for inf · 0. `default_nan_negative` is
// that host's default NaN sign, probed at run time.
__device__ inline float host_mul(float a, float b, bool default_nan_negative) {
    if (isnan(a)) return a;
    if (isnan(b)) return b;
    const float product = __fmul_rn(a, b);
    if (isnan(product)) return __uint_as_float(default_nan_negative ? 0xFFC00000u : 0x7FC00000u);
    return product;
}

}  // namespace allocscope::harness::cuda::quant
