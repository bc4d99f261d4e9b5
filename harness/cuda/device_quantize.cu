// GPU quantization for every recipe, a port of fp8/quantize.cpp. The CPU
// code walks tiles that share one amax (a whole tensor, a 1×128 row block, a
// 32×1 column block, ...) and stores each element's byte and scale at
// computed indices; the kernels here walk the same tiles, one thread block
// per tile, and compute the same indices, so any layout rule lives in one
// table (Plan) shared by quantize and dequantize. Simple rather than fast:
// the tensors are at most a few hundred thousand elements.
#include "device_quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "quant/device_formats.cuh"

namespace allocscope::harness::cuda {

namespace {

using fp8::BufferKind;
using fp8::BufferSpec;
using fp8::QuantSpec;
using fp8::Recipe;
using fp8::Shape;
using fp8::Usage;

constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr int kMaxThreads = 256;
constexpr unsigned kMaxGrid = 65535;

// How a tile's multiplier and scale are derived on the device.
enum class Kind : int { per_tensor, block, mxfp8, nvfp4 };

Kind kind_of(Recipe recipe) {
    switch (recipe) {
        case Recipe::delayed:
        case Recipe::current:
            return Kind::per_tensor;
        case Recipe::block:
            return Kind::block;
        case Recipe::mxfp8:
            return Kind::mxfp8;
        case Recipe::nvfp4:
            return Kind::nvfp4;
        case Recipe::bf16:
            break;
    }
    throw std::logic_error("bf16 has no quantization kind");
}

// fp8::UsagePlan (fp8/usage_plan.h) with buffers named by their index in the
// layout.
struct Plan {
    std::size_t data = 0;
    std::size_t scales = 0;
    std::size_t amax = 0;  // NVFP4 only
    bool data_transposed = false;
    std::size_t tile_rows = 1, tile_cols = 1;
    std::size_t scale_rows = 1, scale_cols = 1;
    bool scale_transposed = false;
};

bool has_buffer(const std::vector<BufferSpec>& layout, BufferKind kind) {
    return std::any_of(layout.begin(), layout.end(),
                       [kind](const BufferSpec& b) { return b.kind == kind; });
}

std::size_t index_of(const std::vector<BufferSpec>& layout, BufferKind kind) {
    for (std::size_t i = 0; i < layout.size(); ++i) {
        if (layout[i].kind == kind) return i;
    }
    throw std::logic_error("quantization plan names a buffer the layout lacks");
}

Plan plan_for(const std::vector<BufferSpec>& layout, Shape s, const QuantSpec& spec, Usage usage) {
    const fp8::UsagePlan u = fp8::usage_plan(spec.recipe, spec.role, s, usage,
                                             has_buffer(layout, BufferKind::columnwise_data));
    Plan p;
    p.data = index_of(layout, u.data_kind);
    p.scales = index_of(layout, u.scale_kind);
    if (spec.recipe == Recipe::nvfp4) p.amax = index_of(layout, u.amax_kind);
    p.data_transposed = u.data_transposed;
    p.tile_rows = u.tile_rows;
    p.tile_cols = u.tile_cols;
    p.scale_rows = u.scale_rows;
    p.scale_cols = u.scale_cols;
    p.scale_transposed = u.scale_transposed;
    return p;
}

std::size_t scale_stride(const BufferSpec& scales) {
    return scales.shape.size() == 2 ? scales.shape[1] : 1;
}

// quantize.cpp's scale_from_amax for per-tensor scaling (no power of two).
float per_tensor_scale(float amax, float max_value) {
    if (amax == 0.0f || !std::isfinite(amax)) return 1.0f;
    const float scale = max_value / amax;
    return std::isinf(scale) ? kFloatMax : scale;
}

// quantize.cpp's nvfp4_global_encode_scale.
float nvfp4_global_encode_scale(float amax) {
    const float scale = std::fmin(fp8::kE4m3Max * fp8::kE2m1Max / amax, kFloatMax);
    if (amax == 0.0f || scale == 0.0f) return 1.0f;
    return scale;
}

// The sign of the NaN this host's float multiply makes from inf · 0; see
// quant::host_mul. volatile keeps the compiler from folding it.
bool host_default_nan_negative() {
    volatile float zero = 0.0f;
    volatile float inf = std::numeric_limits<float>::infinity();
    return std::signbit(inf * zero);
}

// Threads for one tile: a power of two (for the tree reduction) covering
// the tile if it is small.
unsigned threads_for(std::size_t elements) {
    unsigned threads = 32;
    while (threads < kMaxThreads && threads < elements)
        threads *= 2;
    return threads;
}

unsigned grid_for(std::size_t items, unsigned threads_per_item) {
    const std::size_t per_block = kMaxThreads / threads_per_item;
    const std::size_t blocks = (items + per_block - 1) / per_block;
    return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxGrid));
}

