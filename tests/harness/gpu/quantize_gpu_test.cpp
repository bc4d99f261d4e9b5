// cuda::quantize / cuda::dequantize against the CPU reference fp8::quantize /
// fp8::dequantize: every recipe, usage, role, dtype and arch layout() accepts,
// on shapes with partial blocks and on data with zeros, NaN, infinities,
// subnormals and values that saturate. The bytes must be identical (the sim
// and cuda backends store the same weights), not merely close.
//
// Own main: exits 77 (meson's SKIP) where no CUDA device is usable, so the
// suite passes on build machines without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "device_quantize.h"
#include "fp8/amax_history.h"
#include "fp8/columnwise.h"
#include "fp8/formats.h"
#include "fp8/layout.h"
#include "fp8/quantize.h"

namespace {

namespace fp8 = allocscope::harness::fp8;
namespace gpu = allocscope::harness::cuda;

using fp8::Recipe;
using fp8::Shape;
using fp8::Usage;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// Device memory with guard bytes on both sides, everything prefilled with a
// pattern: a kernel that skips a byte or writes past its buffer shows up.
class DeviceBuffer {
  public:
    static constexpr std::size_t kGuard = 256;
    static constexpr std::uint8_t kFill = 0xA5;

    explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
        ALLOCSCOPE_CUDA_CHECK(cudaMalloc(&base_, bytes + 2 * kGuard));
        ALLOCSCOPE_CUDA_CHECK(cudaMemset(base_, kFill, bytes + 2 * kGuard));
        // cudaMemset may still be running, and the non-blocking streams the
        // tests use do not wait for the legacy default stream.
        ALLOCSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    }
    ~DeviceBuffer() { cudaFree(base_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& other) noexcept : base_(other.base_), bytes_(other.bytes_) {
        other.base_ = nullptr;
    }
    DeviceBuffer& operator=(DeviceBuffer&&) = delete;

    void* get() const { return static_cast<std::uint8_t*>(base_) + kGuard; }

    std::vector<std::uint8_t> contents() const {
        std::vector<std::uint8_t> out(bytes_);
        ALLOCSCOPE_CUDA_CHECK(cudaMemcpy(out.data(), get(), bytes_, cudaMemcpyDeviceToHost));
        return out;
    }

    bool guards_intact() const {
        std::vector<std::uint8_t> all(bytes_ + 2 * kGuard);
        ALLOCSCOPE_CUDA_CHECK(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < kGuard; ++i) {
            if (all[i] != kFill || all[kGuard + bytes_ + i] != kFill) return false;
        }
        return true;
    }

  private:
    void* base_ = nullptr;
    std::size_t bytes_;
};

DeviceBuffer upload(const std::vector<float>& values) {
    DeviceBuffer buffer(values.size() * sizeof(float));
    ALLOCSCOPE_CUDA_CHECK(cudaMemcpy(buffer.get(), values.data(), values.size() * sizeof(float),
                                     cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the copy has reached
    // the device, on the legacy stream, which the quantizer's non-blocking
    // stream does not wait for.
    ALLOCSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    return buffer;
}

std::vector<float> download_floats(const DeviceBuffer& buffer) {
    const std::vector<std::uint8_t> bytes = buffer.contents();
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
}

// A non-blocking stream: nothing may lean on the legacy default stream's
// implicit synchronization.
class Stream {
  public:
    Stream() { ALLOCSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(stream_); }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cudaStream_t get() const { return stream_; }
    void sync() const { ALLOCSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  private:
    cudaStream_t stream_ = nullptr;
};

// A quantized tensor in device memory, one DeviceBuffer per layout entry.
struct DeviceTensor {
    std::vector<fp8::BufferSpec> layout;
    std::vector<DeviceBuffer> buffers;
    float amax = 0.0f;

    std::vector<void*> pointers() const {
        std::vector<void*> out;
        for (const auto& b : buffers)
            out.push_back(b.get());
        return out;
    }
    std::vector<const void*> const_pointers() const {
        std::vector<const void*> out;
        for (const auto& b : buffers)
            out.push_back(b.get());
        return out;
    }
};

DeviceTensor quantize_on_gpu(const std::vector<float>& values, Shape shape,
                             const fp8::QuantSpec& spec, float delayed_scale,
                             const Stream& stream) {
    DeviceTensor t;
    t.layout = fp8::layout(shape, spec);
    for (const auto& b : t.layout)
        t.buffers.emplace_back(b.bytes);
    const DeviceBuffer x = upload(values);
    const DeviceBuffer scratch(gpu::quantize_scratch_bytes(shape, spec));
    const std::vector<void*> pointers = t.pointers();
    t.amax = gpu::quantize(static_cast<const float*>(x.get()), shape, spec, delayed_scale, pointers,
                           scratch.get(), stream.get());
    stream.sync();
    return t;
}

std::vector<float> dequantize_on_gpu(const DeviceTensor& t, Shape shape, const fp8::QuantSpec& spec,
                                     Usage usage, const Stream& stream, bool& guards_intact) {
    const DeviceBuffer out(shape.rows * shape.cols * sizeof(float));
    const std::vector<const void*> pointers = t.const_pointers();
    gpu::dequantize(pointers, shape, spec, usage, static_cast<float*>(out.get()), stream.get());
    stream.sync();
    guards_intact = out.guards_intact();
    return download_floats(out);
}

const char* recipe_name(Recipe r) {
    switch (r) {
        case Recipe::bf16:
            return "bf16";
        case Recipe::delayed:
            return "delayed";
        case Recipe::current:
            return "current";
        case Recipe::block:
            return "block";
        case Recipe::mxfp8:
            return "mxfp8";
        case Recipe::nvfp4:
            return "nvfp4";
    }
    return "?";
}

std::string describe(const fp8::QuantSpec& spec, Shape shape, const std::string& data) {
    return std::string(recipe_name(spec.recipe)) + (spec.rowwise ? " rowwise" : "") +
           (spec.columnwise ? " columnwise" : "") +
           (spec.role == fp8::TensorRole::weight ? " weight" : " activation") +
           (spec.dtype == fp8::Fp8Dtype::e4m3 ? " e4m3" : " e5m2") +
           (spec.arch == fp8::Arch::sm90 ? " sm90 " : " sm100 ") + std::to_string(shape.rows) +
           "x" + std::to_string(shape.cols) + " " + data;
}

// Identical floats: the same bits, except that any NaN equals any NaN (the
// GPU's NaN payload is not the host's; only the FP8 bytes must agree there).
bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// Random signs and mantissas over 2^-24 .. 2^24, one in 16 an exact (±)zero.
std::vector<float> wide_range(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> exponent(-24, 24);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> pick(0, 31);
    std::vector<float> v(n);
    for (auto& x : v) {
        const int p = pick(rng);
        x = p == 0 ? 0.0f : p == 1 ? -0.0f : std::ldexp(mantissa(rng), exponent(rng));
        if (pick(rng) < 16) x = -x;
    }
    return v;
}

// Wide range plus both NaN signs, values past every format's maximum (and
// FLT_MAX, whose scaled value overflows to infinity), subnormals and a run
// of zeros long enough to fill whole blocks.
std::vector<float> specials(std::size_t n, std::uint32_t seed) {
    std::vector<float> v = wide_range(n, seed);
    const float special[] = {kNan,   -kNan,   1.0e38f,  -kFloatMax,
                             1.0e6f, -7.0e4f, 1.0e-40f, -1.0e-44f};
    for (std::size_t i = 0; i < std::size(special) && i < n; ++i)
        v[(i * 7919 + n / 3) % n] = special[i];
    for (std::size_t i = n / 2; i < n / 2 + 300 && i < n; ++i)
        v[i] = 0.0f;
    return v;
}

// An infinity makes the tensor (and its block) amax infinite: scale 1 paths.
std::vector<float> infinities(std::size_t n, std::uint32_t seed) {
    std::vector<float> v = wide_range(n, seed);
    v[n / 2] = kInf;
    if (n > 1) v[n - 1] = -kInf;
    return v;
}

// Subnormal and near-subnormal magnitudes: scales overflow to FLT_MAX.
std::vector<float> tiny(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> exponent(-148, -120);
    std::vector<float> v(n);
    for (auto& x : v)
        x = std::ldexp(rng() % 2 == 0 ? 1.0f : -1.5f, exponent(rng));
    return v;
}

struct Dataset {
    const char* name;
    std::vector<float> (*make)(std::size_t, std::uint32_t);
};

std::vector<float> zeros(std::size_t n, std::uint32_t) {
    return std::vector<float>(n, 0.0f);
}

const Dataset kDatasets[] = {
    {"wide range", wide_range}, {"zeros", zeros}, {"specials", specials},
    {"infinities", infinities}, {"tiny", tiny},
};

struct Totals {
    int tensors = 0;
    int usages = 0;
};

// Quantizes on both sides and checks amax, every byte, the guards, and the
// dequantized floats of each usage. Delayed scaling takes its scale from an
// AmaxHistory that has seen `history_amax` (0: a fresh history, scale 1).
void check_matches_cpu(const std::vector<float>& values, Shape shape, const fp8::QuantSpec& spec,
                       const std::string& data, float history_amax, Totals& totals) {
    const std::string what = describe(spec, shape, data);
    INFO(what);
    fp8::QuantizedTensor cpu;
    float delayed_scale = 1.0f;
    if (spec.recipe == Recipe::delayed) {
        fp8::AmaxHistory history(4);
        if (history_amax > 0.0f) {
            history.record(history_amax);
            history.update(fp8::fp8_max(spec.dtype));
        }
        delayed_scale = history.scale();
        cpu = fp8::quantize(values, shape, spec, history);
    } else {
        cpu = fp8::quantize(values, shape, spec);
    }

    const Stream stream;
    const DeviceTensor dev = quantize_on_gpu(values, shape, spec, delayed_scale, stream);
    CHECK(std::bit_cast<std::uint32_t>(dev.amax) == std::bit_cast<std::uint32_t>(cpu.amax));
    REQUIRE(dev.buffers.size() == cpu.buffers.size());
    for (std::size_t i = 0; i < cpu.buffers.size(); ++i) {
        const std::vector<std::uint8_t> got = dev.buffers[i].contents();
        const std::vector<std::uint8_t>& want = cpu.buffers[i].bytes;
        REQUIRE(got.size() == want.size());
        std::size_t mismatches = 0, first = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
            if (got[j] != want[j] && mismatches++ == 0) first = j;
        }
        INFO("buffer ", cpu.buffers[i].spec.name, ": first mismatch at byte ", first, " (gpu ",
             int(got[first]), ", cpu ", int(want[first]), ")");
        CHECK(mismatches == 0);
        CHECK(dev.buffers[i].guards_intact());
    }
    ++totals.tensors;

    for (const Usage usage : {Usage::rowwise, Usage::columnwise}) {
        const bool quantized_for = spec.recipe == Recipe::bf16 ||
                                   (usage == Usage::rowwise ? spec.rowwise : spec.columnwise);
        if (!quantized_for) continue;
        bool guards_intact = false;
        const std::vector<float> got =
            dequantize_on_gpu(dev, shape, spec, usage, stream, guards_intact);
        const std::vector<float> want = fp8::dequantize(cpu, usage);
        REQUIRE(got.size() == want.size());
        std::size_t mismatches = 0, first = 0;
        for (std::size_t j = 0; j < got.size(); ++j) {
            if (!same_float(got[j], want[j]) && mismatches++ == 0) first = j;
        }
        INFO((usage == Usage::rowwise ? "rowwise" : "columnwise"),
             " dequantize: first mismatch at ", first, " (gpu ", got[first], ", cpu ", want[first],
             ")");
        CHECK(mismatches == 0);
        CHECK(guards_intact);
        ++totals.usages;
    }
}

// Every combination layout() accepts for `recipe`, on each shape and dataset.
Totals check_recipe(Recipe recipe, const std::vector<Shape>& shapes) {
    Totals totals;
    std::uint32_t seed = 1;
    const std::pair<bool, bool> usages[] = {{true, false}, {false, true}, {true, true}};
    for (const auto& [rowwise, columnwise] : usages) {
        for (const auto role : {fp8::TensorRole::activation, fp8::TensorRole::weight}) {
            for (const auto dtype : {fp8::Fp8Dtype::e4m3, fp8::Fp8Dtype::e5m2}) {
                for (const auto arch : {fp8::Arch::sm90, fp8::Arch::sm100}) {
                    const fp8::QuantSpec spec{recipe, dtype, rowwise, columnwise, role, arch};
                    for (const Shape shape : shapes) {
                        for (const Dataset& d : kDatasets) {
                            const auto values = d.make(shape.rows * shape.cols, seed++);
                            check_matches_cpu(values, shape, spec, d.name, 0.0f, totals);
                            // A history amax below the data's: the delayed
                            // scale saturates large values.
                            if (recipe == Recipe::delayed) {
                                check_matches_cpu(values, shape, spec, d.name, 3.0f, totals);
                            }
                        }
                    }
                }
            }
        }
    }
    return totals;
}

// One large tensor per recipe: many thread blocks in the amax reduction.
void check_large(Recipe recipe, Shape shape) {
    Totals totals;
    const auto values = wide_range(shape.rows * shape.cols, 99);
    for (const auto role : {fp8::TensorRole::activation, fp8::TensorRole::weight}) {
        const fp8::QuantSpec spec{recipe, fp8::Fp8Dtype::e4m3, true, true, role, fp8::Arch::sm90};
        check_matches_cpu(values, shape, spec, "large wide range", 0.0f, totals);
    }
    CHECK(totals.tensors == 2);
}

const std::vector<Shape> kAnyShapes = {{1, 1}, {7, 13}, {64, 48}, {200, 300}};

}  // namespace

TEST_CASE("bf16 on the GPU stores the CPU's bytes and dequantizes to the same floats") {
    const Totals t = check_recipe(Recipe::bf16, kAnyShapes);
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 4 * 5);
    check_large(Recipe::bf16, {512, 640});
}

TEST_CASE("delayed scaling on the GPU matches the CPU byte for byte with the history's scale") {
    const Totals t = check_recipe(Recipe::delayed, kAnyShapes);
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 4 * 5 * 2);
}

