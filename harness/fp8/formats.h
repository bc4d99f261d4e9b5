// Bit-exact conversions between float and the narrow number formats that
// TransformerEngine's recipes store: FP8 E4M3 / E5M2, the E8M0 scale of
// MXFP8 and FP4 E2M1 of NVFP4 (bf16 lives in model/bf16.h). All conversions from float round to
// nearest, ties to even, except E8M0 which rounds up as TE's MXFP8 kernels do.
#pragma once

#include <cstdint>

namespace allocscope::harness::fp8 {

enum class Fp8Dtype { e4m3, e5m2 };

// What a finite value beyond the largest finite one becomes. TE's casts use
// the satfinite form (clamp to ±max, infinities included); the IEEE-style
// form (E4M3 → NaN, E5M2 → ±inf) is what PyTorch's non-saturating cast does.
enum class Overflow { saturate, non_finite };

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE5m2Max = 57344.0f;
inline constexpr float kE2m1Max = 6.0f;

float fp8_max(Fp8Dtype dtype);

// E4M3 "fn": bias 7, no infinities, NaN = S.1111.111 (0x7F / 0xFF).
std::uint8_t e4m3_from_float(float value, Overflow overflow = Overflow::saturate);
float float_from_e4m3(std::uint8_t bits);

// E5M2: bias 15, IEEE-like infinities (0x7C / 0xFC) and NaNs.
std::uint8_t e5m2_from_float(float value, Overflow overflow = Overflow::saturate);
float float_from_e5m2(std::uint8_t bits);

std::uint8_t fp8_from_float(float value, Fp8Dtype dtype, Overflow overflow = Overflow::saturate);
float float_from_fp8(std::uint8_t bits, Fp8Dtype dtype);

// E8M0: an unsigned power of two 2^(bits − 127); 0xFF is NaN. The conversion
// rounds up to the next power of two (TE's float_to_e8m0), so a block scaled by
// the reciprocal never overflows the element format; it saturates at 2^127
// and maps NaN to 0xFF.
std::uint8_t e8m0_from_float_round_up(float value);
float float_from_e8m0(std::uint8_t bits);

// E2M1 in the low nibble: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} and a sign
// bit (0x8). No infinities or NaN: the conversion saturates at ±6 and maps
// NaN to +6, so a NaN input never decodes as a small finite value.
std::uint8_t e2m1_from_float(float value);
float float_from_e2m1(std::uint8_t nibble);

}  // namespace allocscope::harness::fp8