// Every value the quantize kernel needs for one usage. Host-side floats
// (tensor_scale, nvfp4_*) are computed on the host exactly as the CPU code
// computes them and passed bit for bit.
struct QuantizeArgs {
    Kind kind;
    bool e5m2;
    bool default_nan_negative;
    std::size_t rows, cols;
    std::uint8_t* data;
    std::uint8_t* scales;  // f32 for per-tensor and block, bytes for MXFP8 / NVFP4
    std::size_t scale_stride;
    Plan plan;
    float tensor_scale;
    float fp8_max;
    float inv_fp8_max;         // 1 / fp8_max, as the CPU folds it
    float nvfp4_block_factor;  // S_enc · (1 / 6)
    float nvfp4_decode;        // 1 / S_enc, rounded from double
};

struct DequantizeArgs {
    Kind kind;
    bool e5m2;
    bool columnwise_out;
    std::size_t rows, cols;
    const std::uint8_t* data;
    const std::uint8_t* scales;
    std::size_t scale_stride;
    Plan plan;
    const float* nvfp4_amax;
    float nvfp4_amax_factor;  // 1 / (448 · 6)
};

__device__ std::size_t scale_index(const Plan& p, std::size_t stride, std::size_t m,
                                   std::size_t k) {
    const std::size_t r = m / p.scale_rows, c = k / p.scale_cols;
    return p.scale_transposed ? c * stride + r : r * stride + c;
}

__device__ std::size_t data_index(const Plan& p, std::size_t rows, std::size_t cols, std::size_t m,
                                  std::size_t k) {
    return p.data_transposed ? k * rows + m : m * cols + k;
}

// Threads must be a power of two; returns the max of `value` over the block
// to every thread. The leading barrier lets callers reuse `partial`.
__device__ float block_max(float value, float* partial) {
    __syncthreads();
    partial[threadIdx.x] = value;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    return partial[0];
}

// max |x| with NaN ignored (fmaxf), folded into *amax_bits: the bits of
// non-negative floats (infinity included) order as the floats do.
__global__ void amax_kernel(const float* x, std::size_t n, unsigned* amax_bits) {
    __shared__ float partial[kMaxThreads];
    float amax = 0.0f;
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        amax = fmaxf(amax, fabsf(x[i]));
    }
    amax = block_max(amax, partial);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(amax));
}

__global__ void store_float_kernel(float* at, float value) {
    *at = value;
}

__global__ void bf16_kernel(const float* x, std::size_t n, std::uint8_t* data) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        const std::uint16_t bits = quant::bf16_from_float(x[i]);
        data[2 * i] = static_cast<std::uint8_t>(bits & 0xFF);
        data[2 * i + 1] = static_cast<std::uint8_t>(bits >> 8);
    }
}

// The tile's multiplier (what elements are multiplied by before the cast)
// and its stored scale, as quantize.cpp's quantize_usage derives them.
struct TileScale {
    float multiplier;
    float scale_f32;
    std::uint8_t scale_byte;
};

