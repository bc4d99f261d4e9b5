// The column-wise form TransformerEngine builds for a quantized parameter
// after FSDP2's all-gather (problem 2 of docs/TE-FSDP2-FP8-MEMORY.md): the
// backward's dgrad GEMM needs the weight column-wise, the all-gather moved
// only the row-wise bytes, so TE transposes them (Float8Tensor's
// _create_transpose for per-tensor recipes where the GEMM needs TN layouts;
// Float8BlockwiseQTensor's _create_columnwise for 2-D block-scaled weights,
// which transposes the data and the block scales). No value is
// re-quantized: the form is the gathered bytes, moved.
//
// The gathered tensor is `world` shards of `shard_rows` rows, each quantized
// on its own rank (fp8::layout of [shard_rows × cols], row-wise only), every
// buffer concatenated rank after rank (the all-gather's copy-out). What is
// built is the full tensor's column-wise buffers (fp8::layout with only
// column-wise usage), except a per-tensor scale_inv: the transpose decodes
// with the row-wise scale, which for the gathered tensor is one per rank
// (element (m, k) with rank m / shard_rows's).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "fp8/layout.h"

namespace allocscope::harness::fp8 {

// dst[c][r] = src[r][c] for r < rows, c < cols; elements of element_bytes,
// strides in elements, offsets in bytes.
struct ByteTranspose {
    std::size_t src_buffer = 0;  // index into the gathered buffers (the shard's layout)
    std::size_t src_offset = 0;
    std::size_t src_stride = 0;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::size_t element_bytes = 1;
    std::size_t dst_buffer = 0;  // index into ColumnwisePlan::buffers
    std::size_t dst_offset = 0;
    std::size_t dst_stride = 0;
};

struct ColumnwisePlan {
    std::vector<BufferSpec> buffers;    // what is built, in TE's allocation order
    std::vector<ByteTranspose> copies;  // run after zeroing every buffer
};

// Whether a quantized-init weight of `recipe` gets a column-wise form after
// the all-gather: per-tensor recipes where the FP8 GEMM needs TN layouts
// (sm90), Float8BlockScaling on every arch; MXFP8 all-gathers its
// column-wise data and NVFP4 has no quantized init.
bool builds_columnwise_after_gather(Recipe recipe, Arch arch) noexcept;

// Empty when the gathered tensor's blocks are the full tensor's; otherwise
// the reason. Float8BlockScaling's 128×128 weight blocks must not straddle
// two ranks' shards (each rank scaled its shard alone), so shard_rows must
// be a multiple of 128 for it.
std::string columnwise_shard_problem(Recipe recipe, std::size_t shard_rows);

// The plan for a [full.rows × full.cols] weight gathered from `world` shards
// of `shard_rows` rows quantized with `shard_spec` (row-wise only, role
// weight). Throws std::invalid_argument where
// builds_columnwise_after_gather is false, where columnwise_shard_problem
// names a problem, or where shard_rows × world < full.rows.
ColumnwisePlan columnwise_plan(Shape full, std::size_t shard_rows, std::size_t world,
                               const QuantSpec& shard_spec);

// Runs the plan on host memory: `gathered` one pointer per shard-layout
// entry (world × that entry's bytes), `out` one per plan buffer (its bytes).
// Each output is zeroed first (padding scales are 0, as fp8::quantize
// leaves them). Throws std::invalid_argument on a count mismatch.
void build_columnwise(const ColumnwisePlan& plan, std::span<const void* const> gathered,
                      std::span<void* const> out);

}  // namespace allocscope::harness::fp8
