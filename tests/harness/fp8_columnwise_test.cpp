// The column-wise form built after the all-gather of a quantized-init weight
// (fp8/columnwise.h), on host memory: its bytes against the gathered
// row-wise bytes and against quantizing the whole tensor column-wise.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "fp8/amax_history.h"
#include "fp8/columnwise.h"
#include "fp8/formats.h"
#include "fp8/layout.h"
#include "fp8/quantize.h"

using namespace allocscope::harness::fp8;

namespace {

QuantSpec weight_spec(Recipe recipe, bool rowwise, bool columnwise, Arch arch = Arch::sm90) {
    QuantSpec spec;
    spec.recipe = recipe;
    spec.role = TensorRole::weight;
    spec.arch = arch;
    spec.rowwise = rowwise;
    spec.columnwise = columnwise;
    return spec;
}

std::vector<float> values(Shape s, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(s.rows * s.cols);
    for (float& x : v)
        x = dist(rng);
    return v;
}

// FSDP2 on `world` ranks: rank r quantizes rows [r·shard_rows, …) of `full`
// (zero padding rows past the end) row-wise; the all-gather concatenates
// each buffer rank after rank. `rank_scale` scales rank r's values by
// (r + 1)^rank_scale, so that per-tensor ranks differ in scale.
struct Gathered {
    std::size_t shard_rows = 0;
    std::vector<QuantizedTensor> shards;
    std::vector<std::vector<std::uint8_t>> buffers;  // one per shard-layout entry
};

Gathered gather(const std::vector<float>& full, Shape s, std::size_t world, const QuantSpec& spec,
                float rank_scale = 0.0f) {
    Gathered g;
    g.shard_rows = (s.rows + world - 1) / world;
    const Shape shard{g.shard_rows, s.cols};
    for (std::size_t r = 0; r < world; ++r) {
        std::vector<float> mine(shard.rows * shard.cols, 0.0f);
        const float factor = std::pow(float(r + 1), rank_scale);
        for (std::size_t i = 0; i < mine.size() && r * mine.size() + i < full.size(); ++i)
            mine[i] = factor * full[r * mine.size() + i];
        if (spec.recipe == Recipe::delayed) {
            AmaxHistory history;
            g.shards.push_back(quantize(mine, shard, spec, history));
        } else {
            g.shards.push_back(quantize(mine, shard, spec));
        }
    }
    g.buffers.resize(g.shards[0].buffers.size());
    for (const QuantizedTensor& q : g.shards) {
        for (std::size_t b = 0; b < q.buffers.size(); ++b)
            g.buffers[b].insert(g.buffers[b].end(), q.buffers[b].bytes.begin(),
                                q.buffers[b].bytes.end());
    }
    return g;
}

// Runs the plan; returns its output buffers.
std::vector<std::vector<std::uint8_t>> build(const ColumnwisePlan& plan, const Gathered& g) {
    std::vector<const void*> in;
    for (const auto& b : g.buffers)
        in.push_back(b.data());
    // 0xAB: a buffer the plan did not fully write would show it.
    std::vector<std::vector<std::uint8_t>> out;
    std::vector<void*> pointers;
    for (const BufferSpec& b : plan.buffers)
        out.emplace_back(b.bytes, std::uint8_t{0xAB});
    for (auto& b : out)
        pointers.push_back(b.data());
    build_columnwise(plan, in, pointers);
    return out;
}

const std::vector<std::uint8_t>& buffer_of(const ColumnwisePlan& plan,
                                           const std::vector<std::vector<std::uint8_t>>& out,
                                           BufferKind kind) {
    for (std::size_t i = 0; i < plan.buffers.size(); ++i) {
        if (plan.buffers[i].kind == kind) return out[i];
    }
    FAIL("the plan has no such buffer");
    throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("which recipes build a column-wise form after the all-gather") {
    CHECK(builds_columnwise_after_gather(Recipe::delayed, Arch::sm90));
    CHECK(builds_columnwise_after_gather(Recipe::current, Arch::sm90));
    CHECK(!builds_columnwise_after_gather(Recipe::delayed, Arch::sm100));
    CHECK(!builds_columnwise_after_gather(Recipe::current, Arch::sm100));
    CHECK(builds_columnwise_after_gather(Recipe::block, Arch::sm90));
    CHECK(builds_columnwise_after_gather(Recipe::block, Arch::sm100));
    CHECK(!builds_columnwise_after_gather(Recipe::mxfp8, Arch::sm90));
    CHECK(!builds_columnwise_after_gather(Recipe::nvfp4, Arch::sm90));
    CHECK(!builds_columnwise_after_gather(Recipe::bf16, Arch::sm90));
}

TEST_CASE("the plan allocates the full column-wise layout, a per-tensor scale_inv excepted") {
    const Shape s{768, 256};
    const auto per_tensor =
        columnwise_plan(s, 384, 2, weight_spec(Recipe::delayed, true, false)).buffers;
    REQUIRE(per_tensor.size() == 1);
    CHECK(per_tensor[0].kind == BufferKind::columnwise_data);
    CHECK(per_tensor[0].bytes == 768u * 256u);
    const auto block = columnwise_plan(s, 384, 2, weight_spec(Recipe::block, true, false)).buffers;
    const auto expected = layout(s, weight_spec(Recipe::block, false, true));
    REQUIRE(block.size() == expected.size());
    for (std::size_t i = 0; i < block.size(); ++i) {
        CHECK(block[i].kind == expected[i].kind);
        CHECK(block[i].bytes == expected[i].bytes);
    }
}

TEST_CASE("the plan refuses what TE builds no column-wise form for, and straddling blocks") {
    const Shape s{256, 256};
    CHECK_THROWS_AS(columnwise_plan(s, 128, 2, weight_spec(Recipe::mxfp8, true, false)),
                    std::invalid_argument);
    CHECK_THROWS_AS(
        columnwise_plan(s, 128, 2, weight_spec(Recipe::current, true, false, Arch::sm100)),
        std::invalid_argument);
    CHECK_THROWS_AS(columnwise_plan(s, 128, 2, weight_spec(Recipe::current, true, true)),
                    std::invalid_argument);
    CHECK_THROWS_AS(columnwise_plan(s, 100, 2, weight_spec(Recipe::current, true, false)),
                    std::invalid_argument);
    CHECK(columnwise_shard_problem(Recipe::block, 256).empty());
    CHECK(!columnwise_shard_problem(Recipe::block, 64).empty());
    CHECK(columnwise_shard_problem(Recipe::current, 64).empty());
    CHECK_THROWS_AS(columnwise_plan({128, 256}, 64, 2, weight_spec(Recipe::block, true, false)),
                    std::invalid_argument);
}

TEST_CASE("per-tensor: one rank's transpose is the bytes TE's quantizer writes column-wise") {
    // One rank: the gathered tensor has one scale, so quantizing it with
    // both usages must give the same transpose byte for byte.
    for (Recipe recipe : {Recipe::delayed, Recipe::current}) {
        CAPTURE(int(recipe));
        const Shape s{96, 160};
        const auto x = values(s, 11);
        const QuantSpec spec = weight_spec(recipe, true, false);
        const Gathered g = gather(x, s, 1, spec);
        const ColumnwisePlan plan = columnwise_plan(s, g.shard_rows, 1, spec);
        const auto out = build(plan, g);
        const QuantSpec both = weight_spec(recipe, true, true);
        QuantizedTensor reference;
        if (recipe == Recipe::delayed) {
            AmaxHistory history;
            reference = quantize(x, s, both, history);
        } else {
            reference = quantize(x, s, both);
        }
        CHECK(buffer_of(plan, out, BufferKind::columnwise_data) ==
              reference.find(BufferKind::columnwise_data)->bytes);
    }
}

TEST_CASE("per-tensor, two ranks: the transpose decodes with each row's rank's scale") {
    // 301 rows: the last rank holds one padding row, which is dropped.
    const Shape s{301, 200};
    const auto x = values(s, 12);
    const QuantSpec spec = weight_spec(Recipe::current, true, false);
    const Gathered g = gather(x, s, 2, spec, 3.0f);  // rank 1's values 8x larger
    const ColumnwisePlan plan = columnwise_plan(s, g.shard_rows, 2, spec);
    const auto out = build(plan, g);
    const auto& t = buffer_of(plan, out, BufferKind::columnwise_data);
    REQUIRE(t.size() == s.rows * s.cols);
    const auto scale_inv = [&](std::size_t rank) {
        const auto& b = g.shards[rank].find(BufferKind::rowwise_scale_inv)->bytes;
        float v = 0;
        std::memcpy(&v, b.data(), sizeof v);
        return v;
    };
    REQUIRE(scale_inv(0) != scale_inv(1));
    std::vector<std::vector<float>> rows;
    for (const QuantizedTensor& q : g.shards)
        rows.push_back(dequantize(q, Usage::rowwise));
    const auto& data =
        g.buffers[g.shards[0].buffers[0].spec.kind == BufferKind::rowwise_data ? 0 : 1];
    std::size_t byte_mismatches = 0, value_mismatches = 0;
    for (std::size_t m = 0; m < s.rows; ++m) {
        const std::size_t rank = m / g.shard_rows, local = m % g.shard_rows;
        for (std::size_t k = 0; k < s.cols; ++k) {
            const std::uint8_t byte = t[k * s.rows + m];
            byte_mismatches += byte != data[m * s.cols + k];
            const float value = float_from_fp8(byte, Fp8Dtype::e4m3) * scale_inv(rank);
            value_mismatches += value != rows[rank][local * s.cols + k];
        }
    }
    CHECK(byte_mismatches == 0);
    CHECK(value_mismatches == 0);
}

TEST_CASE("Float8BlockScaling: the gathered shards' transpose equals quantizing column-wise") {
    // Shards of whole 128-row blocks: every block of the full tensor is one
    // rank's, so its scale is the one quantizing the whole tensor computes.
    // Ragged columns; the last rank's shard ends in padding rows.
    struct Case {
        Shape shape;
        std::size_t world;
    };
    for (Case c : {Case{{511, 300}, 2}, Case{{509, 200}, 4}, Case{{256, 128}, 1}}) {
        CAPTURE(c.shape.rows);
        CAPTURE(c.world);
        const auto x = values(c.shape, 13);
        const QuantSpec spec = weight_spec(Recipe::block, true, false);
        const Gathered g = gather(x, c.shape, c.world, spec);
        const ColumnwisePlan plan = columnwise_plan(c.shape, g.shard_rows, c.world, spec);
        const auto out = build(plan, g);
        const QuantizedTensor reference =
            quantize(x, c.shape, weight_spec(Recipe::block, false, true));
        for (BufferKind kind : {BufferKind::columnwise_data, BufferKind::columnwise_scale_inv}) {
            CAPTURE(int(kind));
            CHECK(buffer_of(plan, out, kind) == reference.find(kind)->bytes);
        }
        QuantizedTensor built{c.shape, weight_spec(Recipe::block, false, true), 0.0f, {}};
        for (std::size_t i = 0; i < plan.buffers.size(); ++i)
            built.buffers.push_back({plan.buffers[i], out[i]});
        CHECK(dequantize(built, Usage::columnwise) == dequantize(reference, Usage::columnwise));
    }
}