__device__ TileScale tile_scale(const QuantizeArgs& a, float amax) {
    TileScale t{a.tensor_scale, 0.0f, 0};
    switch (a.kind) {
        case Kind::block: {
            // scale_from_amax with power_of_two: keep sign and exponent bits.
            float scale = 1.0f;
            if (amax != 0.0f && isfinite(amax)) {
                scale = __fdiv_rn(a.fp8_max, amax);
                if (isinf(scale)) scale = kFloatMax;
                scale = __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
            }
            t.multiplier = scale;
            break;
        }
        case Kind::mxfp8:
            t.scale_byte = quant::e8m0_from_float_round_up(__fmul_rn(amax, a.inv_fp8_max));
            t.multiplier = quant::e8m0_reciprocal(t.scale_byte);
            break;
        case Kind::nvfp4:
            t.scale_byte = quant::e4m3_from_float(__fmul_rn(amax, a.nvfp4_block_factor));
            t.multiplier = fminf(
                __fdiv_rn(1.0f, __fmul_rn(quant::float_from_e4m3(t.scale_byte), a.nvfp4_decode)),
                kFloatMax);
            break;
        case Kind::per_tensor:
            break;
    }
    t.scale_f32 = __fdiv_rn(1.0f, t.multiplier);
    return t;
}

// One thread block per tile (grid-stride over tiles). Per-tensor recipes
// pass one-row tiles: their multiplier does not depend on the tile, and the
// shared scale_inv is stored by the host-computed value instead.
__global__ void quantize_kernel(const float* x, QuantizeArgs a) {
    __shared__ float partial[kMaxThreads];
    const Plan& p = a.plan;
    const std::size_t tiles_across = (a.cols + p.tile_cols - 1) / p.tile_cols;
    const std::size_t tiles = ((a.rows + p.tile_rows - 1) / p.tile_rows) * tiles_across;
    for (std::size_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const std::size_t r0 = (tile / tiles_across) * p.tile_rows;
        const std::size_t c0 = (tile % tiles_across) * p.tile_cols;
        const std::size_t h = a.rows - r0 < p.tile_rows ? a.rows - r0 : p.tile_rows;
        const std::size_t w = a.cols - c0 < p.tile_cols ? a.cols - c0 : p.tile_cols;
        float amax = 0.0f;
        if (a.kind != Kind::per_tensor) {
            for (std::size_t e = threadIdx.x; e < h * w; e += blockDim.x) {
                amax = fmaxf(amax, fabsf(x[(r0 + e / w) * a.cols + c0 + e % w]));
            }
            amax = block_max(amax, partial);
        }
        const TileScale t = tile_scale(a, amax);

        if (a.kind == Kind::nvfp4) {
            // Two E2M1 values share a byte: one thread writes both, the
            // element at the even data index in the low nibble. Pairs run
            // along the stored (contiguous) dimension and never straddle a
            // tile, since rows and cols are multiples of 16.
            for (std::size_t e = threadIdx.x; e < h * w / 2; e += blockDim.x) {
                std::size_t m = 0, k = 0, dm = 0, dk = 0;
                if (p.data_transposed) {
                    m = r0 + 2 * (e % (h / 2));
                    k = c0 + e / (h / 2);
                    dm = 1;
                } else {
                    m = r0 + e / (w / 2);
                    k = c0 + 2 * (e % (w / 2));
                    dk = 1;
                }
                const std::uint8_t lo = quant::e2m1_from_float(
                    quant::host_mul(x[m * a.cols + k], t.multiplier, a.default_nan_negative));
                const std::uint8_t hi = quant::e2m1_from_float(quant::host_mul(
                    x[(m + dm) * a.cols + k + dk], t.multiplier, a.default_nan_negative));
                a.data[data_index(p, a.rows, a.cols, m, k) / 2] =
                    static_cast<std::uint8_t>(lo | (hi << 4));
            }
        } else {
            for (std::size_t e = threadIdx.x; e < h * w; e += blockDim.x) {
                const std::size_t m = r0 + e / w, k = c0 + e % w;
                a.data[data_index(p, a.rows, a.cols, m, k)] = quant::fp8_from_float(
                    quant::host_mul(x[m * a.cols + k], t.multiplier, a.default_nan_negative),
                    a.e5m2);
            }
        }

        if (a.kind != Kind::per_tensor) {
            // Each scale once: at the first element of its scale block.
            for (std::size_t e = threadIdx.x; e < h * w; e += blockDim.x) {
                const std::size_t m = r0 + e / w, k = c0 + e % w;
                if (m % p.scale_rows != 0 || k % p.scale_cols != 0) continue;
                const std::size_t si = scale_index(p, a.scale_stride, m, k);
                if (a.kind == Kind::block) {
                    reinterpret_cast<float*>(a.scales)[si] = t.scale_f32;
                } else {
                    a.scales[si] = t.scale_byte;
                }
            }
        }
    }
}