TEST_CASE("current scaling on the GPU matches the CPU byte for byte, transpose only on sm90") {
    const Totals t = check_recipe(Recipe::current, kAnyShapes);
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 4 * 5);
    check_large(Recipe::current, {512, 640});
}

TEST_CASE("Float8BlockScaling on the GPU matches the CPU, partial 128-blocks included") {
    const Totals t =
        check_recipe(Recipe::block, {{1, 1}, {5, 130}, {129, 257}, {256, 384}, {300, 200}});
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 5 * 5);
    check_large(Recipe::block, {513, 640});
}

TEST_CASE("MXFP8 on the GPU matches the CPU, scale padding rows and columns zero") {
    const Totals t = check_recipe(Recipe::mxfp8, {{32, 32}, {64, 96}, {160, 288}, {96, 64}});
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 4 * 5);
    check_large(Recipe::mxfp8, {512, 640});
}

TEST_CASE("NVFP4 on the GPU matches the CPU: packed nibbles, E4M3 block scales, two amaxes") {
    const Totals t = check_recipe(Recipe::nvfp4, {{16, 16}, {48, 80}, {144, 272}, {32, 16}});
    CHECK(t.tensors == 3 * 2 * 2 * 2 * 4 * 5);
    check_large(Recipe::nvfp4, {512, 640});
}

