// The CPU math of the reference transformer layer, checked against naive
// double-precision references written independently here (plain index loops,
// no shared code with the kernels) and against central finite differences of
// those references. fp32 kernels agree with the exact gradient to ~1e-6
// relative; the bounds below leave a margin of about 100×.
// Longer than 600 lines: every CPU kernel of the layer against an independent
// naive reference and finite differences, written out next to each other.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <span>
#include <vector>

#include "model/adam.h"
#include "model/attention.h"
#include "model/bf16.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "model/transformer_layer.h"

using namespace allocscope::harness::model;

namespace {

using Vec = std::vector<double>;

// Relative error bounds: fp32 forward vs double reference, and fp32 backward
// vs finite differences of the double reference (norm-wise).
constexpr double kForwardTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-4;

Vec random_vec(std::mt19937& rng, std::size_t n, double scale = 1.0) {
    std::normal_distribution<double> dist(0.0, scale);
    Vec v(n);
    for (double& x : v)
        x = dist(rng);
    return v;
}

std::vector<float> to_f32(const Vec& v) {
    return {v.begin(), v.end()};
}
Vec to_f64(const std::vector<float>& v) {
    return {v.begin(), v.end()};
}

// ‖a − b‖₂ / ‖b‖₂.
double relative_error(const Vec& a, const Vec& b) {
    double diff = 0.0;
    double norm = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        norm += b[i] * b[i];
    }
    return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}
double relative_error(const std::vector<float>& a, const Vec& b) {
    return relative_error(to_f64(a), b);
}

// Central differences of a double-precision scalar function.
Vec numeric_gradient(Vec x, const std::function<double(const Vec&)>& f) {
    constexpr double kStep = 1e-6;
    Vec grad(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + kStep;
        const double up = f(x);
        x[i] = saved - kStep;
        const double down = f(x);
        x[i] = saved;
        grad[i] = (up - down) / (2 * kStep);
    }
    return grad;
}

double dot(const Vec& a, const Vec& b) {
    double s = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        s += a[i] * b[i];
    return s;
}

// ---- double-precision references ------------------------------------------

Vec ref_layernorm(const Vec& x, const Vec& gamma, const Vec& beta, std::size_t rows,
                  std::size_t cols) {
    Vec y(x.size());
    for (std::size_t r = 0; r < rows; ++r) {
        double mean = 0.0;
        for (std::size_t c = 0; c < cols; ++c)
            mean += x[r * cols + c];
        mean /= static_cast<double>(cols);
        double var = 0.0;
        for (std::size_t c = 0; c < cols; ++c) {
            var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
        }
        var /= static_cast<double>(cols);
        for (std::size_t c = 0; c < cols; ++c) {
            y[r * cols + c] = (x[r * cols + c] - mean) / std::sqrt(var + 1e-5) * gamma[c] + beta[c];
        }
    }
    return y;
}

// y[r][o] = Σ_i x[r][i] · w[o][i] + b[o]
Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, std::size_t rows, std::size_t in,
               std::size_t out) {
    Vec y(rows * out);
    for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < out; ++o) {
            double s = b.empty() ? 0.0 : b[o];
            for (std::size_t i = 0; i < in; ++i)
                s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
    }
    return y;
}

double ref_gelu(double x) {
    return 0.5 * x *
           (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// Causal attention straight from the definition, sbhd tokens, per-head
// interleaved q/k/v.
Vec ref_attention(const Vec& qkv, std::size_t seq, std::size_t batch, std::size_t heads,
                  std::size_t d) {
    const std::size_t hidden = heads * d;
    auto at = [&](std::size_t s, std::size_t b, std::size_t h, std::size_t which, std::size_t j) {
        return qkv[(s * batch + b) * 3 * hidden + h * 3 * d + which * d + j];
    };
    Vec out(seq * batch * hidden);
    for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t i = 0; i < seq; ++i) {
                Vec score(i + 1);
                double max = -std::numeric_limits<double>::infinity();
                for (std::size_t j = 0; j <= i; ++j) {
                    double s = 0.0;
                    for (std::size_t e = 0; e < d; ++e)
                        s += at(i, b, h, 0, e) * at(j, b, h, 1, e);
                    score[j] = s / std::sqrt(static_cast<double>(d));
                    max = std::max(max, score[j]);
                }
                double sum = 0.0;
                for (double& s : score) {
                    s = std::exp(s - max);
                    sum += s;
                }
                for (std::size_t e = 0; e < d; ++e) {
                    double o = 0.0;
                    for (std::size_t j = 0; j <= i; ++j)
                        o += score[j] / sum * at(j, b, h, 2, e);
                    out[(i * batch + b) * hidden + h * d + e] = o;
                }
            }
        }
    }
    return out;
}