__global__ void dequantize_kernel(DequantizeArgs a, float* out) {
    const Plan& p = a.plan;
    const std::size_t n = a.rows * a.cols;
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        const std::size_t m = i / a.cols, k = i % a.cols;
        const std::size_t si = scale_index(p, a.scale_stride, m, k);
        const std::size_t di = data_index(p, a.rows, a.cols, m, k);
        float value = 0.0f;
        switch (a.kind) {
            case Kind::per_tensor:
            case Kind::block:
                value = __fmul_rn(quant::float_from_fp8(a.data[di], a.e5m2),
                                  reinterpret_cast<const float*>(a.scales)[si]);
                break;
            case Kind::mxfp8:
                value = __fmul_rn(quant::float_from_fp8(a.data[di], a.e5m2),
                                  quant::float_from_e8m0(a.scales[si]));
                break;
            case Kind::nvfp4: {
                const std::uint8_t byte = a.data[di / 2];
                const auto nibble = static_cast<std::uint8_t>(di % 2 == 0 ? byte & 0xF : byte >> 4);
                const float block_scale =
                    __fmul_rn(__fmul_rn(quant::float_from_e4m3(a.scales[si]), *a.nvfp4_amax),
                              a.nvfp4_amax_factor);
                value = __fmul_rn(quant::float_from_e2m1(nibble), block_scale);
                break;
            }
        }
        out[a.columnwise_out ? k * a.rows + m : i] = value;
    }
}

__global__ void dequantize_bf16_kernel(const std::uint8_t* data, std::size_t rows, std::size_t cols,
                                       bool columnwise_out, float* out) {
    const std::size_t n = rows * cols;
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        const auto bits = static_cast<std::uint16_t>(data[2 * i] | (data[2 * i + 1] << 8));
        const std::size_t m = i / cols, k = i % cols;
        out[columnwise_out ? k * rows + m : i] = quant::float_from_bf16(bits);
    }
}

// fp8::layout first (it throws for bad shapes), then the buffer count.
std::vector<BufferSpec> checked_layout(Shape shape, const QuantSpec& spec, std::size_t buffer_count,
                                       const char* what) {
    std::vector<BufferSpec> layout = fp8::layout(shape, spec);
    if (buffer_count != layout.size()) {
        throw std::invalid_argument(std::string(what) + ": " + std::to_string(buffer_count) +
                                    " buffers for a layout of " + std::to_string(layout.size()));
    }
    return layout;
}

template <typename Pointer>
void require_non_null(std::span<Pointer const> buffers, const char* what) {
    for (Pointer b : buffers) {
        if (b == nullptr) throw std::invalid_argument(std::string(what) + ": null buffer");
    }
}

}  // namespace

std::size_t quantize_scratch_bytes(fp8::Shape shape, const fp8::QuantSpec& spec) {
    fp8::layout(shape, spec);  // the same validation as quantize
    return sizeof(unsigned);   // the amax's bits, for atomicMax
}