TEST_CASE("the amax is max |x| with NaN ignored") {
    const Stream stream;
    const Shape shape{1, 5};
    const fp8::QuantSpec spec{Recipe::current, fp8::Fp8Dtype::e4m3,         true,
                              false,           fp8::TensorRole::activation, fp8::Arch::sm90};
    CHECK(quantize_on_gpu({1.0f, kNan, -3.0f, 2.0f, -kNan}, shape, spec, 1.0f, stream).amax ==
          3.0f);
    CHECK(quantize_on_gpu({kNan, kNan, kNan, kNan, kNan}, shape, spec, 1.0f, stream).amax == 0.0f);
    CHECK(quantize_on_gpu({1.0f, -kInf, 0.0f, 2.0f, kNan}, shape, spec, 1.0f, stream).amax == kInf);
}

TEST_CASE("delayed scaling multiplies by the given scale and stores its inverse") {
    const Stream stream;
    const Shape shape{1, 4};
    const fp8::QuantSpec spec{Recipe::delayed, fp8::Fp8Dtype::e4m3,         true,
                              false,           fp8::TensorRole::activation, fp8::Arch::sm90};
    const std::vector<float> values = {1.0f, 2.0f, -4.0f, 0.3f};
    for (const float scale : {1.0f, 2.0f, 1000.0f}) {
        CAPTURE(scale);
        const DeviceTensor t = quantize_on_gpu(values, shape, spec, scale, stream);
        REQUIRE(t.layout[0].kind == fp8::BufferKind::rowwise_scale_inv);
        std::vector<std::uint8_t> scale_inv = t.buffers[0].contents();
        float stored = 0.0f;
        std::memcpy(&stored, scale_inv.data(), sizeof stored);
        CHECK(stored == 1.0f / scale);
        const std::vector<std::uint8_t> data = t.buffers[1].contents();
        for (std::size_t i = 0; i < values.size(); ++i)
            CHECK(data[i] == fp8::e4m3_from_float(values[i] * scale));
        // 4 · 1000 is past E4M3's 448: satfinite, not NaN.
        if (scale == 1000.0f) CHECK(data[2] == 0xFE);
    }
}

