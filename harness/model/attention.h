// Causal multi-head self-attention on the fused QKV projection's output.
//
// Token order is TE's default "sbhd": token t = s · batch + b for position s
// of sequence b, so a [tokens × C] tensor is [seq × batch × C].
//
// QKV layout is TE's default for a fused QKV parameter
// (qkv_weight_interleaved = True, no GQA): each token's 3·hidden row is
// [heads × 3 × head_dim], i.e. q, k and v of one head are adjacent:
//   q(s, b, h, j) = qkv[(s·batch + b) · 3H + h · 3d + 0 · d + j]
//   k(s, b, h, j) = qkv[(s·batch + b) · 3H + h · 3d + 1 · d + j]
//   v(s, b, h, j) = qkv[(s·batch + b) · 3H + h · 3d + 2 · d + j]
// with H = hidden and d = head_dim. The output is [tokens × H] with head h in
// columns [h·d, (h+1)·d) — TE's core-attention output, the projection's input.
//
// out = softmax(q·kᵀ / √d + causal mask) · v per sequence and head; position s
// attends to positions 0..s of its own sequence only.
#pragma once

#include <cstddef>

namespace allocscope::harness::model {

struct AttentionShape {
    std::size_t seq;
    std::size_t batch;
    std::size_t heads;
    std::size_t head_dim;

    std::size_t tokens() const { return seq * batch; }
    std::size_t hidden() const { return heads * head_dim; }
    // Elements of the saved softmax statistics, laid out [batch × heads × seq]
    // like the fp32 "softmax_stats" aux tensor of TE's fused attention.
    std::size_t lse_elements() const { return batch * heads * seq; }
};

// Scratch both passes need: two seq × seq fp32 matrices, reused per head.
std::size_t attention_scratch_bytes(const AttentionShape& shape);

// qkv: [tokens × 3H]; out: [tokens × H]; lse: [batch × heads × seq] fp32, the
// log-sum-exp of each scaled, masked score row, saved so the backward pass
// recomputes the probabilities instead of keeping the seq × seq matrix (as
// flash / fused attention does). scratch: attention_scratch_bytes, 4-aligned.
void attention_forward(const AttentionShape& shape, const float* qkv, float* out, float* lse,
                       float* scratch);

// qkv, out, lse: as saved by the forward; d_out: [tokens × H];
// d_qkv: [tokens × 3H], same layout as qkv, overwritten.
void attention_backward(const AttentionShape& shape, const float* qkv, const float* out,
                        const float* lse, const float* d_out, float* d_qkv, float* scratch);

}  // namespace allocscope::harness::model