float quantize(const float* values, fp8::Shape shape, const fp8::QuantSpec& spec,
               float delayed_scale, std::span<void* const> buffers, void* scratch,
               cudaStream_t stream) {
    const std::vector<BufferSpec> layout =
        checked_layout(shape, spec, buffers.size(), "cuda::quantize");
    require_non_null(buffers, "cuda::quantize");
    if (values == nullptr || scratch == nullptr) {
        throw std::invalid_argument("cuda::quantize: null values or scratch");
    }
    const std::size_t n = shape.rows * shape.cols;

    // Padding scales must read 0, as in the CPU's zero-filled buffers.
    for (std::size_t i = 0; i < layout.size(); ++i) {
        ALLOCSCOPE_CUDA_CHECK(cudaMemsetAsync(buffers[i], 0, layout[i].bytes, stream));
    }
    auto* amax_bits = static_cast<unsigned*>(scratch);
    ALLOCSCOPE_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream));
    amax_kernel<<<grid_for(n, 1), kMaxThreads, 0, stream>>>(values, n, amax_bits);
    ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    // The per-tensor and NVFP4 scales derive from the amax on the host, as
    // the CPU derives them, so they are the same floats.
    unsigned host_bits = 0;
    ALLOCSCOPE_CUDA_CHECK(
        cudaMemcpyAsync(&host_bits, amax_bits, sizeof host_bits, cudaMemcpyDeviceToHost, stream));
    ALLOCSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const float amax = std::bit_cast<float>(host_bits);

    if (spec.recipe == Recipe::bf16) {
        bf16_kernel<<<grid_for(n, 1), kMaxThreads, 0, stream>>>(
            values, n, static_cast<std::uint8_t*>(buffers[0]));
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
        return amax;
    }

    QuantizeArgs a{};
    a.kind = kind_of(spec.recipe);
    a.e5m2 = spec.dtype == fp8::Fp8Dtype::e5m2;
    a.default_nan_negative = host_default_nan_negative();
    a.rows = shape.rows;
    a.cols = shape.cols;
    a.fp8_max = fp8::fp8_max(spec.dtype);
    a.inv_fp8_max = 1.0f / a.fp8_max;
    a.tensor_scale = spec.recipe == Recipe::delayed ? delayed_scale
                     : spec.recipe == Recipe::current
                         ? per_tensor_scale(amax, fp8::fp8_max(spec.dtype))
                         : 1.0f;
    const float nvfp4_encode = nvfp4_global_encode_scale(amax);
    a.nvfp4_block_factor = nvfp4_encode * (1.0f / fp8::kE2m1Max);
    a.nvfp4_decode = static_cast<float>(1.0 / nvfp4_encode);

    for (const Usage usage : {Usage::rowwise, Usage::columnwise}) {
        if (usage == Usage::rowwise ? !spec.rowwise : !spec.columnwise) continue;
        a.plan = plan_for(layout, shape, spec, usage);
        a.data = static_cast<std::uint8_t*>(buffers[a.plan.data]);
        a.scales = static_cast<std::uint8_t*>(buffers[a.plan.scales]);
        a.scale_stride = scale_stride(layout[a.plan.scales]);
        if (a.kind == Kind::per_tensor) {
            a.plan.tile_rows = 1;
            a.plan.tile_cols = shape.cols;
            store_float_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<float*>(a.scales),
                                                    1.0f / a.tensor_scale);
            ALLOCSCOPE_CUDA_CHECK_LAUNCH();
        }
        if (a.kind == Kind::nvfp4) {
            store_float_kernel<<<1, 1, 0, stream>>>(static_cast<float*>(buffers[a.plan.amax]),
                                                    amax);
            ALLOCSCOPE_CUDA_CHECK_LAUNCH();
        }
        const std::size_t tile_elements = a.plan.tile_rows * a.plan.tile_cols;
        const std::size_t tiles = ((shape.rows + a.plan.tile_rows - 1) / a.plan.tile_rows) *
                                  ((shape.cols + a.plan.tile_cols - 1) / a.plan.tile_cols);
        const unsigned threads = threads_for(tile_elements);
        const auto grid = static_cast<unsigned>(std::min<std::size_t>(tiles, kMaxGrid));
        quantize_kernel<<<grid, threads, 0, stream>>>(values, a);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }
    return amax;
}

