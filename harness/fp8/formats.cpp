#include "fp8/formats.h"

#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

namespace allocscope::harness::fp8 {

namespace {

// A sign-magnitude binary format with subnormals. Special encodings (NaN,
// infinity) are handled by the per-format wrappers; `max_finite` is the
// largest value the format can represent.
struct MiniFloat {
    int exponent_bits;
    int mantissa_bits;
    int bias;
    double max_finite;
};

constexpr MiniFloat kE4m3{4, 3, 7, kE4m3Max};
constexpr MiniFloat kE5m2{5, 2, 15, kE5m2Max};
constexpr MiniFloat kE2m1{2, 1, 1, kE2m1Max};

std::uint8_t sign_bit(const MiniFloat& f) {
    return static_cast<std::uint8_t>(1u << (f.exponent_bits + f.mantissa_bits));
}

// Bits of a value already on the grid and within range (sign excluded).
std::uint8_t encode_on_grid(double magnitude, const MiniFloat& f) {
    if (magnitude == 0.0) return 0;
    const int min_exponent = 1 - f.bias;
    if (magnitude < std::ldexp(1.0, min_exponent)) {
        return static_cast<std::uint8_t>(magnitude /
                                         std::ldexp(1.0, min_exponent - f.mantissa_bits));
    }
    int frexp_exponent = 0;
    std::frexp(magnitude, &frexp_exponent);
    const int exponent = frexp_exponent - 1;
    const auto mantissa =
        static_cast<unsigned>(magnitude / std::ldexp(1.0, exponent - f.mantissa_bits)) -
        (1u << f.mantissa_bits);
    return static_cast<std::uint8_t>((static_cast<unsigned>(exponent + f.bias) << f.mantissa_bits) |
                                     mantissa);
}

double decode_finite(std::uint8_t magnitude_bits, const MiniFloat& f) {
    const unsigned mantissa = magnitude_bits & ((1u << f.mantissa_bits) - 1);
    const unsigned exponent_field = magnitude_bits >> f.mantissa_bits;
    if (exponent_field == 0) return std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
    return std::ldexp((1u << f.mantissa_bits) + mantissa,
                      static_cast<int>(exponent_field) - f.bias - f.mantissa_bits);
}

// The code of |value| rounded to nearest, ties to even, as an unbounded
// integer: codes above the largest finite one mean overflow. Integer
// arithmetic on the float's bits for the target's normal range (adding half
// an ulp minus one, plus the kept LSB, then truncating is round-to-nearest-
// even, and a carry into the exponent is the right result); an exact power-
// of-two scaling and nearbyint for its subnormal range.
std::uint32_t nearest_code(float magnitude, const MiniFloat& f) {
    const int min_exponent = 1 - f.bias;
    if (magnitude < std::ldexp(1.0f, min_exponent)) {
        return static_cast<std::uint32_t>(
            std::nearbyint(std::ldexp(magnitude, f.mantissa_bits - min_exponent)));
    }
    const auto bits = std::bit_cast<std::uint32_t>(magnitude);
    if (bits >= 0x7F800000u) return UINT32_MAX;  // infinity (NaN is handled earlier)
    const int shift = 23 - f.mantissa_bits;
    const std::uint32_t rounded =
        (bits + ((1u << (shift - 1)) - 1u) + ((bits >> shift) & 1u)) >> shift;
    return rounded - (static_cast<std::uint32_t>(127 - f.bias) << f.mantissa_bits);
}

std::uint8_t largest_finite_code(const MiniFloat& f) {
    static const std::uint8_t e2m1 = encode_on_grid(kE2m1.max_finite, kE2m1);
    static const std::uint8_t e4m3 = encode_on_grid(kE4m3.max_finite, kE4m3);
    static const std::uint8_t e5m2 = encode_on_grid(kE5m2.max_finite, kE5m2);
    return f.exponent_bits == 2 ? e2m1 : f.exponent_bits == 4 ? e4m3 : e5m2;
}

// Shared float → minifloat path. `overflow_bits` is what an out-of-range
// magnitude becomes when not saturating (E4M3: NaN, E5M2: infinity).
std::uint8_t encode(float value, const MiniFloat& f, Overflow overflow, std::uint8_t nan_bits,
                    std::uint8_t overflow_bits) {
    if (std::isnan(value)) return nan_bits;
    const std::uint8_t sign = std::signbit(value) ? sign_bit(f) : 0;
    const std::uint8_t max_code = largest_finite_code(f);
    const std::uint32_t code = nearest_code(std::fabs(value), f);
    if (code > max_code) {
        return sign | (overflow == Overflow::saturate ? max_code : overflow_bits);
    }
    return static_cast<std::uint8_t>(sign | code);
}

float signed_value(std::uint8_t bits, const MiniFloat& f, double magnitude) {
    return static_cast<float>((bits & sign_bit(f)) != 0 ? -magnitude : magnitude);
}

}  // namespace

float fp8_max(Fp8Dtype dtype) {
    return dtype == Fp8Dtype::e4m3 ? kE4m3Max : kE5m2Max;
}

std::uint8_t e4m3_from_float(float value, Overflow overflow) {
    const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
    return encode(value, kE4m3, overflow, static_cast<std::uint8_t>(sign | 0x7F),
                  static_cast<std::uint8_t>(0x7F));
}

float float_from_e4m3(std::uint8_t bits) {
    if ((bits & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
    return signed_value(bits, kE4m3, decode_finite(bits & 0x7F, kE4m3));
}

std::uint8_t e5m2_from_float(float value, Overflow overflow) {
    const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
    return encode(value, kE5m2, overflow, static_cast<std::uint8_t>(sign | 0x7F),
                  static_cast<std::uint8_t>(0x7C));
}

float float_from_e5m2(std::uint8_t bits) {
    const std::uint8_t magnitude = bits & 0x7F;
    if (magnitude > 0x7C) return std::numeric_limits<float>::quiet_NaN();
    if (magnitude == 0x7C) {
        return (bits & 0x80) != 0 ? -std::numeric_limits<float>::infinity()
                                  : std::numeric_limits<float>::infinity();
    }
    return signed_value(bits, kE5m2, decode_finite(magnitude, kE5m2));
}

std::uint8_t fp8_from_float(float value, Fp8Dtype dtype, Overflow overflow) {
    return dtype == Fp8Dtype::e4m3 ? e4m3_from_float(value, overflow)
                                   : e5m2_from_float(value, overflow);
}

float float_from_fp8(std::uint8_t bits, Fp8Dtype dtype) {
    return dtype == Fp8Dtype::e4m3 ? float_from_e4m3(bits) : float_from_e5m2(bits);
}

std::uint8_t e8m0_from_float_round_up(float value) {
    if (std::isnan(value)) return 0xFF;
    if (std::isinf(value)) return 0xFE;
    if (value == 0.0f) return 0x00;
    const auto bits = std::bit_cast<std::uint32_t>(value);
    auto exponent = static_cast<std::uint8_t>(bits >> 23);
    const std::uint32_t mantissa = bits & 0x7FFFFFu;
    // Round up unless already a power of two, saturating at 2^127 (0xFE).
    // A subnormal at or below 2^-127 is represented by 0x00 (2^-127).
    const bool at_saturation = exponent == 0xFE;
    const bool fits_smallest = exponent == 0 && mantissa <= 0x400000u;
    if (mantissa > 0 && !at_saturation && !fits_smallest) ++exponent;
    return exponent;
}

float float_from_e8m0(std::uint8_t bits) {
    if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

std::uint8_t e2m1_from_float(float value) {
    const std::uint8_t max_bits = 0x7;
    return encode(value, kE2m1, Overflow::saturate, max_bits, max_bits);
}

float float_from_e2m1(std::uint8_t nibble) {
    return signed_value(nibble & 0xF, kE2m1, decode_finite(nibble & 0x7, kE2m1));
}

}  // namespace allocscope::harness::fp8
