#include "model/adam.h"

#include <cassert>
#include <cmath>

namespace allocscope::harness::model {

void adam_step(const AdamConfig& config, std::int64_t step, std::span<float> master,
               std::span<const float> grad, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<Bf16> model_bf16) {
    assert(step >= 1);
    assert(grad.size() == master.size() && exp_avg.size() == master.size() &&
           exp_avg_sq.size() == master.size());
    assert(model_bf16.empty() || model_bf16.size() == master.size());
    // Bias corrections in double like FusedAdam's host-side Python floats;
    // the per-element math is fp32 like its kernel.
    const double s = static_cast<double>(step);
    const auto correction1 = static_cast<float>(1.0 - std::pow(double{config.beta1}, s));
    const auto correction2 = static_cast<float>(1.0 - std::pow(double{config.beta2}, s));
    for (std::size_t i = 0; i < master.size(); ++i) {
        const float g = grad[i];
        const float m = config.beta1 * exp_avg[i] + (1.0f - config.beta1) * g;
        const float v = config.beta2 * exp_avg_sq[i] + (1.0f - config.beta2) * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float denom = std::sqrt(v / correction2) + config.eps;
        const float update = (m / correction1) / denom + config.weight_decay * master[i];
        master[i] -= config.lr * update;
    }
    if (!model_bf16.empty()) to_bf16(master, model_bf16);
}

}  // namespace allocscope::harness::model