// ---- layer fixtures -------------------------------------------------------

const LayerConfig kTiny{.hidden = 16, .heads = 2, .ffn = 32, .seq = 4, .batch = 2};

// Shapes of the 12 parameters in LayerParam order ({rows, cols}).
std::array<std::array<std::size_t, 2>, kLayerParamCount> param_shapes(const LayerConfig& c) {
    const std::size_t h = c.hidden;
    const std::size_t f = c.ffn;
    return {{{1, h},
             {1, h},
             {3 * h, h},
             {1, 3 * h},
             {h, h},
             {1, h},
             {1, h},
             {1, h},
             {f, h},
             {1, f},
             {h, f},
             {1, h}}};
}

// All parameters of one layer in LayerParam order, as double.
struct RefParams {
    std::vector<Vec> tensors;
};

RefParams random_params(std::mt19937& rng, const LayerConfig& c) {
    RefParams p;
    const auto shapes = param_shapes(c);
    for (std::size_t i = 0; i < kLayerParamCount; ++i) {
        const bool is_gamma = i == kLn1Gamma || i == kLn2Gamma;
        Vec v = random_vec(rng, shapes[i][0] * shapes[i][1], shapes[i][0] == 1 ? 0.1 : 0.3);
        if (is_gamma) {
            for (double& g : v)
                g += 1.0;
        }
        p.tensors.push_back(v);
    }
    return p;
}

Vec ref_layer(const LayerConfig& c, const std::vector<Vec>& p, const Vec& x) {
    const std::size_t t = c.tokens();
    const std::size_t h = c.hidden;
    const std::size_t f = c.ffn;
    const Vec ln1 = ref_layernorm(x, p[kLn1Gamma], p[kLn1Beta], t, h);
    const Vec qkv = ref_linear(ln1, p[kQkvWeight], p[kQkvBias], t, h, 3 * h);
    const Vec attn = ref_attention(qkv, c.seq, c.batch, c.heads, h / c.heads);
    Vec res1 = ref_linear(attn, p[kProjWeight], p[kProjBias], t, h, h);
    for (std::size_t i = 0; i < res1.size(); ++i)
        res1[i] += x[i];
    const Vec ln2 = ref_layernorm(res1, p[kLn2Gamma], p[kLn2Beta], t, h);
    Vec act = ref_linear(ln2, p[kFc1Weight], p[kFc1Bias], t, h, f);
    for (double& a : act)
        a = ref_gelu(a);
    Vec y = ref_linear(act, p[kFc2Weight], p[kFc2Bias], t, f, h);
    for (std::size_t i = 0; i < y.size(); ++i)
        y[i] += res1[i];
    return y;
}

// Owns every buffer one layer needs, with saved activations stored as Act.
template <typename Act>
struct LayerBuffers {
    explicit LayerBuffers(const LayerConfig& c) {
        const auto specs = layer_saved_specs(c);
        for (std::size_t i = 0; i < kLayerSavedCount; ++i) {
            act[i].resize(specs[i].act_elements);
            fp32[i].resize(specs[i].fp32_elements);
        }
        saved = {fp32[0].data(), fp32[1].data(), act[2].data(),  act[3].data(),
                 fp32[4].data(), act[5].data(),  act[6].data(),  fp32[7].data(),
                 fp32[8].data(), act[9].data(),  act[10].data(), act[11].data()};
        forward_ws.resize(layer_forward_workspace_bytes(c) / sizeof(float));
        backward_ws.resize(layer_backward_workspace_bytes(c) / sizeof(float));
    }
    std::array<std::vector<Act>, kLayerSavedCount> act;
    std::array<std::vector<float>, kLayerSavedCount> fp32;
    LayerSaved<Act> saved{};
    std::vector<float> forward_ws;
    std::vector<float> backward_ws;
};

struct FloatParams {
    std::array<std::vector<float>, kLayerParamCount> weights;
    std::array<std::vector<float>, kLayerParamCount> grads;
    LayerWeights weight_ptrs() const {
        LayerWeights w{};
        for (std::size_t i = 0; i < kLayerParamCount; ++i)
            w[i] = weights[i].data();
        return w;
    }
    LayerGrads grad_ptrs() {
        LayerGrads g{};
        for (std::size_t i = 0; i < kLayerParamCount; ++i)
            g[i] = grads[i].data();
        return g;
    }
};

