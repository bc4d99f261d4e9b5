#include "fp8/columnwise.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace allocscope::harness::fp8 {

namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) {
    return (a + b - 1) / b;
}

std::size_t index_of(const std::vector<BufferSpec>& layout, BufferKind kind) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
        if (layout[i].kind == kind) return i;
    }
    throw std::logic_error("columnwise_plan: a layout lacks an expected buffer");
}

}  // namespace

bool builds_columnwise_after_gather(Recipe recipe, Arch arch) noexcept {
    switch (recipe) {
        case Recipe::delayed:
        case Recipe::current:
            return arch == Arch::sm90;
        case Recipe::block:
            return true;
        case Recipe::bf16:
        case Recipe::mxfp8:
        case Recipe::nvfp4:
            break;
    }
    return false;
}

std::string columnwise_shard_problem(Recipe recipe, std::size_t shard_rows) {
    if (recipe == Recipe::block && shard_rows % kFloat8BlockLength != 0) {
        return "Float8BlockScaling's " + std::to_string(kFloat8BlockLength) + "x" +
               std::to_string(kFloat8BlockLength) + " weight blocks would straddle two ranks' " +
               "shards of " + std::to_string(shard_rows) + " rows";
    }
    return {};
}

ColumnwisePlan columnwise_plan(Shape full, std::size_t shard_rows, std::size_t world,
                               const QuantSpec& shard_spec) {
    if (!builds_columnwise_after_gather(shard_spec.recipe, shard_spec.arch)) {
        throw std::invalid_argument(
            "columnwise_plan: this recipe and arch build no column-wise form");
    }
    if (!shard_spec.rowwise || shard_spec.columnwise || shard_spec.role != TensorRole::weight) {
        throw std::invalid_argument("columnwise_plan: the shards must be row-wise weight tensors");
    }
    if (std::string problem = columnwise_shard_problem(shard_spec.recipe, shard_rows);
        !problem.empty()) {
        throw std::invalid_argument("columnwise_plan: " + problem);
    }
    if (world == 0 || shard_rows * world < full.rows) {
        throw std::invalid_argument("columnwise_plan: the shards do not cover the tensor");
    }
    const std::vector<BufferSpec> shard = layout({shard_rows, full.cols}, shard_spec);
    QuantSpec spec = shard_spec;
    spec.rowwise = false;
    spec.columnwise = true;
    ColumnwisePlan plan;
    for (const BufferSpec& b : layout(full, spec)) {
        // The per-tensor transpose decodes with the row-wise scale_inv.
        if (b.kind != BufferKind::rowwise_scale_inv) plan.buffers.push_back(b);
    }
    // The row-wise data of the shards, rank after rank, is the full tensor's
    // [rows × cols] data followed by the last rank's padding rows.
    plan.copies.push_back(ByteTranspose{
        .src_buffer = index_of(shard, BufferKind::rowwise_data),
        .src_offset = 0,
        .src_stride = full.cols,
        .rows = full.rows,
        .cols = full.cols,
        .element_bytes = 1,
        .dst_buffer = index_of(plan.buffers, BufferKind::columnwise_data),
        .dst_offset = 0,
        .dst_stride = full.rows,
    });
    if (shard_spec.recipe == Recipe::block) {
        // Rank r's [block rows × block cols] scales (row stride: the padded
        // shape) become block columns r·(shard_rows / 128) onwards of the
        // full [block cols × block rows] column-wise scales.
        const std::size_t b = kFloat8BlockLength;
        const BufferSpec& src = shard[index_of(shard, BufferKind::rowwise_scale_inv)];
        const std::size_t dst = index_of(plan.buffers, BufferKind::columnwise_scale_inv);
        const std::size_t shard_blocks = shard_rows / b;
        const std::size_t full_blocks = ceil_div(full.rows, b);
        for (std::size_t r = 0; r < world && r * shard_blocks < full_blocks; ++r) {
            plan.copies.push_back(ByteTranspose{
                .src_buffer = index_of(shard, BufferKind::rowwise_scale_inv),
                .src_offset = r * src.bytes,
                .src_stride = src.shape[1],
                .rows = std::min(shard_blocks, full_blocks - r * shard_blocks),
                .cols = ceil_div(full.cols, b),
                .element_bytes = src.element_bytes,
                .dst_buffer = dst,
                .dst_offset = r * shard_blocks * src.element_bytes,
                .dst_stride = plan.buffers[dst].shape[1],
            });
        }
    }
    return plan;
}

void build_columnwise(const ColumnwisePlan& plan, std::span<const void* const> gathered,
                      std::span<void* const> out) {
    if (out.size() != plan.buffers.size()) {
        throw std::invalid_argument("build_columnwise: one output pointer per plan buffer");
    }
    for (std::size_t i = 0; i < out.size(); ++i)
        std::memset(out[i], 0, plan.buffers[i].bytes);
    for (const ByteTranspose& t : plan.copies) {
        if (t.src_buffer >= gathered.size()) {
            throw std::invalid_argument("build_columnwise: a copy names a missing gathered buffer");
        }
        const auto* src = static_cast<const std::uint8_t*>(gathered[t.src_buffer]) + t.src_offset;
        auto* dst = static_cast<std::uint8_t*>(out[t.dst_buffer]) + t.dst_offset;
        const std::size_t e = t.element_bytes;
        for (std::size_t r = 0; r < t.rows; ++r) {
            for (std::size_t c = 0; c < t.cols; ++c)
                std::memcpy(dst + (c * t.dst_stride + r) * e, src + (r * t.src_stride + c) * e, e);
        }
    }
}

}  // namespace allocscope::harness::fp8
