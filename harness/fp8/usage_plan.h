// How one usage (row-wise or column-wise) of one recipe is laid out: the one
// home of this case analysis, used by the host quantizer (fp8/quantize.cpp)
// and the device one (harness/cuda/device_quantize.cu).
//
// Elements are quantized in tiles that share one amax, and each element
// (m, k) finds its scale at coordinate (m / scale_rows, k / scale_cols) of
// the scale buffer, stored either [row][col] or transposed. Scale
// granularity can be finer than the tile: NVFP4 2-D weights repeat one
// 16×16 tile's scale on each of its 16 rows.
#pragma once

#include <cstddef>
#include <stdexcept>

#include "fp8/layout.h"

namespace allocscope::harness::fp8 {

enum class Usage { rowwise, columnwise };

struct UsagePlan {
    BufferKind data_kind;
    BufferKind scale_kind;
    BufferKind amax_kind;  // NVFP4 only: the global amax its scales refer to
    bool data_transposed;  // data stored [cols × rows]
    std::size_t tile_rows, tile_cols;
    std::size_t scale_rows, scale_cols;
    bool scale_transposed;
};

// `has_columnwise_data`: whether the layout has a column-wise data buffer
// (per-tensor recipes have one only where the GEMM takes TN layouts).
// Throws std::logic_error for bf16, which is not quantized.
inline UsagePlan usage_plan(Recipe recipe, TensorRole role, Shape s, Usage usage,
                            bool has_columnwise_data) {
    const bool row = usage == Usage::rowwise;
    const bool weight = role == TensorRole::weight;
    UsagePlan p{
        .data_kind = row ? BufferKind::rowwise_data : BufferKind::columnwise_data,
        .scale_kind = row ? BufferKind::rowwise_scale_inv : BufferKind::columnwise_scale_inv,
        .amax_kind = row ? BufferKind::rowwise_amax : BufferKind::columnwise_amax,
        .data_transposed = false,
        .tile_rows = 1,
        .tile_cols = 1,
        .scale_rows = 1,
        .scale_cols = 1,
        .scale_transposed = false,
    };
    // Sets tile and scale granularity to the same rows × cols blocks.
    const auto blocks = [&p](std::size_t rows, std::size_t cols) {
        p.tile_rows = p.scale_rows = rows;
        p.tile_cols = p.scale_cols = cols;
    };
    switch (recipe) {
        case Recipe::delayed:
        case Recipe::current:
            blocks(s.rows, s.cols);
            p.scale_kind = BufferKind::rowwise_scale_inv;  // shared by both usages
            // Where the GEMM takes non-TN layouts there is no `transpose`:
            // columnwise usage reads `data`.
            p.data_transposed = !row && has_columnwise_data;
            if (!p.data_transposed) p.data_kind = BufferKind::rowwise_data;
            return p;
        case Recipe::block: {
            const std::size_t b = kFloat8BlockLength;
            p.data_transposed = !row;
            if (weight) {
                blocks(b, b);
                p.scale_transposed = !row;  // [block col][block row] for the transposed copy
            } else if (row) {
                blocks(1, b);
                p.scale_transposed = true;  // GEMM-ready [block][row]
            } else {
                blocks(b, 1);
            }
            return p;
        }
        case Recipe::mxfp8:
            if (row) {
                blocks(1, kMxfp8BlockLength);
            } else {
                blocks(kMxfp8BlockLength, 1);
            }
            return p;
        case Recipe::nvfp4: {
            const std::size_t b = kNvfp4BlockLength;
            if (row) {
                blocks(1, b);
                if (weight) p.tile_rows = b;
            } else {
                blocks(b, 1);
                if (weight) p.tile_cols = b;
                p.data_transposed = true;
                p.scale_transposed = true;  // [column][row block]
            }
            return p;
        }
        case Recipe::bf16:
            break;
    }
    throw std::logic_error("bf16 has no quantization plan");
}

}  // namespace allocscope::harness::fp8