FloatParams to_float_params(const RefParams& p) {
    FloatParams f;
    for (std::size_t i = 0; i < kLayerParamCount; ++i) {
        f.weights[i] = to_f32(p.tensors[i]);
        f.grads[i].assign(p.tensors[i].size(), std::nanf(""));
    }
    return f;
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN and infinity") {
    CHECK(to_bf16(1.0f).bits == 0x3f80);
    CHECK(to_bf16(-2.0f).bits == 0xc000);
    // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: ties go to the even mantissa.
    CHECK(to_float(to_bf16(1.0f + 0x1p-8f)) == 1.0f);
    CHECK(to_float(to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
    CHECK(to_float(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
    CHECK(std::isnan(to_float(to_bf16(std::nanf("")))));
    CHECK(std::isinf(to_float(to_bf16(std::numeric_limits<float>::infinity()))));
    CHECK(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
    for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
        const Bf16 b{static_cast<std::uint16_t>(bits)};
        if (std::isnan(to_float(b))) continue;
        REQUIRE(to_bf16(to_float(b)).bits == b.bits);
    }
    const std::vector<float> in{0.1f, -3.0f, 1e-3f};
    std::vector<Bf16> mid(3);
    std::vector<float> out(3);
    to_bf16(in, mid);
    to_float(mid, out);
    for (std::size_t i = 0; i < 3; ++i)
        CHECK(std::fabs(out[i] - in[i]) <= std::fabs(in[i]) * 0x1p-8f);
}

TEST_CASE("gemm matches a double reference for every transpose and ragged block edges") {
    std::mt19937 rng(1);
    // Sizes straddle the 4 × 8 register tile and the 64/128/128 cache blocks.
    const std::size_t m = 67;
    const std::size_t n = 133;
    const std::size_t k = 259;
    const std::size_t pad = 3;
    for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const std::size_t lda = (ta ? m : k) + pad;
            const std::size_t ldb = (tb ? k : n) + pad;
            const Vec a = random_vec(rng, (ta ? k : m) * lda);
            const Vec b = random_vec(rng, (tb ? n : k) * ldb);
            const Vec c0 = random_vec(rng, m * (n + pad));
            const double alpha = 0.75;
            const double beta = -0.5;
            Vec expected = c0;
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = 0; j < n; ++j) {
                    double s = 0.0;
                    for (std::size_t p = 0; p < k; ++p) {
                        s += (ta ? a[p * lda + i] : a[i * lda + p]) *
                             (tb ? b[j * ldb + p] : b[p * ldb + j]);
                    }
                    expected[i * (n + pad) + j] = alpha * s + beta * c0[i * (n + pad) + j];
                }
            }
            const std::vector<float> af = to_f32(a);
            const std::vector<float> bf = to_f32(b);
            std::vector<float> c = to_f32(c0);
            gemm(m, n, k, static_cast<float>(alpha),
                 {af.data(), lda, ta ? Trans::kYes : Trans::kNo},
                 {bf.data(), ldb, tb ? Trans::kYes : Trans::kNo}, static_cast<float>(beta),
                 c.data(), n + pad);
            CHECK(relative_error(c, expected) < kForwardTolerance);
            // The padding columns of C are not written.
            for (std::size_t i = 0; i < m; ++i) {
                for (std::size_t j = n; j < n + pad; ++j) {
                    REQUIRE(c[i * (n + pad) + j] == static_cast<float>(c0[i * (n + pad) + j]));
                }
            }
        }
    }
}

TEST_CASE("gemm with beta zero overwrites C without reading it") {
    const std::vector<float> a{1, 2, 3, 4};
    const std::vector<float> b{5, 6, 7, 8};
    std::vector<float> c(4, std::nanf(""));
    gemm(2, 2, 2, 1.0f, {a.data(), 2}, {b.data(), 2}, 0.0f, c.data(), 2);
    CHECK(c == std::vector<float>{19, 22, 43, 50});
}

TEST_CASE("layernorm forward matches the double reference and saves mean and rstd") {
    std::mt19937 rng(2);
    const std::size_t rows = 5;
    const std::size_t cols = 37;
    Vec x = random_vec(rng, rows * cols, 2.0);
    for (double& v : x)
        v += 3.0;  // a large mean must not hurt the variance
    const Vec gamma = random_vec(rng, cols);
    const Vec beta = random_vec(rng, cols);
    const std::vector<float> xf = to_f32(x);
    const std::vector<float> gf = to_f32(gamma);
    const std::vector<float> bf = to_f32(beta);
    std::vector<float> y(rows * cols);
    std::vector<float> mean(rows);
    std::vector<float> rstd(rows);
    layernorm_forward(rows, cols, xf.data(), gf.data(), bf.data(), y.data(), mean.data(),
                      rstd.data());
    CHECK(relative_error(y, ref_layernorm(x, gamma, beta, rows, cols)) < kForwardTolerance);
    for (std::size_t r = 0; r < rows; ++r) {
        double mu = 0.0;
        for (std::size_t c = 0; c < cols; ++c)
            mu += x[r * cols + c];
        mu /= cols;
        CHECK(mean[r] == doctest::Approx(mu).epsilon(1e-5));
    }
}

