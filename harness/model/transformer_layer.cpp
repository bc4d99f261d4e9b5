#include "model/transformer_layer.h"

#include <cstring>

#include "model/kernels.h"

namespace allocscope::harness::model {
namespace {

// Hands out consecutive fp32 regions of a workspace. With a null base it only
// counts, so the size functions and the passes share one carving.
class WorkspaceCarver {
  public:
    explicit WorkspaceCarver(float* base) : base_(base) {}
    float* take(std::size_t floats) {
        float* region = base_ == nullptr ? nullptr : base_ + used_;
        used_ += floats;
        return region;
    }
    std::size_t bytes() const { return used_ * sizeof(float); }

  private:
    float* base_;
    std::size_t used_ = 0;
};

struct ForwardBuffers {
    float* x;
    float* ln1;
    float* qkv;
    float* attn;
    float* res1;
    float* ln2;
    float* fc1;
    float* act;
    float* y;
    float* attn_scratch;
};

ForwardBuffers carve_forward(const LayerConfig& c, WorkspaceCarver& w) {
    const std::size_t th = c.tokens() * c.hidden;
    const std::size_t tf = c.tokens() * c.ffn;
    return {w.take(th),     w.take(th),
            w.take(3 * th), w.take(th),
            w.take(th),     w.take(th),
            w.take(tf),     w.take(tf),
            w.take(th),     w.take(attention_scratch_bytes(c.attention()) / sizeof(float))};
}

struct BackwardBuffers {
    float* dy;
    float* act;  // GELU output for the fc2 wgrad, then the GELU input
    float* d_act;
    float* ln2;
    float* d_ln2;
    float* res1;
    float* d_res1;
    float* attn;
    float* d_attn;
    float* qkv;
    float* d_qkv;
    float* ln1;
    float* d_ln1;
    float* x;
    float* dx;
    float* attn_scratch;
};

BackwardBuffers carve_backward(const LayerConfig& c, WorkspaceCarver& w) {
    const std::size_t th = c.tokens() * c.hidden;
    const std::size_t tf = c.tokens() * c.ffn;
    return {w.take(th),     w.take(tf),
            w.take(tf),     w.take(th),
            w.take(th),     w.take(th),
            w.take(th),     w.take(th),
            w.take(th),     w.take(3 * th),
            w.take(3 * th), w.take(th),
            w.take(th),     w.take(th),
            w.take(th),     w.take(attention_scratch_bytes(c.attention()) / sizeof(float))};
}

void load(const float* src, float* dst, std::size_t n) {
    std::memcpy(dst, src, n * sizeof(float));
}
void load(const Bf16* src, float* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        dst[i] = to_float(src[i]);
}

void store(const float* src, float* dst, std::size_t n) {
    std::memcpy(dst, src, n * sizeof(float));
}
void store(const float* src, Bf16* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        dst[i] = to_bf16(src[i]);
}

// Stores a stage's fp32 result as a saved activation and replaces the fp32
// copy with the stored value, so the rest of the forward computes from the
// same numbers the backward will load.
void keep(float* values, float* dst, std::size_t n) {
    store(values, dst, n);
}
void keep(float* values, Bf16* dst, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        dst[i] = to_bf16(values[i]);
        values[i] = to_float(dst[i]);
    }
}

}  // namespace

std::array<SavedSpec, kLayerSavedCount> layer_saved_specs(const LayerConfig& c) {
    const std::size_t t = c.tokens();
    const std::size_t th = t * c.hidden;
    const std::size_t tf = t * c.ffn;
    return {{
        {"ln1_mean", 0, t},
        {"ln1_rstd", 0, t},
        {"ln1_out", th, 0},
        {"qkv", 3 * th, 0},
        {"attn_lse", 0, c.attention().lse_elements()},
        {"attn_out", th, 0},
        {"residual1", th, 0},
        {"ln2_mean", 0, t},
        {"ln2_rstd", 0, t},
        {"ln2_out", th, 0},
        {"fc1_out", tf, 0},
        {"gelu_out", tf, 0},
    }};
}

std::size_t layer_forward_workspace_bytes(const LayerConfig& config) {
    WorkspaceCarver counter(nullptr);
    carve_forward(config, counter);
    return counter.bytes();
}

std::size_t layer_backward_workspace_bytes(const LayerConfig& config) {
    WorkspaceCarver counter(nullptr);
    carve_backward(config, counter);
    return counter.bytes();
}

