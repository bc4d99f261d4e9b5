// Forward and backward kernels of the reference transformer layer, fp32 on
// caller-owned buffers. Every matrix is row-major with one row per token:
// element (t, c) of a [tokens × cols] tensor is at [t * cols + c]. No kernel
// allocates; outputs are overwritten (never accumulated) unless stated.
#pragma once

#include <cstddef>

namespace allocscope::harness::model {

// ---- LayerNorm over the last (hidden) dimension -------------------------
//   y = (x − mean) · rstd · gamma + beta,  rstd = 1 / sqrt(var + eps),
//   var the biased variance over the row (PyTorch / TE LayerNorm).
inline constexpr float kLayerNormEps = 1e-5f;

// x, y: [rows × cols]; gamma, beta: [cols]; mean, rstd: [rows] fp32, saved
// for the backward pass (TE saves the same two fp32 vectors, "mu" and
// "rsigma").
void layernorm_forward(std::size_t rows, std::size_t cols, const float* x, const float* gamma,
                       const float* beta, float* y, float* mean, float* rstd,
                       float eps = kLayerNormEps);

// dy, x, dx: [rows × cols]; gamma, dgamma, dbeta: [cols]; mean, rstd from the
// forward. dx may alias dy.
void layernorm_backward(std::size_t rows, std::size_t cols, const float* dy, const float* x,
                        const float* gamma, const float* mean, const float* rstd, float* dx,
                        float* dgamma, float* dbeta);

// ---- Linear: y = x · Wᵀ + b ----------------------------------------------
// W is stored [out × in] like torch.nn.Linear and TE's Linear.
struct LinearShape {
    std::size_t rows;  // tokens
    std::size_t in;
    std::size_t out;
};

// x: [rows × in], weight: [out × in], bias: [out] or nullptr, y: [rows × out].
void linear_forward(const LinearShape& shape, const float* x, const float* weight,
                    const float* bias, float* y);
// dgrad: dx[rows × in] = dy[rows × out] · W.
void linear_dgrad(const LinearShape& shape, const float* dy, const float* weight, float* dx);
// wgrad: dweight[out × in] = dyᵀ · x; dbias[out] = column sums of dy (skipped
// when nullptr).
void linear_wgrad(const LinearShape& shape, const float* dy, const float* x, float* dweight,
                  float* dbias);

// ---- GELU, tanh approximation ---------------------------------------------
// gelu(x) = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))), the form TE's
// "gelu" activation computes (transformer_engine/common/util/math.h).
float gelu(float x);
// d gelu / dx, the same closed form as TE's dgelu.
float gelu_derivative(float x);

void gelu_forward(std::size_t n, const float* x, float* y);
// dx = dy · gelu'(x); dx may alias dy.
void gelu_backward(std::size_t n, const float* x, const float* dy, float* dx);

// ---- Residual connection --------------------------------------------------
// out = a + b; out may alias a or b. The backward of a residual add passes
// the incoming gradient unchanged to both branches; where the branches meet
// again the two gradients are summed with accumulate.
void residual_add(std::size_t n, const float* a, const float* b, float* out);
// dst += src.
void accumulate(std::size_t n, const float* src, float* dst);

// ---- MSE loss, mean over all n elements -----------------------------------
// Returns mean((y − target)²), summed in double so the loss of large tensors
// does not depend on summation order.
float mse_loss_forward(std::size_t n, const float* y, const float* target);
// dy = d_loss · 2 · (y − target) / n.
void mse_loss_backward(std::size_t n, const float* y, const float* target, float d_loss, float* dy);

}  // namespace allocscope::harness::model