TEST_CASE("layernorm backward matches finite differences for x, gamma and beta") {
    std::mt19937 rng(3);
    const std::size_t rows = 4;
    const std::size_t cols = 19;
    const Vec x = random_vec(rng, rows * cols);
    const Vec gamma = random_vec(rng, cols);
    const Vec beta = random_vec(rng, cols);
    const Vec dy = random_vec(rng, rows * cols);
    const std::vector<float> xf = to_f32(x);
    const std::vector<float> gf = to_f32(gamma);
    const std::vector<float> bf = to_f32(beta);
    const std::vector<float> dyf = to_f32(dy);
    std::vector<float> y(rows * cols);
    std::vector<float> mean(rows);
    std::vector<float> rstd(rows);
    layernorm_forward(rows, cols, xf.data(), gf.data(), bf.data(), y.data(), mean.data(),
                      rstd.data());
    std::vector<float> dx(rows * cols);
    std::vector<float> dgamma(cols);
    std::vector<float> dbeta(cols);
    layernorm_backward(rows, cols, dyf.data(), xf.data(), gf.data(), mean.data(), rstd.data(),
                       dx.data(), dgamma.data(), dbeta.data());
    CHECK(relative_error(dx, numeric_gradient(x, [&](const Vec& v) {
                             return dot(dy, ref_layernorm(v, gamma, beta, rows, cols));
                         })) < kGradientTolerance);
    CHECK(relative_error(dgamma, numeric_gradient(gamma, [&](const Vec& v) {
                             return dot(dy, ref_layernorm(x, v, beta, rows, cols));
                         })) < kGradientTolerance);
    CHECK(relative_error(dbeta, numeric_gradient(beta, [&](const Vec& v) {
                             return dot(dy, ref_layernorm(x, gamma, v, rows, cols));
                         })) < kGradientTolerance);
}

TEST_CASE("linear forward, dgrad, wgrad and bias grad match the reference and finite differences") {
    std::mt19937 rng(4);
    const LinearShape s{.rows = 6, .in = 11, .out = 13};
    const Vec x = random_vec(rng, s.rows * s.in);
    const Vec w = random_vec(rng, s.out * s.in);
    const Vec b = random_vec(rng, s.out);
    const Vec dy = random_vec(rng, s.rows * s.out);
    const std::vector<float> xf = to_f32(x);
    const std::vector<float> wf = to_f32(w);
    const std::vector<float> bf = to_f32(b);
    const std::vector<float> dyf = to_f32(dy);

    std::vector<float> y(s.rows * s.out);
    linear_forward(s, xf.data(), wf.data(), bf.data(), y.data());
    CHECK(relative_error(y, ref_linear(x, w, b, s.rows, s.in, s.out)) < kForwardTolerance);
    linear_forward(s, xf.data(), wf.data(), nullptr, y.data());
    CHECK(relative_error(y, ref_linear(x, w, {}, s.rows, s.in, s.out)) < kForwardTolerance);

    std::vector<float> dx(s.rows * s.in);
    linear_dgrad(s, dyf.data(), wf.data(), dx.data());
    CHECK(relative_error(dx, numeric_gradient(x, [&](const Vec& v) {
                             return dot(dy, ref_linear(v, w, b, s.rows, s.in, s.out));
                         })) < kGradientTolerance);

    std::vector<float> dw(s.out * s.in, std::nanf(""));
    std::vector<float> db(s.out, std::nanf(""));
    linear_wgrad(s, dyf.data(), xf.data(), dw.data(), db.data());
    CHECK(relative_error(dw, numeric_gradient(w, [&](const Vec& v) {
                             return dot(dy, ref_linear(x, v, b, s.rows, s.in, s.out));
                         })) < kGradientTolerance);
    CHECK(relative_error(db, numeric_gradient(b, [&](const Vec& v) {
                             return dot(dy, ref_linear(x, w, v, s.rows, s.in, s.out));
                         })) < kGradientTolerance);
}

