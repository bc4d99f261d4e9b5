// The FP8 formats, recipes and quantization (harness/fp8/): bit-exact
// encodings of E4M3, E5M2, E8M0 and E2M1; each recipe's buffer layout and
// sizes against TransformerEngine's; quantize / dequantize with each
// recipe's error bounds; the delayed-scaling amax history. Longer than 600
// lines: one specification over the same shapes and helpers.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp8/amax_history.h"
#include "fp8/formats.h"
#include "fp8/layout.h"
#include "fp8/quantize.h"
#include "model/bf16.h"

using namespace allocscope::harness::fp8;

namespace {
// The bf16 recipe stores model::Bf16 bit patterns.
std::uint16_t bits_of_bf16(float v) {
    return allocscope::harness::model::to_bf16(v).bits;
}
float float_of_bf16(std::uint16_t bits) {
    return allocscope::harness::model::to_float(allocscope::harness::model::Bf16{bits});
}
}  // namespace

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> normal_values(std::size_t n, float stddev, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> v(n);
    for (auto& x : v)
        x = dist(rng);
    return v;
}

std::vector<float> transpose(const std::vector<float>& v, Shape s) {
    std::vector<float> t(v.size());
    for (std::size_t m = 0; m < s.rows; ++m) {
        for (std::size_t k = 0; k < s.cols; ++k)
            t[k * s.rows + m] = v[m * s.cols + k];
    }
    return t;
}

// For every element (m, k), row-major: max |x| over the tile_rows × tile_cols
// tile holding it.
std::vector<float> tile_amaxes(const std::vector<float>& x, Shape s, std::size_t tile_rows,
                               std::size_t tile_cols) {
    std::vector<float> out(x.size());
    for (std::size_t r0 = 0; r0 < s.rows; r0 += tile_rows) {
        const std::size_t r1 = std::min(s.rows, r0 + tile_rows);
        for (std::size_t c0 = 0; c0 < s.cols; c0 += tile_cols) {
            const std::size_t c1 = std::min(s.cols, c0 + tile_cols);
            float amax = 0.0f;
            for (std::size_t r = r0; r < r1; ++r) {
                for (std::size_t c = c0; c < c1; ++c)
                    amax = std::fmax(amax, std::fabs(x[r * s.cols + c]));
            }
            for (std::size_t r = r0; r < r1; ++r) {
                for (std::size_t c = c0; c < c1; ++c)
                    out[r * s.cols + c] = amax;
            }
        }
    }
    return out;
}

// Error bound of one element: a relative part (half an ulp of the element
// format, times `factor`) plus an absolute part proportional to the amax of
// the element's tile (covers the subnormal range and coarse scales).
struct Bound {
    float relative;
    float of_tile_amax;
};

// Checks |dequantized − x| ≤ bound for every element of one usage; the
// dequantized columnwise tensor is compared with the transposed source.
void check_bound(const std::vector<float>& x, Shape s, const QuantizedTensor& q, Usage usage,
                 std::size_t tile_rows, std::size_t tile_cols, Bound bound) {
    const std::vector<float> d = dequantize(q, usage);
    REQUIRE(d.size() == x.size());
    const std::vector<float> amax = tile_amaxes(x, s, tile_rows, tile_cols);
    std::size_t failures = 0;
    for (std::size_t m = 0; m < s.rows; ++m) {
        for (std::size_t k = 0; k < s.cols; ++k) {
            const float ref = x[m * s.cols + k];
            const float got = usage == Usage::rowwise ? d[m * s.cols + k] : d[k * s.rows + m];
            const float limit =
                bound.relative * std::fabs(ref) + bound.of_tile_amax * amax[m * s.cols + k];
            if (!(std::fabs(got - ref) <= limit)) ++failures;
        }
    }
    CHECK(failures == 0);
}

// E4M3 keeps 3 mantissa bits (half ulp = 2^-4 relative), E5M2 keeps 2.
constexpr float kE4m3HalfUlp = 1.0f / 16;
constexpr float kE5m2HalfUlp = 1.0f / 8;
// Half of the smallest subnormal, in units of the scaled maximum: E4M3 2^-10
// against 448, E5M2 2^-17 against 57344. A scale that maps the tile amax
// to at least half the format's max (power-of-two scales) doubles it.
constexpr float kE4m3Floor = 0x1p-10f / 448.0f * 2.0f;
constexpr float kE5m2Floor = 0x1p-17f / 57344.0f * 2.0f;
// Float arithmetic around the cast (x·scale and q·scale_inv round in fp32).
constexpr float kSlack = 1.0f + 1e-6f;

QuantSpec spec_of(Recipe recipe, TensorRole role = TensorRole::activation, Arch arch = Arch::sm90,
                  Fp8Dtype dtype = Fp8Dtype::e4m3) {
    QuantSpec spec;
    spec.recipe = recipe;
    spec.role = role;
    spec.arch = arch;
    spec.dtype = dtype;
    return spec;
}

// Quantizes with any recipe; delayed scaling gets a fresh history (scale 1).
QuantizedTensor quantize_any(const std::vector<float>& x, Shape s, const QuantSpec& spec) {
    if (spec.recipe != Recipe::delayed) return quantize(x, s, spec);
    AmaxHistory history;
    return quantize(x, s, spec, history);
}

