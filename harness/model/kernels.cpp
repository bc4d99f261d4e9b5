#include "model/kernels.h"

#include <cmath>

#include "model/gemm.h"

namespace allocscope::harness::model {

void layernorm_forward(std::size_t rows, std::size_t cols, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd, float eps) {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (std::size_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float sum = 0.0f;
        for (std::size_t c = 0; c < cols; ++c)
            sum += xr[c];
        const float mu = sum * inv_cols;
        // Two passes: the variance of centred values does not cancel
        // catastrophically when |mean| ≫ std.
        float sq = 0.0f;
        for (std::size_t c = 0; c < cols; ++c) {
            const float d = xr[c] - mu;
            sq += d * d;
        }
        const float rs = 1.0f / std::sqrt(sq * inv_cols + eps);
        mean[r] = mu;
        rstd[r] = rs;
        float* yr = y + r * cols;
        for (std::size_t c = 0; c < cols; ++c)
            yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
    }
}

void layernorm_backward(std::size_t rows, std::size_t cols, const float* dy, const float* x,
                        const float* gamma, const float* mean, const float* rstd, float* dx,
                        float* dgamma, float* dbeta) {
    for (std::size_t c = 0; c < cols; ++c) {
        dgamma[c] = 0.0f;
        dbeta[c] = 0.0f;
    }
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (std::size_t r = 0; r < rows; ++r) {
        const float* dyr = dy + r * cols;
        const float* xr = x + r * cols;
        const float mu = mean[r];
        const float rs = rstd[r];
        // With g = dy · gamma and x̂ = (x − mean) · rstd:
        //   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)).
        float sum_g = 0.0f;
        float sum_gx = 0.0f;
        for (std::size_t c = 0; c < cols; ++c) {
            const float xhat = (xr[c] - mu) * rs;
            const float g = dyr[c] * gamma[c];
            sum_g += g;
            sum_gx += g * xhat;
            dgamma[c] += dyr[c] * xhat;
            dbeta[c] += dyr[c];
        }
        const float mean_g = sum_g * inv_cols;
        const float mean_gx = sum_gx * inv_cols;
        float* dxr = dx + r * cols;
        for (std::size_t c = 0; c < cols; ++c) {
            const float xhat = (xr[c] - mu) * rs;
            dxr[c] = rs * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
        }
    }
}

void linear_forward(const LinearShape& shape, const float* x, const float* weight,
                    const float* bias, float* y) {
    float beta = 0.0f;
    if (bias != nullptr) {
        for (std::size_t r = 0; r < shape.rows; ++r) {
            for (std::size_t o = 0; o < shape.out; ++o)
                y[r * shape.out + o] = bias[o];
        }
        beta = 1.0f;
    }
    gemm(shape.rows, shape.out, shape.in, 1.0f, {x, shape.in}, {weight, shape.in, Trans::kYes},
         beta, y, shape.out);
}

void linear_dgrad(const LinearShape& shape, const float* dy, const float* weight, float* dx) {
    gemm(shape.rows, shape.in, shape.out, 1.0f, {dy, shape.out}, {weight, shape.in}, 0.0f, dx,
         shape.in);
}

void linear_wgrad(const LinearShape& shape, const float* dy, const float* x, float* dweight,
                  float* dbias) {
    gemm(shape.out, shape.in, shape.rows, 1.0f, {dy, shape.out, Trans::kYes}, {x, shape.in}, 0.0f,
         dweight, shape.in);
    if (dbias == nullptr) return;
    for (std::size_t o = 0; o < shape.out; ++o)
        dbias[o] = 0.0f;
    for (std::size_t r = 0; r < shape.rows; ++r) {
        for (std::size_t o = 0; o < shape.out; ++o)
            dbias[o] += dy[r * shape.out + o];
    }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

float gelu(float x) {
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

float gelu_derivative(float x) {
    const float t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
}

void gelu_forward(std::size_t n, const float* x, float* y) {
    for (std::size_t i = 0; i < n; ++i)
        y[i] = gelu(x[i]);
}

void gelu_backward(std::size_t n, const float* x, const float* dy, float* dx) {
    for (std::size_t i = 0; i < n; ++i)
        dx[i] = dy[i] * gelu_derivative(x[i]);
}

void residual_add(std::size_t n, const float* a, const float* b, float* out) {
    for (std::size_t i = 0; i < n; ++i)
        out[i] = a[i] + b[i];
}

void accumulate(std::size_t n, const float* src, float* dst) {
    for (std::size_t i = 0; i < n; ++i)
        dst[i] += src[i];
}

float mse_loss_forward(std::size_t n, const float* y, const float* target) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
        sum += d * d;
    }
    return static_cast<float>(sum / static_cast<double>(n));
}

void mse_loss_backward(std::size_t n, const float* y, const float* target, float d_loss,
                       float* dy) {
    const float scale = d_loss * 2.0f / static_cast<float>(n);
    for (std::size_t i = 0; i < n; ++i)
        dy[i] = scale * (y[i] - target[i]);
}

}  // namespace allocscope::harness::model