TEST_CASE("gelu is TE's tanh approximation and its derivative matches finite differences") {
    // tanh form at 1: 0.8411920; the exact erf form would give 0.8413447.
    CHECK(gelu(1.0f) == doctest::Approx(0.8411920).epsilon(1e-6));
    CHECK(gelu(0.0f) == 0.0f);
    std::mt19937 rng(5);
    const Vec x = random_vec(rng, 64, 2.0);
    const Vec dy = random_vec(rng, 64);
    const std::vector<float> xf = to_f32(x);
    const std::vector<float> dyf = to_f32(dy);
    std::vector<float> y(64);
    gelu_forward(64, xf.data(), y.data());
    Vec expected(64);
    for (std::size_t i = 0; i < 64; ++i)
        expected[i] = ref_gelu(x[i]);
    CHECK(relative_error(y, expected) < kForwardTolerance);
    std::vector<float> dx = dyf;
    gelu_backward(64, xf.data(), dx.data(), dx.data());  // in place: dx aliases dy
    CHECK(relative_error(dx, numeric_gradient(x, [&](const Vec& v) {
                             double s = 0.0;
                             for (std::size_t i = 0; i < v.size(); ++i)
                                 s += dy[i] * ref_gelu(v[i]);
                             return s;
                         })) < kGradientTolerance);
}

TEST_CASE("residual add sums its inputs and accumulate merges gradients") {
    const std::vector<float> a{1, 2, 3};
    std::vector<float> b{10, 20, 30};
    std::vector<float> out(3);
    residual_add(3, a.data(), b.data(), out.data());
    CHECK(out == std::vector<float>{11, 22, 33});
    residual_add(3, a.data(), b.data(), b.data());
    CHECK(b == std::vector<float>{11, 22, 33});
    accumulate(3, a.data(), b.data());
    CHECK(b == std::vector<float>{12, 24, 36});
}

TEST_CASE("mse loss is the mean squared error and its gradient matches finite differences") {
    std::mt19937 rng(6);
    const Vec y = random_vec(rng, 50);
    const Vec target = random_vec(rng, 50);
    const std::vector<float> yf = to_f32(y);
    const std::vector<float> tf = to_f32(target);
    auto ref = [&](const Vec& v) {
        double s = 0.0;
        for (std::size_t i = 0; i < v.size(); ++i)
            s += (v[i] - target[i]) * (v[i] - target[i]);
        return s / static_cast<double>(v.size());
    };
    CHECK(mse_loss_forward(50, yf.data(), tf.data()) == doctest::Approx(ref(y)).epsilon(1e-6));
    std::vector<float> dy(50);
    mse_loss_backward(50, yf.data(), tf.data(), 1.0f, dy.data());
    CHECK(relative_error(dy, numeric_gradient(y, ref)) < kGradientTolerance);
    mse_loss_backward(50, yf.data(), tf.data(), 0.5f, dy.data());
    CHECK(dy[7] == doctest::Approx(0.5 * 2 * (y[7] - target[7]) / 50).epsilon(1e-5));
}

TEST_CASE(
    "causal attention forward matches the reference and backward matches finite differences") {
    std::mt19937 rng(7);
    const AttentionShape s{.seq = 5, .batch = 3, .heads = 2, .head_dim = 4};
    const Vec qkv = random_vec(rng, s.tokens() * 3 * s.hidden());
    const Vec d_out = random_vec(rng, s.tokens() * s.hidden());
    const std::vector<float> qkvf = to_f32(qkv);
    const std::vector<float> d_outf = to_f32(d_out);
    std::vector<float> out(s.tokens() * s.hidden());
    std::vector<float> lse(s.lse_elements());
    std::vector<float> scratch(attention_scratch_bytes(s) / sizeof(float));
    attention_forward(s, qkvf.data(), out.data(), lse.data(), scratch.data());
    CHECK(relative_error(out, ref_attention(qkv, s.seq, s.batch, s.heads, s.head_dim)) <
          kForwardTolerance);
    // Position 0 attends only to itself: its output is its own v, and the
    // log-sum-exp of a single score is that score.
    for (std::size_t j = 0; j < s.head_dim; ++j) {
        CHECK(out[j] == doctest::Approx(qkv[2 * s.head_dim + j]).epsilon(1e-6));
    }
    double score00 = 0.0;
    for (std::size_t j = 0; j < s.head_dim; ++j)
        score00 += qkv[j] * qkv[s.head_dim + j];
    CHECK(lse[0] == doctest::Approx(score00 / 2.0).epsilon(1e-5));

    std::vector<float> d_qkv(qkv.size(), std::nanf(""));
    attention_backward(s, qkvf.data(), out.data(), lse.data(), d_outf.data(), d_qkv.data(),
                       scratch.data());
    CHECK(relative_error(d_qkv, numeric_gradient(qkv, [&](const Vec& v) {
                             return dot(d_out,
                                        ref_attention(v, s.seq, s.batch, s.heads, s.head_dim));
                         })) < kGradientTolerance);
}