TEST_CASE("a negative NaN keeps its sign in FP8 and becomes +6 in E2M1, as on the CPU") {
    const Stream stream;
    const std::vector<float> values = {-kNan, kNan, 1.0f, -2.0f};
    const fp8::QuantSpec e5m2{Recipe::current, fp8::Fp8Dtype::e5m2,         true,
                              false,           fp8::TensorRole::activation, fp8::Arch::sm90};
    const std::vector<std::uint8_t> fp8_data =
        quantize_on_gpu(values, {1, 4}, e5m2, 1.0f, stream).buffers[0].contents();
    CHECK(fp8_data[0] == 0xFF);
    CHECK(fp8_data[1] == 0x7F);

    std::vector<float> block(16 * 16, 0.5f);
    block[0] = -kNan;
    const fp8::QuantSpec nvfp4{Recipe::nvfp4, fp8::Fp8Dtype::e4m3,         true,
                               false,         fp8::TensorRole::activation, fp8::Arch::sm90};
    const std::vector<std::uint8_t> fp4_data =
        quantize_on_gpu(block, {16, 16}, nvfp4, 1.0f, stream).buffers[0].contents();
    CHECK((fp4_data[0] & 0xF) == 0x7);
}

TEST_CASE("invalid shapes, usages and buffer counts throw std::invalid_argument") {
    const Stream stream;
    const DeviceBuffer x(64 * 64 * sizeof(float));
    const DeviceBuffer scratch(64);
    const DeviceBuffer any(64 * 64 * 4);
    const auto* values = static_cast<const float*>(x.get());
    const fp8::QuantSpec mxfp8{Recipe::mxfp8, fp8::Fp8Dtype::e4m3,         true,
                               true,          fp8::TensorRole::activation, fp8::Arch::sm90};
    const std::vector<void*> four(4, any.get());
    const std::vector<void*> three(3, any.get());

    CHECK_THROWS_AS(gpu::quantize(values, {0, 32}, mxfp8, 1.0f, four, scratch.get(), stream.get()),
                    std::invalid_argument);
    CHECK_THROWS_AS(gpu::quantize(values, {33, 32}, mxfp8, 1.0f, four, scratch.get(), stream.get()),
                    std::invalid_argument);
    CHECK_THROWS_AS(gpu::quantize_scratch_bytes({33, 32}, mxfp8), std::invalid_argument);
    CHECK_THROWS_AS(
        gpu::quantize(values, {32, 32}, mxfp8, 1.0f, three, scratch.get(), stream.get()),
        std::invalid_argument);
    CHECK_THROWS_AS(gpu::quantize(values, {32, 32}, mxfp8, 1.0f, four, nullptr, stream.get()),
                    std::invalid_argument);

    fp8::QuantSpec no_usage = mxfp8;
    no_usage.rowwise = no_usage.columnwise = false;
    CHECK_THROWS_AS(gpu::quantize(values, {32, 32}, no_usage, 1.0f, std::span<void* const>{},
                                  scratch.get(), stream.get()),
                    std::invalid_argument);

    fp8::QuantSpec nvfp4 = mxfp8;
    nvfp4.recipe = Recipe::nvfp4;
    const std::vector<void*> six(6, any.get());
    CHECK_THROWS_AS(gpu::quantize(values, {16, 24}, nvfp4, 1.0f, six, scratch.get(), stream.get()),
                    std::invalid_argument);

    auto* out = static_cast<float*>(any.get());
    const std::vector<const void*> two(2, any.get());
    fp8::QuantSpec rowwise_only = mxfp8;
    rowwise_only.columnwise = false;
    CHECK_THROWS_AS(
        gpu::dequantize(two, {32, 32}, rowwise_only, Usage::columnwise, out, stream.get()),
        std::invalid_argument);
    CHECK_THROWS_AS(gpu::dequantize(two, {32, 32}, mxfp8, Usage::rowwise, out, stream.get()),
                    std::invalid_argument);
    CHECK_THROWS_AS(gpu::dequantize(two, {32, 48}, rowwise_only, Usage::rowwise, out, stream.get()),
                    std::invalid_argument);
    // Nothing above reached a kernel: the stream is still clean.
    stream.sync();
}

