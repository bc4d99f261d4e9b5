#include "fp8/layout.h"

#include "alloc/caching_allocator.h"

#include <stdexcept>

namespace allocscope::harness::fp8 {

namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) {
    return (a + b - 1) / b;
}
std::size_t round_up(std::size_t a, std::size_t b) {
    return ceil_div(a, b) * b;
}

BufferSpec buffer(BufferKind kind, const char* name, std::vector<std::size_t> shape,
                  std::size_t element_bytes) {
    std::size_t bytes = element_bytes;
    for (std::size_t d : shape)
        bytes *= d;
    return BufferSpec{kind, name, std::move(shape), element_bytes, bytes};
}

void require_divisible(Shape shape, std::size_t block, const char* recipe) {
    if (shape.rows % block != 0 || shape.cols % block != 0) {
        throw std::invalid_argument(std::string(recipe) + " needs both dimensions divisible by " +
                                    std::to_string(block) + ", got " + std::to_string(shape.rows) +
                                    "x" + std::to_string(shape.cols));
    }
}

std::vector<BufferSpec> per_tensor_layout(Shape shape, const QuantSpec& spec) {
    const bool non_tn_gemm = spec.arch == Arch::sm100;
    const bool with_data = spec.rowwise || non_tn_gemm;
    const bool with_transpose = spec.columnwise && !non_tn_gemm;
    std::vector<BufferSpec> out;
    const auto scale_inv = buffer(BufferKind::rowwise_scale_inv, "scale_inv", {1}, 4);
    // Float8Quantizer::create_tensor allocates scale_inv before the data;
    // Float8CurrentScalingQuantizer after it.
    if (spec.recipe == Recipe::delayed) out.push_back(scale_inv);
    if (with_data)
        out.push_back(buffer(BufferKind::rowwise_data, "data", {shape.rows, shape.cols}, 1));
    if (with_transpose) {
        out.push_back(
            buffer(BufferKind::columnwise_data, "transpose", {shape.cols, shape.rows}, 1));
    }
    if (spec.recipe == Recipe::current) out.push_back(scale_inv);
    return out;
}

std::vector<BufferSpec> block_layout(Shape shape, const QuantSpec& spec) {
    const std::size_t m = shape.rows, k = shape.cols, b = kFloat8BlockLength;
    const bool two_d = spec.role == TensorRole::weight;
    std::vector<BufferSpec> out;
    if (spec.rowwise) {
        out.push_back(buffer(BufferKind::rowwise_data, "rowwise_data", {m, k}, 1));
        // 1-D scales are stored transposed ([block column][row]), "GEMM ready".
        std::vector<std::size_t> scales =
            two_d ? std::vector{ceil_div(m, b), round_up(ceil_div(k, b), 4)}
                  : std::vector{ceil_div(k, b), round_up(m, 4)};
        out.push_back(
            buffer(BufferKind::rowwise_scale_inv, "rowwise_scale_inv", std::move(scales), 4));
    }
    if (spec.columnwise) {
        out.push_back(buffer(BufferKind::columnwise_data, "columnwise_data", {k, m}, 1));
        std::vector<std::size_t> scales =
            two_d ? std::vector{ceil_div(k, b), round_up(ceil_div(m, b), 4)}
                  : std::vector{ceil_div(m, b), round_up(k, 4)};
        out.push_back(
            buffer(BufferKind::columnwise_scale_inv, "columnwise_scale_inv", std::move(scales), 4));
    }
    return out;
}

std::vector<BufferSpec> mxfp8_layout(Shape shape, const QuantSpec& spec) {
    const std::size_t m = shape.rows, k = shape.cols, b = kMxfp8BlockLength;
    require_divisible(shape, b, "MXFP8");
    std::vector<BufferSpec> out;
    if (spec.rowwise) {
        out.push_back(buffer(BufferKind::rowwise_data, "rowwise_data", {m, k}, 1));
        out.push_back(buffer(BufferKind::rowwise_scale_inv, "rowwise_scale_inv",
                             {round_up(m, 128), round_up(k / b, 4)}, 1));
    }
    if (spec.columnwise) {
        // Not transposed: the column-wise copy keeps [R, C] with 32×1 blocks.
        out.push_back(buffer(BufferKind::columnwise_data, "columnwise_data", {m, k}, 1));
        out.push_back(buffer(BufferKind::columnwise_scale_inv, "columnwise_scale_inv",
                             {round_up(m / b, 4), round_up(k, 128)}, 1));
    }
    return out;
}

std::vector<BufferSpec> nvfp4_layout(Shape shape, const QuantSpec& spec) {
    const std::size_t m = shape.rows, k = shape.cols, b = kNvfp4BlockLength;
    require_divisible(shape, b, "NVFP4");
    std::vector<BufferSpec> out;
    if (spec.rowwise) {
        out.push_back(buffer(BufferKind::rowwise_data, "rowwise_data", {m, k / 2}, 1));
        out.push_back(buffer(BufferKind::rowwise_scale_inv, "rowwise_scale_inv",
                             {round_up(m, 128), round_up(k / b, 4)}, 1));
        out.push_back(buffer(BufferKind::rowwise_amax, "amax_rowwise", {1}, 4));
    }
    if (spec.columnwise) {
        // Transposed, two E2M1 values per byte along the original rows.
        out.push_back(buffer(BufferKind::columnwise_data, "columnwise_data", {k, m / 2}, 1));
        out.push_back(buffer(BufferKind::columnwise_scale_inv, "columnwise_scale_inv",
                             {round_up(k, 128), round_up(m / b, 4)}, 1));
        out.push_back(buffer(BufferKind::columnwise_amax, "amax_columnwise", {1}, 4));
    }
    return out;
}

}  // namespace

std::vector<BufferSpec> layout(Shape shape, const QuantSpec& spec) {
    if (shape.rows == 0 || shape.cols == 0) {
        throw std::invalid_argument("quantized tensor shape must be non-empty");
    }
    if (!spec.rowwise && !spec.columnwise) {
        throw std::invalid_argument("a quantized tensor needs rowwise or columnwise usage");
    }
    switch (spec.recipe) {
        case Recipe::bf16:
            return {buffer(BufferKind::rowwise_data, "data", {shape.rows, shape.cols}, 2)};
        case Recipe::delayed:
        case Recipe::current:
            return per_tensor_layout(shape, spec);
        case Recipe::block:
            return block_layout(shape, spec);
        case Recipe::mxfp8:
            return mxfp8_layout(shape, spec);
        case Recipe::nvfp4:
            return nvfp4_layout(shape, spec);
    }
    throw std::invalid_argument("unknown recipe");
}

std::size_t caching_allocator_size(std::size_t bytes) {
    return bytes == 0 ? 0 : alloc::round_size(bytes);
}

std::size_t requested_bytes(const std::vector<BufferSpec>& buffers) {
    std::size_t total = 0;
    for (const auto& b : buffers)
        total += b.bytes;
    return total;
}

std::size_t allocated_bytes(const std::vector<BufferSpec>& buffers) {
    std::size_t total = 0;
    for (const auto& b : buffers)
        total += caching_allocator_size(b.bytes);
    return total;
}

}  // namespace allocscope::harness::fp8