const BufferSpec& buffer_named(const std::vector<BufferSpec>& buffers, const char* name) {
    for (const auto& b : buffers) {
        if (b.name == name) return b;
    }
    FAIL("no buffer named " << name);
    throw std::logic_error("unreachable");
}

std::vector<std::size_t> dims(std::size_t a, std::size_t b) {
    return {a, b};
}

// The fp32 scale (or amax) at element `index` of a buffer.
float f32_at(const QuantizedBuffer& buffer, std::size_t index) {
    float value = 0;
    std::memcpy(&value, buffer.bytes.data() + 4 * index, sizeof value);
    return value;
}

}  // namespace

// ---------------------------------------------------------------- formats

TEST_CASE("E4M3 encodes known values bit-exactly") {
    CHECK(e4m3_from_float(448.0f) == 0x7E);
    CHECK(e4m3_from_float(-448.0f) == 0xFE);
    CHECK(e4m3_from_float(1.0f) == 0x38);
    CHECK(e4m3_from_float(0.5f) == 0x30);
    CHECK(e4m3_from_float(0x1p-6f) == 0x08);  // smallest normal
    CHECK(e4m3_from_float(0x1p-9f) == 0x01);  // smallest subnormal
    CHECK(e4m3_from_float(0.0f) == 0x00);
    CHECK(e4m3_from_float(-0.0f) == 0x80);
    CHECK(float_from_e4m3(0x7E) == 448.0f);
    CHECK(float_from_e4m3(0x01) == 0x1p-9f);
    CHECK(float_from_e4m3(0x5C) == 24.0f);  // 1.5 * 2^(11-7)
}

TEST_CASE("E4M3 has no infinity: NaN is 0x7F/0xFF and overflow saturates or becomes NaN") {
    CHECK(std::isnan(float_from_e4m3(0x7F)));
    CHECK(std::isnan(float_from_e4m3(0xFF)));
    CHECK(e4m3_from_float(kNaN) == 0x7F);
    CHECK(e4m3_from_float(-kNaN) == 0xFF);
    CHECK(e4m3_from_float(1e9f) == 0x7E);
    CHECK(e4m3_from_float(-kInf) == 0xFE);
    CHECK(e4m3_from_float(480.0f, Overflow::non_finite) == 0x7F);
    CHECK(e4m3_from_float(kInf, Overflow::non_finite) == 0x7F);
    // 464 is the tie between 448 and the (NaN) code above it: even mantissa wins.
    CHECK(e4m3_from_float(464.0f, Overflow::non_finite) == 0x7E);
    CHECK(e4m3_from_float(0x1p-10f) == 0x00);  // tie with the smallest subnormal → 0
    CHECK(e4m3_from_float(0x1p-10f * 1.01f) == 0x01);
}

TEST_CASE("E5M2 has infinities and a 57344 maximum") {
    CHECK(e5m2_from_float(57344.0f) == 0x7B);
    CHECK(e5m2_from_float(1.0f) == 0x3C);
    CHECK(e5m2_from_float(0x1p-16f) == 0x01);
    CHECK(float_from_e5m2(0x7C) == kInf);
    CHECK(float_from_e5m2(0xFC) == -kInf);
    CHECK(std::isnan(float_from_e5m2(0x7D)));
    CHECK(std::isnan(float_from_e5m2(0x7F)));
    CHECK(e5m2_from_float(kInf, Overflow::non_finite) == 0x7C);
    CHECK(e5m2_from_float(-kInf, Overflow::non_finite) == 0xFC);
    CHECK(e5m2_from_float(kInf) == 0x7B);                            // satfinite, as TE casts
    CHECK(e5m2_from_float(61440.0f, Overflow::non_finite) == 0x7C);  // tie rounds to even = inf
    CHECK(e5m2_from_float(61439.0f, Overflow::non_finite) == 0x7B);
    CHECK(std::isnan(float_from_e5m2(e5m2_from_float(kNaN))));
}

TEST_CASE("every finite FP8 code round-trips, and midpoints round to the even neighbour") {
    for (Fp8Dtype dtype : {Fp8Dtype::e4m3, Fp8Dtype::e5m2}) {
        CAPTURE(static_cast<int>(dtype));
        std::vector<float> grid;  // non-negative finite values, ascending with the code
        for (unsigned code = 0; code < 0x80; ++code) {
            const float v = float_from_fp8(static_cast<std::uint8_t>(code), dtype);
            if (!std::isfinite(v)) continue;
            CHECK(fp8_from_float(v, dtype) == code);
            CHECK(fp8_from_float(-v, dtype) == (code | 0x80));
            grid.push_back(v);
        }
        for (std::size_t i = 0; i + 1 < grid.size(); ++i) {
            const float mid = (grid[i] + grid[i + 1]) / 2;  // exact in float
            const unsigned even = (i % 2 == 0) ? i : i + 1;
            CHECK(fp8_from_float(mid, dtype) == even);
            CHECK(fp8_from_float(std::nextafter(mid, 0.0f), dtype) == i);
            CHECK(fp8_from_float(std::nextafter(mid, kInf), dtype) == i + 1);
        }
    }
}