template <typename Act>
void layer_forward(const LayerConfig& c, const LayerWeights& w, const Act* x, Act* y,
                   const LayerSaved<Act>& saved, float* workspace) {
    WorkspaceCarver carver(workspace);
    const ForwardBuffers b = carve_forward(c, carver);
    const std::size_t t = c.tokens();
    const std::size_t h = c.hidden;
    const std::size_t f = c.ffn;

    load(x, b.x, t * h);
    layernorm_forward(t, h, b.x, w[kLn1Gamma], w[kLn1Beta], b.ln1, saved.ln1_mean, saved.ln1_rstd);
    keep(b.ln1, saved.ln1_out, t * h);
    linear_forward({t, h, 3 * h}, b.ln1, w[kQkvWeight], w[kQkvBias], b.qkv);
    keep(b.qkv, saved.qkv, 3 * t * h);
    attention_forward(c.attention(), b.qkv, b.attn, saved.attn_lse, b.attn_scratch);
    keep(b.attn, saved.attn_out, t * h);
    linear_forward({t, h, h}, b.attn, w[kProjWeight], w[kProjBias], b.res1);
    accumulate(t * h, b.x, b.res1);
    keep(b.res1, saved.residual1, t * h);
    layernorm_forward(t, h, b.res1, w[kLn2Gamma], w[kLn2Beta], b.ln2, saved.ln2_mean,
                      saved.ln2_rstd);
    keep(b.ln2, saved.ln2_out, t * h);
    linear_forward({t, h, f}, b.ln2, w[kFc1Weight], w[kFc1Bias], b.fc1);
    keep(b.fc1, saved.fc1_out, t * f);
    gelu_forward(t * f, b.fc1, b.act);
    keep(b.act, saved.gelu_out, t * f);
    linear_forward({t, f, h}, b.act, w[kFc2Weight], w[kFc2Bias], b.y);
    accumulate(t * h, b.res1, b.y);
    store(b.y, y, t * h);
}

template <typename Act>
void layer_backward(const LayerConfig& c, const LayerWeights& w, const Act* x,
                    const LayerSaved<Act>& saved, const Act* dy, Act* dx, const LayerGrads& g,
                    float* workspace) {
    WorkspaceCarver carver(workspace);
    const BackwardBuffers b = carve_backward(c, carver);
    const std::size_t t = c.tokens();
    const std::size_t h = c.hidden;
    const std::size_t f = c.ffn;

    load(dy, b.dy, t * h);
    // MLP: y = res1 + fc2(gelu(fc1(ln2(res1)))).
    load(saved.gelu_out, b.act, t * f);
    linear_wgrad({t, f, h}, b.dy, b.act, g[kFc2Weight], g[kFc2Bias]);
    linear_dgrad({t, f, h}, b.dy, w[kFc2Weight], b.d_act);
    load(saved.fc1_out, b.act, t * f);
    gelu_backward(t * f, b.act, b.d_act, b.d_act);
    load(saved.ln2_out, b.ln2, t * h);
    linear_wgrad({t, h, f}, b.d_act, b.ln2, g[kFc1Weight], g[kFc1Bias]);
    linear_dgrad({t, h, f}, b.d_act, w[kFc1Weight], b.d_ln2);
    load(saved.residual1, b.res1, t * h);
    layernorm_backward(t, h, b.d_ln2, b.res1, w[kLn2Gamma], saved.ln2_mean, saved.ln2_rstd,
                       b.d_res1, g[kLn2Gamma], g[kLn2Beta]);
    accumulate(t * h, b.dy, b.d_res1);
    // Attention block: res1 = x + proj(attn(qkv(ln1(x)))).
    load(saved.attn_out, b.attn, t * h);
    linear_wgrad({t, h, h}, b.d_res1, b.attn, g[kProjWeight], g[kProjBias]);
    linear_dgrad({t, h, h}, b.d_res1, w[kProjWeight], b.d_attn);
    load(saved.qkv, b.qkv, 3 * t * h);
    attention_backward(c.attention(), b.qkv, b.attn, saved.attn_lse, b.d_attn, b.d_qkv,
                       b.attn_scratch);
    load(saved.ln1_out, b.ln1, t * h);
    linear_wgrad({t, h, 3 * h}, b.d_qkv, b.ln1, g[kQkvWeight], g[kQkvBias]);
    linear_dgrad({t, h, 3 * h}, b.d_qkv, w[kQkvWeight], b.d_ln1);
    load(x, b.x, t * h);
    layernorm_backward(t, h, b.d_ln1, b.x, w[kLn1Gamma], saved.ln1_mean, saved.ln1_rstd, b.dx,
                       g[kLn1Gamma], g[kLn1Beta]);
    accumulate(t * h, b.d_res1, b.dx);
    store(b.dx, dx, t * h);
}

template void layer_forward<float>(const LayerConfig&, const LayerWeights&, const float*, float*,
                                   const LayerSaved<float>&, float*);
template void layer_forward<Bf16>(const LayerConfig&, const LayerWeights&, const Bf16*, Bf16*,
                                  const LayerSaved<Bf16>&, float*);
template void layer_backward<float>(const LayerConfig&, const LayerWeights&, const float*,
                                    const LayerSaved<float>&, const float*, float*,
                                    const LayerGrads&, float*);
template void layer_backward<Bf16>(const LayerConfig&, const LayerWeights&, const Bf16*,
                                   const LayerSaved<Bf16>&, const Bf16*, Bf16*, const LayerGrads&,
                                   float*);

}  // namespace allocscope::harness::model