TEST_CASE("attention never looks at future tokens or at other sequences of the batch") {
    std::mt19937 rng(8);
    const AttentionShape s{.seq = 6, .batch = 2, .heads = 2, .head_dim = 4};
    const std::size_t row = 3 * s.hidden();
    const std::vector<float> qkv = to_f32(random_vec(rng, s.tokens() * row));
    std::vector<float> out(s.tokens() * s.hidden());
    std::vector<float> lse(s.lse_elements());
    std::vector<float> scratch(attention_scratch_bytes(s) / sizeof(float));
    attention_forward(s, qkv.data(), out.data(), lse.data(), scratch.data());

    // Rewrite q, k and v of position 4 of sequence 1 (token 4·batch + 1).
    const std::size_t changed_pos = 4;
    const std::size_t changed_seq = 1;
    std::vector<float> altered = qkv;
    for (std::size_t c = 0; c < row; ++c)
        altered[(changed_pos * s.batch + changed_seq) * row + c] += 5.0f;
    std::vector<float> out2(out.size());
    attention_forward(s, altered.data(), out2.data(), lse.data(), scratch.data());
    for (std::size_t pos = 0; pos < s.seq; ++pos) {
        for (std::size_t b = 0; b < s.batch; ++b) {
            const std::size_t t = pos * s.batch + b;
            const bool may_change = b == changed_seq && pos >= changed_pos;
            bool same = true;
            for (std::size_t c = 0; c < s.hidden(); ++c)
                same &= out[t * s.hidden() + c] == out2[t * s.hidden() + c];
            CAPTURE(pos);
            CAPTURE(b);
            CHECK(same != may_change);
        }
    }
}

TEST_CASE("layer forward matches the double reference composition") {
    std::mt19937 rng(9);
    const RefParams p = random_params(rng, kTiny);
    const Vec x = random_vec(rng, kTiny.tokens() * kTiny.hidden);
    FloatParams fp = to_float_params(p);
    LayerBuffers<float> buf(kTiny);
    const std::vector<float> xf = to_f32(x);
    std::vector<float> y(xf.size());
    layer_forward(kTiny, fp.weight_ptrs(), xf.data(), y.data(), buf.saved, buf.forward_ws.data());
    CHECK(relative_error(y, ref_layer(kTiny, p.tensors, x)) < kForwardTolerance);
}

TEST_CASE("layer backward matches finite differences for the input and all 12 parameters") {
    std::mt19937 rng(10);
    const RefParams p = random_params(rng, kTiny);
    const Vec x = random_vec(rng, kTiny.tokens() * kTiny.hidden);
    const Vec dy = random_vec(rng, x.size());
    FloatParams fp = to_float_params(p);
    LayerBuffers<float> buf(kTiny);
    const std::vector<float> xf = to_f32(x);
    std::vector<float> y(xf.size());
    layer_forward(kTiny, fp.weight_ptrs(), xf.data(), y.data(), buf.saved, buf.forward_ws.data());
    std::vector<float> dx = to_f32(dy);  // dx aliases dy
    layer_backward(kTiny, fp.weight_ptrs(), xf.data(), buf.saved, dx.data(), dx.data(),
                   fp.grad_ptrs(), buf.backward_ws.data());

    CHECK(relative_error(dx, numeric_gradient(x, [&](const Vec& v) {
                             return dot(dy, ref_layer(kTiny, p.tensors, v));
                         })) < kGradientTolerance);
    for (std::size_t i = 0; i < kLayerParamCount; ++i) {
        CAPTURE(i);
        std::vector<Vec> params = p.tensors;
        const Vec expected = numeric_gradient(p.tensors[i], [&](const Vec& v) {
            params[i] = v;
            return dot(dy, ref_layer(kTiny, params, x));
        });
        CHECK(relative_error(fp.grads[i], expected) < kGradientTolerance);
    }
}