TEST_CASE("bf16 rounds to nearest even and keeps NaN a NaN") {
    CHECK(bits_of_bf16(1.0f) == 0x3F80);
    CHECK(bits_of_bf16(1.0f + 0x1p-8f) == 0x3F80);      // tie, even stays
    CHECK(bits_of_bf16(1.0f + 3 * 0x1p-8f) == 0x3F82);  // tie, odd rounds up
    CHECK(bits_of_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3F81);
    CHECK(bits_of_bf16(-2.0f) == 0xC000);
    CHECK(bits_of_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
    CHECK(std::isnan(float_of_bf16(bits_of_bf16(kNaN))));
    CHECK(std::isnan(float_of_bf16(bits_of_bf16(std::bit_cast<float>(0x7F800001u)))));
    CHECK(float_of_bf16(0x3F80) == 1.0f);
    std::size_t failures = 0;
    for (float x : normal_values(10000, 100.0f, 1)) {
        if (std::fabs(float_of_bf16(bits_of_bf16(x)) - x) > std::fabs(x) * 0x1p-8f) ++failures;
    }
    CHECK(failures == 0);
}

TEST_CASE("E8M0 rounds scales up to a power of two with bias 127") {
    CHECK(e8m0_from_float_round_up(1.0f) == 127);
    CHECK(e8m0_from_float_round_up(1.5f) == 128);
    CHECK(e8m0_from_float_round_up(0.75f) == 127);
    CHECK(e8m0_from_float_round_up(0x1p-127f) == 0);
    CHECK(e8m0_from_float_round_up(0x1p127f) == 254);
    CHECK(e8m0_from_float_round_up(0x1.8p127f) == 254);  // saturates
    CHECK(e8m0_from_float_round_up(kInf) == 0xFE);
    CHECK(e8m0_from_float_round_up(kNaN) == 0xFF);
    CHECK(e8m0_from_float_round_up(0.0f) == 0x00);
    CHECK(float_from_e8m0(127) == 1.0f);
    CHECK(float_from_e8m0(0) == 0x1p-127f);
    CHECK(float_from_e8m0(254) == 0x1p127f);
    CHECK(std::isnan(float_from_e8m0(0xFF)));
}

TEST_CASE("E2M1 holds {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign, rounding ties to even") {
    const float values[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (unsigned code = 0; code < 8; ++code) {
        CHECK(float_from_e2m1(static_cast<std::uint8_t>(code)) == values[code]);
        CHECK(float_from_e2m1(static_cast<std::uint8_t>(code | 8)) == -values[code]);
        CHECK(e2m1_from_float(values[code]) == code);
    }
    CHECK(e2m1_from_float(-6.0f) == 0xF);
    CHECK(e2m1_from_float(0.25f) == 0x0);  // tie between 0 and 0.5
    CHECK(e2m1_from_float(0.75f) == 0x2);  // tie between 0.5 and 1
    CHECK(e2m1_from_float(2.5f) == 0x4);   // tie between 2 and 3
    CHECK(e2m1_from_float(5.0f) == 0x6);   // tie between 4 and 6
    CHECK(e2m1_from_float(7.0f) == 0x7);   // saturates
    CHECK(e2m1_from_float(-kInf) == 0xF);
    CHECK(e2m1_from_float(kNaN) == 0x7);
}

TEST_CASE("E4M3 as the NVFP4 block scale covers block_amax * S_enc / 6 up to 448") {
    // With S_enc = 448*6/amax the block holding the tensor amax gets scale 448.
    const float amax = 3.7f;
    const float s_enc = 448.0f * 6.0f / amax;
    CHECK(float_from_e4m3(e4m3_from_float(amax * (s_enc * (1.0f / 6.0f)))) == 448.0f);
}

// ---------------------------------------------------------------- layout

TEST_CASE("per-tensor FP8 allocates a transpose only where the GEMM needs TN (sm90)") {
    const Shape s{768, 256};
    auto sm90 = layout(s, spec_of(Recipe::current));
    REQUIRE(sm90.size() == 3);
    CHECK(sm90[0].name == "data");
    CHECK(sm90[0].shape == dims(768, 256));
    CHECK(sm90[1].name == "transpose");
    CHECK(sm90[1].shape == dims(256, 768));
    CHECK(sm90[2].name == "scale_inv");
    CHECK(sm90[2].bytes == 4);

    auto sm100 = layout(s, spec_of(Recipe::current, TensorRole::weight, Arch::sm100));
    REQUIRE(sm100.size() == 2);
    CHECK(sm100[0].name == "data");
    CHECK(sm100[1].name == "scale_inv");

    // Delayed scaling allocates scale_inv first (Float8Quantizer::create_tensor).
    QuantSpec columnwise_only = spec_of(Recipe::delayed);
    columnwise_only.rowwise = false;
    auto t = layout(s, columnwise_only);
    REQUIRE(t.size() == 2);
    CHECK(t[0].name == "scale_inv");
    CHECK(t[1].name == "transpose");
    columnwise_only.arch = Arch::sm100;
    auto d = layout(s, columnwise_only);
    REQUIRE(d.size() == 2);
    CHECK(d[1].name == "data");
}

TEST_CASE("Float8BlockScaling scale shapes: 1-D GEMM-ready, 2-D padded to 4 blocks") {
    auto act = layout({64, 256}, spec_of(Recipe::block));
    CHECK(buffer_named(act, "rowwise_data").shape == dims(64, 256));
    CHECK(buffer_named(act, "rowwise_scale_inv").shape == dims(2, 64));
    CHECK(buffer_named(act, "columnwise_data").shape == dims(256, 64));
    CHECK(buffer_named(act, "columnwise_scale_inv").shape == dims(1, 256));
    CHECK(buffer_named(act, "rowwise_scale_inv").bytes == 2 * 64 * 4);

    auto ragged = layout({100, 200}, spec_of(Recipe::block));
    CHECK(buffer_named(ragged, "rowwise_scale_inv").shape == dims(2, 100));
    CHECK(buffer_named(ragged, "columnwise_scale_inv").shape == dims(1, 200));
    auto ragged_w = layout({100, 200}, spec_of(Recipe::block, TensorRole::weight));
    CHECK(buffer_named(ragged_w, "rowwise_scale_inv").shape == dims(1, 4));
    CHECK(buffer_named(ragged_w, "columnwise_scale_inv").shape == dims(2, 4));
    CHECK(layout({102, 200}, spec_of(Recipe::block))[1].shape == dims(2, 104));

    auto w = layout({768, 256}, spec_of(Recipe::block, TensorRole::weight));
    CHECK(buffer_named(w, "rowwise_scale_inv").shape == dims(6, 4));
    CHECK(buffer_named(w, "columnwise_scale_inv").shape == dims(2, 8));
}

TEST_CASE("MXFP8 scale shapes are padded to [128, 4] rowwise and [4, 128] columnwise") {
    auto b = layout({64, 256}, spec_of(Recipe::mxfp8));
    REQUIRE(b.size() == 4);
    CHECK(buffer_named(b, "rowwise_data").shape == dims(64, 256));
    CHECK(buffer_named(b, "rowwise_scale_inv").shape == dims(128, 8));
    CHECK(buffer_named(b, "columnwise_data").shape == dims(64, 256));  // not transposed
    CHECK(buffer_named(b, "columnwise_scale_inv").shape == dims(4, 256));
    CHECK(buffer_named(b, "columnwise_scale_inv").bytes == 1024);
    CHECK(buffer_named(layout({256, 1024}, spec_of(Recipe::mxfp8)), "rowwise_scale_inv").shape ==
          dims(256, 32));
    CHECK_THROWS_AS(layout({48, 256}, spec_of(Recipe::mxfp8)), std::invalid_argument);
}

TEST_CASE("NVFP4 packs two values per byte, transposes columnwise data and keeps two amaxes") {
    auto b = layout({64, 256}, spec_of(Recipe::nvfp4));
    REQUIRE(b.size() == 6);
    CHECK(b[0].name == "rowwise_data");
    CHECK(b[0].shape == dims(64, 128));
    CHECK(b[1].name == "rowwise_scale_inv");
    CHECK(b[1].shape == dims(128, 16));
    CHECK(b[2].name == "amax_rowwise");
    CHECK(b[2].bytes == 4);
    CHECK(b[3].name == "columnwise_data");
    CHECK(b[3].shape == dims(256, 32));
    CHECK(b[4].name == "columnwise_scale_inv");
    CHECK(b[4].shape == dims(256, 4));
    CHECK(b[5].name == "amax_columnwise");
    CHECK_THROWS_AS(layout({64, 40}, spec_of(Recipe::nvfp4)), std::invalid_argument);
}

TEST_CASE("layout rejects an empty tensor and a tensor with no usage") {
    CHECK_THROWS_AS(layout({0, 16}, spec_of(Recipe::current)), std::invalid_argument);
    QuantSpec none = spec_of(Recipe::mxfp8);
    none.rowwise = none.columnwise = false;
    CHECK_THROWS_AS(layout({32, 32}, none), std::invalid_argument);
}

TEST_CASE("the caching allocator rounds every buffer up to 512 B") {
    CHECK(caching_allocator_size(0) == 0);
    CHECK(caching_allocator_size(1) == 512);
    CHECK(caching_allocator_size(4) == 512);
    CHECK(caching_allocator_size(512) == 512);
    CHECK(caching_allocator_size(513) == 1024);
    CHECK(caching_allocator_size(196608) == 196608);
}

namespace {

// The reference model's four GEMM weights per TransformerLayer (TE doc).
const Shape kLayerWeights[] = {{768, 256}, {256, 256}, {1024, 256}, {256, 1024}};

std::size_t layer_bytes(QuantSpec spec) {
    spec.role = TensorRole::weight;
    std::size_t total = 0;
    for (Shape s : kLayerWeights)
        total += allocated_bytes(layout(s, spec));
    return total;
}

double mib(std::size_t bytes) {
    return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

}  // namespace

TEST_CASE("per-layer quantized weight copy Q of the reference model matches the TE doc") {
    // Both usages, every buffer rounded to 512 B. Exact byte totals:
    //   per-tensor sm100:  786,432 data + 4 × 512 scale_inv              =   788,480 B
    //   per-tensor sm90:   + 786,432 transpose                           = 1,574,912 B
    //   MXFP8:             1,572,864 data + 49,152 E8M0 scales            = 1,622,016 B
    //   Float8BlockScaling: 1,572,864 data + 8 × 512 fp32 scales          = 1,576,960 B
    //   NVFP4:             786,432 data + 98,304 E4M3 scales + 8 × 512 amax = 888,832 B
    struct Row {
        Recipe recipe;
        Arch arch;
        std::size_t bytes;
        double doc_mib;
    };
    const Row rows[] = {
        {Recipe::delayed, Arch::sm100, 788480, 0.752},
        {Recipe::current, Arch::sm100, 788480, 0.752},
        {Recipe::delayed, Arch::sm90, 1574912, 1.502},
        {Recipe::current, Arch::sm90, 1574912, 1.502},
        {Recipe::mxfp8, Arch::sm90, 1622016, 1.547},
        {Recipe::mxfp8, Arch::sm100, 1622016, 1.547},
        {Recipe::block, Arch::sm90, 1576960, 1.504},
        {Recipe::block, Arch::sm100, 1576960, 1.504},
        {Recipe::nvfp4, Arch::sm100, 888832, 0.848},
    };
    for (const Row& row : rows) {
        CAPTURE(static_cast<int>(row.recipe));
        CAPTURE(static_cast<int>(row.arch));
        const QuantSpec spec = spec_of(row.recipe, TensorRole::weight, row.arch);
        const std::size_t q = layer_bytes(spec);
        CHECK(q == row.bytes);
        CHECK(std::fabs(mib(q) - row.doc_mib) <= 0.005 * row.doc_mib);
        // The tensors quantize() builds for the layer's weights hold the same bytes.
        std::size_t held = 0;
        for (Shape s : kLayerWeights) {
            const auto t = quantize_any(normal_values(s.rows * s.cols, 0.02f, 11), s, spec);
            for (const auto& b : t.buffers)
                held += caching_allocator_size(b.bytes.size());
        }
        CHECK(held == row.bytes);
    }
    CHECK(layer_bytes(spec_of(Recipe::bf16)) == 1572864);
}

TEST_CASE("problem 2: the retained per-tensor transpose is 786,432 B per layer on sm90") {
    QuantSpec columnwise = spec_of(Recipe::delayed, TensorRole::weight, Arch::sm90);
    columnwise.rowwise = false;
    std::size_t transposes = 0;
    for (Shape s : kLayerWeights)
        transposes += buffer_named(layout(s, columnwise), "transpose").bytes;
    CHECK(transposes == 786432);
    columnwise.arch = Arch::sm100;
    for (Shape s : kLayerWeights) {
        for (const auto& b : layout(s, columnwise))
            CHECK(b.name != "transpose");
    }
}

TEST_CASE("a quantized tensor owns exactly the buffers layout() lists") {
    const Shape s{96, 160};
    const auto x = normal_values(s.rows * s.cols, 1.0f, 2);
    for (Recipe recipe : {Recipe::bf16, Recipe::delayed, Recipe::current, Recipe::block,
                          Recipe::mxfp8, Recipe::nvfp4}) {
        for (Arch arch : {Arch::sm90, Arch::sm100}) {
            for (TensorRole role : {TensorRole::activation, TensorRole::weight}) {
                for (int usages = 1; usages <= 3; ++usages) {
                    QuantSpec spec = spec_of(recipe, role, arch);
                    spec.rowwise = (usages & 1) != 0;
                    spec.columnwise = (usages & 2) != 0;
                    const auto expected = layout(s, spec);
                    const auto q = quantize_any(x, s, spec);
                    REQUIRE(q.buffers.size() == expected.size());
                    for (std::size_t i = 0; i < expected.size(); ++i) {
                        CHECK(q.buffers[i].spec.name == expected[i].name);
                        CHECK(q.buffers[i].spec.shape == expected[i].shape);
                        CHECK(q.buffers[i].bytes.size() == expected[i].bytes);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------- recipes

TEST_CASE("bf16 round trip is within 2^-8 relative in both orientations") {
    const Shape s{48, 80};
    const auto x = normal_values(s.rows * s.cols, 3.0f, 3);
    const auto q = quantize(x, s, spec_of(Recipe::bf16));
    check_bound(x, s, q, Usage::rowwise, 1, 1, {0x1p-8f, 0});
    check_bound(x, s, q, Usage::columnwise, 1, 1, {0x1p-8f, 0});
}

TEST_CASE("current scaling: scale = fp8_max / amax, error within half an ulp of the format") {
    const Shape s{64, 96};
    const auto x = normal_values(s.rows * s.cols, 2.0f, 4);
    for (Arch arch : {Arch::sm90, Arch::sm100}) {
        const auto q = quantize(x, s, spec_of(Recipe::current, TensorRole::activation, arch));
        CHECK(f32_at(*q.find(BufferKind::rowwise_scale_inv), 0) == 1.0f / (448.0f / q.amax));
        const Bound e4m3{kE4m3HalfUlp * kSlack, kE4m3Floor};
        check_bound(x, s, q, Usage::rowwise, s.rows, s.cols, e4m3);
        check_bound(x, s, q, Usage::columnwise, s.rows, s.cols, e4m3);
        CHECK(dequantize(q, Usage::columnwise) == transpose(dequantize(q, Usage::rowwise), s));
    }
    const auto g = quantize(
        x, s, spec_of(Recipe::current, TensorRole::activation, Arch::sm90, Fp8Dtype::e5m2));
    check_bound(x, s, g, Usage::rowwise, s.rows, s.cols, {kE5m2HalfUlp * kSlack, kE5m2Floor});
    check_bound(x, s, g, Usage::columnwise, s.rows, s.cols, {kE5m2HalfUlp * kSlack, kE5m2Floor});
}

TEST_CASE("Float8BlockScaling: power-of-two scales per block, transposed columnwise data") {
    const Shape s{200, 300};  // ragged edges in both directions
    const auto x = normal_values(s.rows * s.cols, 1.0f, 5);
    const Bound e4m3{kE4m3HalfUlp * kSlack, kE4m3Floor};

    const auto act = quantize(x, s, spec_of(Recipe::block));
    check_bound(x, s, act, Usage::rowwise, 1, 128, e4m3);
    check_bound(x, s, act, Usage::columnwise, 128, 1, e4m3);

    const auto w = quantize(x, s, spec_of(Recipe::block, TensorRole::weight));
    check_bound(x, s, w, Usage::rowwise, 128, 128, e4m3);
    check_bound(x, s, w, Usage::columnwise, 128, 128, e4m3);
    // 2-D blocks: the columnwise copy is the same quantization, transposed.
    CHECK(dequantize(w, Usage::columnwise) == transpose(dequantize(w, Usage::rowwise), s));

    const auto& scales = *act.find(BufferKind::rowwise_scale_inv);
    for (std::size_t i = 0; i < scales.bytes.size() / 4; ++i) {
        const float si = f32_at(scales, i);
        if (si == 0.0f) continue;  // padding
        int exponent = 0;
        CHECK(std::frexp(si, &exponent) == 0.5f);
    }
}

TEST_CASE("Float8BlockScaling stores 1x128 row scales as [block][row]") {
    const Shape s{4, 256};
    std::vector<float> x(s.rows * s.cols);
    for (std::size_t m = 0; m < s.rows; ++m) {
        for (std::size_t k = 0; k < s.cols; ++k)
            x[m * s.cols + k] = (k < 128 ? 1.0f : 100.0f) * (m + 1);
    }
    const auto q = quantize(x, s, spec_of(Recipe::block));
    const auto& sc = *q.find(BufferKind::rowwise_scale_inv);
    REQUIRE(sc.spec.shape == dims(2, 4));
    for (std::size_t kb = 0; kb < 2; ++kb) {
        for (std::size_t m = 0; m < 4; ++m) {
            const float amax = (kb == 0 ? 1.0f : 100.0f) * (m + 1);
            int e = 0;
            std::frexp(448.0f / amax, &e);
            CHECK(f32_at(sc, kb * 4 + m) == 1.0f / std::ldexp(1.0f, e - 1));
        }
    }
}

TEST_CASE("MXFP8: 32-element blocks along rows and along columns with E8M0 scales") {
    const Shape s{96, 160};
    const auto x = normal_values(s.rows * s.cols, 1.0f, 6);
    for (Fp8Dtype dtype : {Fp8Dtype::e4m3, Fp8Dtype::e5m2}) {
        const Bound bound = dtype == Fp8Dtype::e4m3 ? Bound{kE4m3HalfUlp * kSlack, kE4m3Floor}
                                                    : Bound{kE5m2HalfUlp * kSlack, kE5m2Floor};
        const auto q =
            quantize(x, s, spec_of(Recipe::mxfp8, TensorRole::activation, Arch::sm90, dtype));
        check_bound(x, s, q, Usage::rowwise, 1, 32, bound);
        check_bound(x, s, q, Usage::columnwise, 32, 1, bound);
    }
    // Scale of row m, block kb at [m][kb]: round-up of amax / 448.
    std::vector<float> y(s.rows * s.cols, 0.0f);
    y[5 * s.cols + 40] = 300.0f;    // row 5, block 1: 300/448 → 2^0
    y[7 * s.cols + 100] = 1000.0f;  // row 7, block 3: 1000/448 → 2^2
    const auto q = quantize(y, s, spec_of(Recipe::mxfp8));
    const auto& row = *q.find(BufferKind::rowwise_scale_inv);
    CHECK(row.bytes[5 * 8 + 1] == 127);
    CHECK(row.bytes[7 * 8 + 3] == 129);
    CHECK(row.bytes[7 * 8 + 2] == 0);  // an all-zero block
    const auto& col = *q.find(BufferKind::columnwise_scale_inv);
    CHECK(col.bytes[0 * 256 + 40] == 127);   // rows 0-31, column 40
    CHECK(col.bytes[0 * 256 + 100] == 129);  // rows 0-31, column 100
}

TEST_CASE("NVFP4: E2M1 values in 16-element blocks with E4M3 scales and a global amax") {
    const Shape s{64, 96};
    const auto x = normal_values(s.rows * s.cols, 1.0f, 7);
    // E2M1 keeps one mantissa bit (half ulp 1/4 relative); below 1 the
    // absolute step is 0.5, a quarter of the block's decode scale ≈ amax/6,
    // which the E4M3 rounding of that scale can stretch by 1/16.
    const Bound bound{0.25f * kSlack, 0.25f / 6.0f * (1.0f + 1.0f / 16) * kSlack};
    const auto act = quantize(x, s, spec_of(Recipe::nvfp4));
    check_bound(x, s, act, Usage::rowwise, 1, 16, bound);
    check_bound(x, s, act, Usage::columnwise, 16, 1, bound);
    const auto w = quantize(x, s, spec_of(Recipe::nvfp4, TensorRole::weight));
    check_bound(x, s, w, Usage::rowwise, 16, 16, bound);
    check_bound(x, s, w, Usage::columnwise, 16, 16, bound);
    CHECK(dequantize(w, Usage::columnwise) == transpose(dequantize(w, Usage::rowwise), s));

    CHECK(f32_at(*act.find(BufferKind::rowwise_amax), 0) == act.amax);
    // The block holding the tensor amax gets the largest E4M3 scale, 448.
    std::size_t at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (std::fabs(x[i]) == act.amax) at = i;
    }
    const std::size_t m = at / s.cols, k = at % s.cols;
    CHECK(act.find(BufferKind::rowwise_scale_inv)->bytes[m * 8 + k / 16] == 0x7E);
}

TEST_CASE("NVFP4 packs the even element into the low nibble") {
    const Shape s{16, 16};
    std::vector<float> x(s.rows * s.cols, 0.0f);
    x[0] = 6.0f;  // with amax 6: S_enc = 448, block scale 448 → x * 1 encodes as is
    x[1] = -1.0f;
    const auto q = quantize(x, s, spec_of(Recipe::nvfp4));
    CHECK(q.find(BufferKind::rowwise_data)->bytes[0] == 0xA7);  // high -1 (0xA), low 6 (0x7)
    const auto d = dequantize(q, Usage::rowwise);
    CHECK(d[0] == 6.0f);
    CHECK(d[1] == -1.0f);
}

TEST_CASE("columnwise dequantize equals the transpose of rowwise within both bounds (1-D blocks)") {
    const Shape s{128, 64};
    const auto x = normal_values(s.rows * s.cols, 1.0f, 8);
    struct Case {
        Recipe recipe;
        std::size_t block;
        Bound bound;  // of each orientation against the source, as above
    };
    const Bound e4m3{kE4m3HalfUlp * kSlack, kE4m3Floor};
    const Bound nvfp4{0.25f * kSlack, 0.25f / 6.0f * (1.0f + 1.0f / 16) * kSlack};
    for (Case c : {Case{Recipe::block, 128, e4m3}, Case{Recipe::mxfp8, 32, e4m3},
                   Case{Recipe::nvfp4, 16, nvfp4}}) {
        CAPTURE(static_cast<int>(c.recipe));
        const auto q = quantize(x, s, spec_of(c.recipe));
        const auto row = dequantize(q, Usage::rowwise);
        const auto col = transpose(dequantize(q, Usage::columnwise), Shape{s.cols, s.rows});
        const auto row_amax = tile_amaxes(x, s, 1, c.block);
        const auto col_amax = tile_amaxes(x, s, c.block, 1);
        std::size_t failures = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            const float limit = 2 * c.bound.relative * std::fabs(x[i]) +
                                c.bound.of_tile_amax * (row_amax[i] + col_amax[i]);
            if (std::fabs(row[i] - col[i]) > limit) ++failures;
        }
        CHECK(failures == 0);
    }
}

TEST_CASE("an outlier coarsens only its own block, but the whole tensor under per-tensor scaling") {
    const Shape s{32, 256};
    auto x = normal_values(s.rows * s.cols, 1e-2f, 9);
    x[3 * s.cols + 10] = 1e5f;  // row 3, first 128-block and first 32-block
    const auto per_tensor = dequantize(quantize(x, s, spec_of(Recipe::current)), Usage::rowwise);
    const auto block = dequantize(quantize(x, s, spec_of(Recipe::block)), Usage::rowwise);
    const auto mx = dequantize(quantize(x, s, spec_of(Recipe::mxfp8)), Usage::rowwise);
    std::size_t per_tensor_zeros = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const std::size_t m = i / s.cols, k = i % s.cols;
        if (per_tensor[i] == 0.0f) ++per_tensor_zeros;
        if (m == 3 && k < 128) continue;  // the outlier's block
        CHECK(std::fabs(block[i] - x[i]) <= std::fabs(x[i]) * kE4m3HalfUlp * kSlack + 1e-6f);
        if (m == 3 && k < 32) continue;
        CHECK(std::fabs(mx[i] - x[i]) <= std::fabs(x[i]) * kE4m3HalfUlp * kSlack + 1e-6f);
    }
    // 448/1e5 scales ~1e-2 values to ~4.5e-5, far below E4M3's smallest subnormal.
    CHECK(per_tensor_zeros > x.size() * 9 / 10);
    CHECK(per_tensor[3 * s.cols + 10] == 1e5f);
}

TEST_CASE("all-zero tensors quantize to zeros with unit per-tensor scale for every recipe") {
    const Shape s{32, 64};
    const std::vector<float> x(s.rows * s.cols, 0.0f);
    for (Recipe recipe :
         {Recipe::bf16, Recipe::current, Recipe::block, Recipe::mxfp8, Recipe::nvfp4}) {
        const auto q = quantize(x, s, spec_of(recipe));
        CHECK(q.amax == 0.0f);
        for (Usage u : {Usage::rowwise, Usage::columnwise}) {
            for (float v : dequantize(q, u))
                CHECK(v == 0.0f);
        }
    }
    const auto current = quantize(x, s, spec_of(Recipe::current));
    CHECK(f32_at(*current.find(BufferKind::rowwise_scale_inv), 0) == 1.0f);
}

TEST_CASE("subnormal float inputs stay finite and within bounds") {
    const Shape s{32, 32};
    std::vector<float> x(s.rows * s.cols);
    for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(i % 17) * 1e-40f;
    // Current scaling: 448 / amax overflows fp32, so the scale is FLT_MAX.
    const auto q = quantize(x, s, spec_of(Recipe::current));
    CHECK(f32_at(*q.find(BufferKind::rowwise_scale_inv), 0) ==
          1.0f / std::numeric_limits<float>::max());
    for (Recipe recipe : {Recipe::current, Recipe::block, Recipe::mxfp8}) {
        const auto d = dequantize(quantize(x, s, spec_of(recipe)), Usage::rowwise);
        for (std::size_t i = 0; i < x.size(); ++i) {
            CHECK(std::isfinite(d[i]));
            // The scale_inv itself is subnormal here: allow its precision loss.
            CHECK(std::fabs(d[i] - x[i]) <= std::fabs(x[i]) * 0.15f);
        }
    }
}

TEST_CASE("NaN elements stay NaN in FP8 recipes and do not poison the amax") {
    const Shape s{32, 64};
    auto x = normal_values(s.rows * s.cols, 1.0f, 10);
    x[100] = kNaN;
    for (Recipe recipe : {Recipe::current, Recipe::block, Recipe::mxfp8}) {
        const auto q = quantize(x, s, spec_of(recipe));
        CHECK(std::isfinite(q.amax));
        const auto d = dequantize(q, Usage::rowwise);
        CHECK(std::isnan(d[100]));
        CHECK(std::isfinite(d[101]));
        CHECK(std::isnan(dequantize(q, Usage::columnwise)[(100 % s.cols) * s.rows + 100 / s.cols]));
    }
    // E2M1 has no NaN: the element saturates to the block's largest magnitude.
    const auto nv = dequantize(quantize(x, s, spec_of(Recipe::nvfp4)), Usage::rowwise);
    CHECK(std::isfinite(nv[100]));
}

TEST_CASE("dequantize refuses a usage the tensor was not quantized for") {
    QuantSpec spec = spec_of(Recipe::current);
    spec.rowwise = false;
    const auto q = quantize(std::vector<float>(64, 1.0f), Shape{8, 8}, spec);
    CHECK_THROWS_AS(dequantize(q, Usage::rowwise), std::invalid_argument);
    CHECK(dequantize(q, Usage::columnwise)[0] == 1.0f);
    CHECK_THROWS_AS(quantize(std::vector<float>(63, 1.0f), Shape{8, 8}, spec),
                    std::invalid_argument);
}

// ---------------------------------------------------------------- delayed scaling

TEST_CASE("an amax history starts at scale 1 with TE's length of 1024") {
    AmaxHistory h;
    CHECK(h.length() == 1024);
    CHECK(h.scale() == 1.0f);
    CHECK(h.window_amax() == 0.0f);
}

TEST_CASE("the delayed scale is fp8_max over the max of the last `length` step amaxes") {
    AmaxHistory h(4);
    h.record(8.0f);
    h.record(2.0f);  // the step's amax is the max of its records
    CHECK(h.update(448.0f) == 56.0f);
    for (int step = 1; step < 4; ++step) {
        h.record(1.0f);
        CHECK(h.update(448.0f) == 56.0f);  // step 0's 8 still in the window
    }
    h.record(1.0f);
    CHECK(h.update(448.0f) == 448.0f);  // step 0 left the window after 4 updates
    CHECK(h.update(57344.0f) == 57344.0f);
}

TEST_CASE("a zero or non-finite window amax keeps the previous scale") {
    AmaxHistory h(2);
    h.record(4.0f);
    CHECK(h.update(448.0f) == 112.0f);
    h.record(kInf);
    CHECK(h.update(448.0f) == 112.0f);
    CHECK(h.update(448.0f) == 112.0f);  // inf still in the window
    CHECK(h.update(448.0f) == 112.0f);  // window now all zeros
    h.record(kNaN);
    CHECK(std::isnan(h.window_amax()));
    CHECK(h.update(448.0f) == 112.0f);
    h.record(1e-45f);  // 448 / 1e-45 overflows fp32
    h.update(448.0f);
    h.record(0.0f);
    CHECK(h.update(448.0f) == std::numeric_limits<float>::max());
}

TEST_CASE("delayed quantization uses the previous step's scale and records its own amax") {
    const Shape s{16, 16};
    std::vector<float> x(s.rows * s.cols, 0.5f);
    x[7] = 2.0f;
    AmaxHistory h;
    const auto first = quantize(x, s, spec_of(Recipe::delayed), h);
    CHECK(f32_at(*first.find(BufferKind::rowwise_scale_inv), 0) == 1.0f);
    CHECK(h.window_amax() == 2.0f);
    h.update(448.0f);

    // A later step whose values exceed the history saturate at 448 / scale.
    std::vector<float> big(s.rows * s.cols, 1.0f);
    big[3] = 10.0f;
    const auto second = quantize(big, s, spec_of(Recipe::delayed), h);
    const auto d = dequantize(second, Usage::rowwise);
    CHECK(d[3] == 2.0f);  // 10 * 224 saturates to 448 = 2.0 after scale_inv
    CHECK(d[0] == 1.0f);
    CHECK(dequantize(second, Usage::columnwise)[3 * s.rows] == 2.0f);
    CHECK(h.window_amax() == 10.0f);

    CHECK_THROWS_AS(quantize(x, s, spec_of(Recipe::delayed)), std::invalid_argument);
    CHECK_THROWS_AS(quantize(x, s, spec_of(Recipe::current), h), std::invalid_argument);
}
