// Reference forward/backward of one TE TransformerLayer (pre-LayerNorm, fused
// QKV with bias, causal self-attention, GELU MLP, dropout 0):
//
//   ln1  = LayerNorm(x)                    qkv  = ln1 · Wqkvᵀ + bqkv
//   attn = CausalMHA(qkv)                  res1 = x + attn · Wprojᵀ + bproj
//   ln2  = LayerNorm(res1)                 fc1  = ln2 · W1ᵀ + b1
//   act  = GELU(fc1)                       y    = res1 + act · W2ᵀ + b2
//
// Tensors are row-major [tokens × C] with tokens in sbhd order (see
// attention.h for that and for the QKV layout). Weights and gradients are fp32
// (the caller converts bf16 or dequantizes FP8 weights first). Activations —
// the layer input and output, their gradients and the tensors saved for the
// backward pass — are stored as Act, float or Bf16. Every stage computes in
// fp32 in the caller's workspace; with Act = Bf16 each saved tensor is rounded
// once and the forward continues from the rounded value, so the backward sees
// exactly the activations the forward used (as in bf16 training).
#pragma once

#include <array>
#include <cstddef>

#include "model/attention.h"
#include "model/bf16.h"

namespace allocscope::harness::model {

struct LayerConfig {
    std::size_t hidden;
    std::size_t heads;
    std::size_t ffn;
    std::size_t seq;
    std::size_t batch;

    std::size_t tokens() const { return seq * batch; }
    AttentionShape attention() const { return {seq, batch, heads, hidden / heads}; }
};

// The layer's 12 parameters in the order of TE TransformerLayer's
// named_parameters() — the order of trainer/model_spec.h's layer_params(),
// which owns their shapes and sharding (H = hidden, F = ffn).
enum LayerParam : std::size_t {
    kLn1Gamma,    // ln1.weight        [H]
    kLn1Beta,     // ln1.bias          [H]
    kQkvWeight,   // attn.qkv.weight   [3H × H]
    kQkvBias,     // attn.qkv.bias     [3H]
    kProjWeight,  // attn.proj.weight  [H × H]
    kProjBias,    // attn.proj.bias    [H]
    kLn2Gamma,    // ln2.weight        [H]
    kLn2Beta,     // ln2.bias          [H]
    kFc1Weight,   // mlp.fc1.weight    [F × H]
    kFc1Bias,     // mlp.fc1.bias      [F]
    kFc2Weight,   // mlp.fc2.weight    [H × F]
    kFc2Bias,     // mlp.fc2.bias      [H]
    kLayerParamCount
};

// One fp32 pointer per parameter, indexed by LayerParam.
using LayerWeights = std::array<const float*, kLayerParamCount>;
// Gradients, same shapes; layer_backward overwrites them.
using LayerGrads = std::array<float*, kLayerParamCount>;

// Tensors the forward saves for the backward (T = tokens, H = hidden,
// F = ffn). The layer input x is saved too but is owned by the caller (it is
// the previous layer's output), so layer_backward takes it separately.
template <typename Act>
struct LayerSaved {
    float* ln1_mean;  // [T] fp32
    float* ln1_rstd;  // [T] fp32
    Act* ln1_out;     // [T × H]  QKV GEMM input
    Act* qkv;         // [T × 3H] attention input (q, k, v)
    float* attn_lse;  // [batch × heads × seq] fp32 softmax statistics
    Act* attn_out;    // [T × H]  attention output, projection GEMM input
    Act* residual1;   // [T × H]  x + projection, second LayerNorm input
    float* ln2_mean;  // [T] fp32
    float* ln2_rstd;  // [T] fp32
    Act* ln2_out;     // [T × H]  fc1 GEMM input
    Act* fc1_out;     // [T × F]  GELU input
    Act* gelu_out;    // [T × F]  fc2 GEMM input
};

// Sizes of the LayerSaved fields, in field order, so the caller can allocate
// (and tag) each one. act_elements counts Act-typed elements, fp32_elements
// fp32 ones; exactly one of them is non-zero.
struct SavedSpec {
    const char* name;
    std::size_t act_elements;
    std::size_t fp32_elements;
    std::size_t bytes(std::size_t act_bytes) const {
        return act_elements * act_bytes + fp32_elements * sizeof(float);
    }
};
inline constexpr std::size_t kLayerSavedCount = 12;
std::array<SavedSpec, kLayerSavedCount> layer_saved_specs(const LayerConfig& config);

// fp32 workspace each pass needs (byte sizes; 4-byte aligned buffers).
std::size_t layer_forward_workspace_bytes(const LayerConfig& config);
std::size_t layer_backward_workspace_bytes(const LayerConfig& config);

// Both passes are instantiated for Act = float (gradient checks) and
// Act = Bf16 (the trainer).
//
// x, y: [T × H]. Fills every field of saved. y must not alias x.
template <typename Act>
void layer_forward(const LayerConfig& config, const LayerWeights& weights, const Act* x, Act* y,
                   const LayerSaved<Act>& saved, float* workspace);

// x: the forward's input; dy: [T × H] gradient of y; dx: [T × H] gradient of
// x (may alias dy); grads: overwritten. saved is only read.
template <typename Act>
void layer_backward(const LayerConfig& config, const LayerWeights& weights, const Act* x,
                    const LayerSaved<Act>& saved, const Act* dy, Act* dx, const LayerGrads& grads,
                    float* workspace);

}  // namespace allocscope::harness::model