void dequantize(std::span<const void* const> buffers, fp8::Shape shape, const fp8::QuantSpec& spec,
                fp8::Usage usage, float* out, cudaStream_t stream) {
    const std::vector<BufferSpec> layout =
        checked_layout(shape, spec, buffers.size(), "cuda::dequantize");
    require_non_null(buffers, "cuda::dequantize");
    if (out == nullptr) throw std::invalid_argument("cuda::dequantize: null output");
    const std::size_t n = shape.rows * shape.cols;
    const bool columnwise_out = usage == Usage::columnwise;

    // bf16 has one buffer that serves both usages, as in the CPU code.
    if (spec.recipe == Recipe::bf16) {
        dequantize_bf16_kernel<<<grid_for(n, 1), kMaxThreads, 0, stream>>>(
            static_cast<const std::uint8_t*>(buffers[0]), shape.rows, shape.cols, columnwise_out,
            out);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
        return;
    }
    if ((usage == Usage::rowwise && !spec.rowwise) ||
        (usage == Usage::columnwise && !spec.columnwise)) {
        throw std::invalid_argument(
            "cuda::dequantize: the tensor was not quantized for this usage");
    }

    DequantizeArgs a{};
    a.kind = kind_of(spec.recipe);
    a.e5m2 = spec.dtype == fp8::Fp8Dtype::e5m2;
    a.columnwise_out = columnwise_out;
    a.rows = shape.rows;
    a.cols = shape.cols;
    a.plan = plan_for(layout, shape, spec, usage);
    a.data = static_cast<const std::uint8_t*>(buffers[a.plan.data]);
    a.scales = static_cast<const std::uint8_t*>(buffers[a.plan.scales]);
    a.scale_stride = scale_stride(layout[a.plan.scales]);
    a.nvfp4_amax =
        a.kind == Kind::nvfp4 ? static_cast<const float*>(buffers[a.plan.amax]) : nullptr;
    a.nvfp4_amax_factor = 1.0f / (fp8::kE4m3Max * fp8::kE2m1Max);
    dequantize_kernel<<<grid_for(n, 1), kMaxThreads, 0, stream>>>(a, out);
    ALLOCSCOPE_CUDA_CHECK_LAUNCH();
}

namespace {

// fp8::ByteTranspose: dst[c][r] = src[r][c], elements of `element` bytes,
// strides in elements.
__global__ void transpose_bytes_kernel(const std::uint8_t* src, std::size_t src_stride,
                                       std::size_t rows, std::size_t cols, std::size_t element,
                                       std::uint8_t* dst, std::size_t dst_stride) {
    const std::size_t n = rows * cols;
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        const std::size_t r = i / cols, c = i % cols;
        for (std::size_t b = 0; b < element; ++b)
            dst[(c * dst_stride + r) * element + b] = src[(r * src_stride + c) * element + b];
    }
}

}  // namespace

void build_columnwise(const fp8::ColumnwisePlan& plan, std::span<const void* const> gathered,
                      std::span<void* const> out, cudaStream_t stream) {
    if (out.size() != plan.buffers.size()) {
        throw std::invalid_argument("cuda::build_columnwise: one output pointer per plan buffer");
    }
    require_non_null(gathered, "cuda::build_columnwise");
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (out[i] == nullptr) throw std::invalid_argument("cuda::build_columnwise: null output");
        ALLOCSCOPE_CUDA_CHECK(cudaMemsetAsync(out[i], 0, plan.buffers[i].bytes, stream));
    }
    for (const fp8::ByteTranspose& t : plan.copies) {
        if (t.src_buffer >= gathered.size()) {
            throw std::invalid_argument(
                "cuda::build_columnwise: a copy names a missing gathered buffer");
        }
        const std::size_t n = t.rows * t.cols;
        if (n == 0) continue;
        transpose_bytes_kernel<<<grid_for(n, 1), kMaxThreads, 0, stream>>>(
            static_cast<const std::uint8_t*>(gathered[t.src_buffer]) + t.src_offset, t.src_stride,
            t.rows, t.cols, t.element_bytes,
            static_cast<std::uint8_t*>(out[t.dst_buffer]) + t.dst_offset, t.dst_stride);
        ALLOCSCOPE_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace allocscope::harness::cuda