TEST_CASE("the column-wise form of gathered shards is the CPU's, byte for byte") {
    // fp8::build_columnwise on the host against cuda::build_columnwise on
    // device copies of the same gathered bytes (fp8/columnwise.h): the
    // per-tensor transpose with a padding row dropped, block data and
    // scales from two and four ranks, ragged columns.
    struct Case {
        Recipe recipe;
        Shape shape;
        std::size_t world;
    };
    const Stream stream;
    for (Case c : {Case{Recipe::current, {301, 200}, 2}, Case{Recipe::delayed, {96, 160}, 1},
                   Case{Recipe::block, {511, 300}, 2}, Case{Recipe::block, {509, 200}, 4}}) {
        CAPTURE(int(c.recipe));
        CAPTURE(c.world);
        const fp8::QuantSpec spec{c.recipe, fp8::Fp8Dtype::e4m3,     true,
                                  false,    fp8::TensorRole::weight, fp8::Arch::sm90};
        const std::size_t shard_rows = (c.shape.rows + c.world - 1) / c.world;
        const Shape shard{shard_rows, c.shape.cols};
        std::mt19937 rng(21);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        const std::vector<fp8::BufferSpec> shard_layout = fp8::layout(shard, spec);
        std::vector<std::vector<std::uint8_t>> gathered(shard_layout.size());
        for (std::size_t r = 0; r < c.world; ++r) {
            std::vector<float> mine(shard.rows * shard.cols, 0.0f);
            for (std::size_t i = 0;
                 i < mine.size() && r * mine.size() + i < c.shape.rows * c.shape.cols; ++i)
                mine[i] = float(r + 1) * dist(rng);
            fp8::AmaxHistory history;
            const fp8::QuantizedTensor q = c.recipe == Recipe::delayed
                                               ? fp8::quantize(mine, shard, spec, history)
                                               : fp8::quantize(mine, shard, spec);
            for (std::size_t b = 0; b < q.buffers.size(); ++b)
                gathered[b].insert(gathered[b].end(), q.buffers[b].bytes.begin(),
                                   q.buffers[b].bytes.end());
        }
        const fp8::ColumnwisePlan plan = fp8::columnwise_plan(c.shape, shard_rows, c.world, spec);

        std::vector<const void*> host_in;
        for (const auto& b : gathered)
            host_in.push_back(b.data());
        std::vector<std::vector<std::uint8_t>> host_out;
        std::vector<void*> host_ptrs;
        for (const fp8::BufferSpec& b : plan.buffers)
            host_out.emplace_back(b.bytes, std::uint8_t{0});
        for (auto& b : host_out)
            host_ptrs.push_back(b.data());
        fp8::build_columnwise(plan, host_in, host_ptrs);

        std::vector<DeviceBuffer> device_in, device_out;
        std::vector<const void*> in_ptrs;
        std::vector<void*> out_ptrs;
        for (const auto& b : gathered) {
            device_in.emplace_back(b.size());
            ALLOCSCOPE_CUDA_CHECK(
                cudaMemcpy(device_in.back().get(), b.data(), b.size(), cudaMemcpyHostToDevice));
            in_ptrs.push_back(device_in.back().get());
        }
        ALLOCSCOPE_CUDA_CHECK(cudaDeviceSynchronize());  // as in upload()
        for (const fp8::BufferSpec& b : plan.buffers) {
            device_out.emplace_back(b.bytes);
            out_ptrs.push_back(device_out.back().get());
        }
        gpu::build_columnwise(plan, in_ptrs, out_ptrs, stream.get());
        stream.sync();
        for (std::size_t i = 0; i < plan.buffers.size(); ++i) {
            CAPTURE(plan.buffers[i].name);
            CHECK(device_out[i].contents() == host_out[i]);
            CHECK(device_out[i].guards_intact());
        }
    }
}

int main(int argc, char** argv) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "no usable CUDA device: skipping\n");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
