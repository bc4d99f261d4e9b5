#include "model/attention.h"

#include <cmath>
#include <limits>

#include "model/gemm.h"

namespace allocscope::harness::model {
namespace {

// Views of one (sequence, head) pair inside the packed tensors: rows are the
// sequence positions, so the leading dimension skips the other sequences of
// the batch.
struct HeadViews {
    std::size_t qkv_ld;
    std::size_t out_ld;
    std::size_t qkv_offset;  // of q; k and v follow at +d and +2d
    std::size_t out_offset;
};

HeadViews head_views(const AttentionShape& s, std::size_t b, std::size_t h) {
    const std::size_t hidden = s.hidden();
    return {s.batch * 3 * hidden, s.batch * hidden, b * 3 * hidden + h * 3 * s.head_dim,
            b * hidden + h * s.head_dim};
}

float softmax_scale(const AttentionShape& s) {
    return 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}

}  // namespace

std::size_t attention_scratch_bytes(const AttentionShape& shape) {
    return 2 * shape.seq * shape.seq * sizeof(float);
}

void attention_forward(const AttentionShape& shape, const float* qkv, float* out, float* lse,
                       float* scratch) {
    const std::size_t n = shape.seq;
    const std::size_t d = shape.head_dim;
    float* probs = scratch;
    for (std::size_t b = 0; b < shape.batch; ++b) {
        for (std::size_t h = 0; h < shape.heads; ++h) {
            const HeadViews v = head_views(shape, b, h);
            const float* q = qkv + v.qkv_offset;
            gemm(n, n, d, softmax_scale(shape), {q, v.qkv_ld}, {q + d, v.qkv_ld, Trans::kYes}, 0.0f,
                 probs, n);
            float* row_lse = lse + (b * shape.heads + h) * n;
            for (std::size_t i = 0; i < n; ++i) {
                float* row = probs + i * n;
                float max = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j <= i; ++j)
                    max = std::fmax(max, row[j]);
                float sum = 0.0f;
                for (std::size_t j = 0; j <= i; ++j) {
                    row[j] = std::exp(row[j] - max);
                    sum += row[j];
                }
                const float inv = 1.0f / sum;
                for (std::size_t j = 0; j <= i; ++j)
                    row[j] *= inv;
                for (std::size_t j = i + 1; j < n; ++j)
                    row[j] = 0.0f;
                row_lse[i] = max + std::log(sum);
            }
            gemm(n, d, n, 1.0f, {probs, n}, {q + 2 * d, v.qkv_ld}, 0.0f, out + v.out_offset,
                 v.out_ld);
        }
    }
}

void attention_backward(const AttentionShape& shape, const float* qkv, const float* out,
                        const float* lse, const float* d_out, float* d_qkv, float* scratch) {
    const std::size_t n = shape.seq;
    const std::size_t d = shape.head_dim;
    const float scale = softmax_scale(shape);
    float* probs = scratch;
    float* d_scores = scratch + n * n;
    for (std::size_t b = 0; b < shape.batch; ++b) {
        for (std::size_t h = 0; h < shape.heads; ++h) {
            const HeadViews v = head_views(shape, b, h);
            const float* q = qkv + v.qkv_offset;
            const float* k = q + d;
            const float* val = q + 2 * d;
            const float* o = out + v.out_offset;
            const float* d_o = d_out + v.out_offset;
            float* d_q = d_qkv + v.qkv_offset;

            gemm(n, n, d, scale, {q, v.qkv_ld}, {k, v.qkv_ld, Trans::kYes}, 0.0f, probs, n);
            const float* row_lse = lse + (b * shape.heads + h) * n;
            for (std::size_t i = 0; i < n; ++i) {
                float* row = probs + i * n;
                for (std::size_t j = 0; j <= i; ++j)
                    row[j] = std::exp(row[j] - row_lse[i]);
                for (std::size_t j = i + 1; j < n; ++j)
                    row[j] = 0.0f;
            }
            // dV = Pᵀ · dO
            gemm(n, d, n, 1.0f, {probs, n, Trans::kYes}, {d_o, v.out_ld}, 0.0f, d_q + 2 * d,
                 v.qkv_ld);
            // dP = dO · Vᵀ
            gemm(n, n, d, 1.0f, {d_o, v.out_ld}, {val, v.qkv_ld, Trans::kYes}, 0.0f, d_scores, n);
            // Softmax backward, dS = P ∘ (dP − rowsum(dP ∘ P)); rowsum(dP ∘ P)
            // equals rowsum(dO ∘ O), which needs d values instead of n.
            for (std::size_t i = 0; i < n; ++i) {
                float delta = 0.0f;
                for (std::size_t j = 0; j < d; ++j)
                    delta += d_o[i * v.out_ld + j] * o[i * v.out_ld + j];
                float* ds = d_scores + i * n;
                const float* p = probs + i * n;
                for (std::size_t j = 0; j < n; ++j)
                    ds[j] = p[j] * (ds[j] - delta);
            }
            // dQ = scale · dS · K,  dK = scale · dSᵀ · Q
            gemm(n, d, n, scale, {d_scores, n}, {k, v.qkv_ld}, 0.0f, d_q, v.qkv_ld);
            gemm(n, d, n, scale, {d_scores, n, Trans::kYes}, {q, v.qkv_ld}, 0.0f, d_q + d,
                 v.qkv_ld);
        }
    }
}

}  // namespace allocscope::harness::model