TEST_CASE("a layer with bf16 activations stays within bf16 rounding of the fp32 layer") {
    std::mt19937 rng(11);
    const RefParams p = random_params(rng, kTiny);
    const Vec x = random_vec(rng, kTiny.tokens() * kTiny.hidden);
    FloatParams fp = to_float_params(p);
    const std::vector<float> xf = to_f32(x);
    std::vector<Bf16> xb(xf.size());
    to_bf16(xf, xb);
    std::vector<float> x_rounded(xf.size());
    to_float(xb, x_rounded);

    LayerBuffers<float> f32(kTiny);
    std::vector<float> y32(xf.size());
    layer_forward(kTiny, fp.weight_ptrs(), x_rounded.data(), y32.data(), f32.saved,
                  f32.forward_ws.data());
    LayerBuffers<Bf16> b16(kTiny);
    std::vector<Bf16> yb(xf.size());
    layer_forward(kTiny, fp.weight_ptrs(), xb.data(), yb.data(), b16.saved, b16.forward_ws.data());
    std::vector<float> y16(xf.size());
    to_float(yb, y16);
    CHECK(relative_error(y16, to_f64(y32)) < 2e-2);

    const std::vector<float> dyf = to_f32(random_vec(rng, xf.size()));
    std::vector<Bf16> dyb(xf.size());
    to_bf16(dyf, dyb);
    std::vector<float> dy_rounded(xf.size());
    to_float(dyb, dy_rounded);
    std::vector<float> dx32(xf.size());
    layer_backward(kTiny, fp.weight_ptrs(), x_rounded.data(), f32.saved, dy_rounded.data(),
                   dx32.data(), fp.grad_ptrs(), f32.backward_ws.data());
    const auto grads32 = fp.grads;
    std::vector<Bf16> dxb(xf.size());
    layer_backward(kTiny, fp.weight_ptrs(), xb.data(), b16.saved, dyb.data(), dxb.data(),
                   fp.grad_ptrs(), b16.backward_ws.data());
    std::vector<float> dx16(xf.size());
    to_float(dxb, dx16);
    CHECK(relative_error(dx16, to_f64(dx32)) < 5e-2);
    for (std::size_t i = 0; i < kLayerParamCount; ++i) {
        CHECK(relative_error(fp.grads[i], to_f64(grads32[i])) < 5e-2);
    }
}

TEST_CASE("the reference model saves 16·T·H + 4·T·F bf16 bytes plus small tensors, 516 KiB") {
    const LayerConfig ref{.hidden = 256, .heads = 8, .ffn = 1024, .seq = 32, .batch = 2};
    // 16·T·H + 4·T·F bytes: ln1_out, qkv (3), attn_out, residual1, ln2_out
    // and the layer output (held by the next layer as its input) are 8·T·H
    // bf16 values; fc1_out and gelu_out are 2·T·F. The small tensors are the
    // fp32 LayerNorm statistics and softmax log-sum-exp.
    const std::size_t t = ref.tokens();
    std::size_t act_bytes = t * ref.hidden * sizeof(Bf16);  // the layer output
    std::size_t small_bytes = 0;
    std::size_t rounded_bytes = act_bytes;
    for (const SavedSpec& s : layer_saved_specs(ref)) {
        act_bytes += s.act_elements * sizeof(Bf16);
        small_bytes += s.fp32_elements * sizeof(float);
        rounded_bytes += (s.bytes(sizeof(Bf16)) + 511) / 512 * 512;
    }
    CHECK(act_bytes == 16 * t * ref.hidden + 4 * t * ref.ffn);
    CHECK(act_bytes == 512 * 1024);
    CHECK(small_bytes == 4 * t * sizeof(float) + 2 * 8 * 32 * sizeof(float));
    CHECK(rounded_bytes == 516 * 1024);
}

TEST_CASE("adam takes the hand-computed steps and writes bf16 model weights") {
    AdamConfig config;
    config.lr = 0.1f;
    std::vector<float> master{1.0f};
    std::vector<float> m{0.0f};
    std::vector<float> v{0.0f};
    std::vector<Bf16> model(1);
    // Step 1, g = 0.5: m = 0.05, v = 0.00025, m̂ = 0.5, v̂ = 0.25,
    // p = 1 − 0.1 · 0.5 / (0.5 + 1e-8).
    const std::vector<float> g1{0.5f};
    adam_step(config, 1, master, g1, m, v, model);
    CHECK(m[0] == doctest::Approx(0.05).epsilon(1e-6));
    CHECK(v[0] == doctest::Approx(0.00025).epsilon(1e-6));
    CHECK(master[0] == doctest::Approx(0.9).epsilon(1e-6));
    CHECK(model[0].bits == to_bf16(master[0]).bits);
    // Step 2, g = −0.25: m = 0.02, v = 0.00031225, m̂ = 0.02 / 0.19,
    // v̂ = 0.00031225 / 0.001999, p = 0.9 − 0.1 · m̂ / (√v̂ + 1e-8).
    const std::vector<float> g2{-0.25f};
    adam_step(config, 2, master, g2, m, v, model);
    CHECK(m[0] == doctest::Approx(0.02).epsilon(1e-5));
    CHECK(v[0] == doctest::Approx(0.00031225).epsilon(1e-5));
    CHECK(master[0] == doctest::Approx(0.8733662987).epsilon(1e-6));

    // Decoupled weight decay acts even with a zero gradient, and an empty
    // model span skips the bf16 write-back.
    config.weight_decay = 0.01f;
    std::vector<float> p2{2.0f};
    std::vector<float> m2{0.0f};
    std::vector<float> v2{0.0f};
    const std::vector<float> zero{0.0f};
    adam_step(config, 1, p2, zero, m2, v2, {});
    CHECK(p2[0] == doctest::Approx(2.0 - 0.1 * 0.01 * 2.0).epsilon(1e-7));
}

TEST_CASE("training a small bf16 model with MSE and Adam lowers the loss over 20 steps") {
    const LayerConfig c{.hidden = 32, .heads = 4, .ffn = 64, .seq = 8, .batch = 2};
    constexpr std::size_t kLayers = 3;
    std::mt19937 rng(12);
    const std::size_t th = c.tokens() * c.hidden;
    const auto shapes = param_shapes(c);

    // Per layer: fp32 master weights and moments (the optimizer's), bf16 model
    // weights, and the fp32 compute copy the kernels read.
    struct Layer {
        FloatParams compute;
        std::array<std::vector<float>, kLayerParamCount> master, exp_avg, exp_avg_sq;
        std::array<std::vector<Bf16>, kLayerParamCount> model;
        LayerBuffers<Bf16> buffers;
        explicit Layer(const LayerConfig& cfg) : buffers(cfg) {}
    };
    std::vector<Layer> layers;
    for (std::size_t l = 0; l < kLayers; ++l) {
        Layer& layer = layers.emplace_back(c);
        layer.compute = to_float_params(random_params(rng, c));
        for (std::size_t i = 0; i < kLayerParamCount; ++i) {
            layer.master[i] = layer.compute.weights[i];
            const std::size_t n = shapes[i][0] * shapes[i][1];
            layer.exp_avg[i].assign(n, 0.0f);
            layer.exp_avg_sq[i].assign(n, 0.0f);
            layer.model[i].resize(n);
            to_bf16(layer.master[i], layer.model[i]);
        }
    }
    std::vector<Bf16> input(th);
    to_bf16(to_f32(random_vec(rng, th)), input);
    const std::vector<float> target = to_f32(random_vec(rng, th));
    std::vector<std::vector<Bf16>> acts(kLayers + 1, std::vector<Bf16>(th));
    acts[0] = input;
    std::vector<float> y(th);
    std::vector<float> dy(th);
    std::vector<Bf16> grad(th);

    AdamConfig adam;
    adam.lr = 3e-3f;
    std::vector<float> losses;
    for (std::int64_t step = 1; step <= 20; ++step) {
        for (std::size_t l = 0; l < kLayers; ++l) {
            for (std::size_t i = 0; i < kLayerParamCount; ++i) {
                to_float(layers[l].model[i], layers[l].compute.weights[i]);
            }
            layer_forward(c, layers[l].compute.weight_ptrs(), acts[l].data(), acts[l + 1].data(),
                          layers[l].buffers.saved, layers[l].buffers.forward_ws.data());
        }
        to_float(acts[kLayers], y);
        losses.push_back(mse_loss_forward(th, y.data(), target.data()));
        mse_loss_backward(th, y.data(), target.data(), 1.0f, dy.data());
        to_bf16(dy, grad);
        for (std::size_t l = kLayers; l-- > 0;) {
            Layer& layer = layers[l];
            layer_backward(c, layer.compute.weight_ptrs(), acts[l].data(), layer.buffers.saved,
                           grad.data(), grad.data(), layer.compute.grad_ptrs(),
                           layer.buffers.backward_ws.data());
            for (std::size_t i = 0; i < kLayerParamCount; ++i) {
                adam_step(adam, step, layer.master[i], layer.compute.grads[i], layer.exp_avg[i],
                          layer.exp_avg_sq[i], layer.model[i]);
            }
        }
    }
    MESSAGE("loss: step 1 " << losses.front() << ", step 20 " << losses.back());
    CHECK(losses.back() < 0.5f * losses.front());
    std::size_t rises = 0;
    for (std::size_t i = 1; i < losses.size(); ++i)
        rises += losses[i] > losses[i - 1];
    CHECK(rises <= 2);
}
