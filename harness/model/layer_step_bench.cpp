// Time of one forward + backward step of the reference model (8 layers,
// hidden 256, FFN 1024, 8 heads, 32 × 2 tokens per rank, bf16 activations) on
// the CPU math alone: the sim backend's compute budget. Prints the median of
// several steps.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "model/bf16.h"
#include "model/kernels.h"
#include "model/transformer_layer.h"

using namespace allocscope::harness::model;

int main() {
    constexpr std::size_t kLayers = 8;
    constexpr int kSteps = 9;
    const LayerConfig c{.hidden = 256, .heads = 8, .ffn = 1024, .seq = 32, .batch = 2};
    const std::size_t h = c.hidden;
    const std::size_t f = c.ffn;
    const std::size_t th = c.tokens() * h;
    const std::array<std::size_t, kLayerParamCount> numel{h, h, 3 * h * h, 3 * h, h * h, h,
                                                          h, h, f * h,     f,     h * f, h};

    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<std::array<std::vector<float>, kLayerParamCount>> weights(kLayers);
    std::vector<std::array<std::vector<float>, kLayerParamCount>> grads(kLayers);
    std::vector<LayerWeights> weight_ptrs(kLayers);
    std::vector<LayerGrads> grad_ptrs(kLayers);
    for (std::size_t l = 0; l < kLayers; ++l) {
        for (std::size_t i = 0; i < kLayerParamCount; ++i) {
            weights[l][i].resize(numel[i]);
            for (float& w : weights[l][i])
                w = dist(rng);
            if (i == kLn1Gamma || i == kLn2Gamma)
                std::fill(weights[l][i].begin(), weights[l][i].end(), 1.0f);
            grads[l][i].resize(numel[i]);
            weight_ptrs[l][i] = weights[l][i].data();
            grad_ptrs[l][i] = grads[l][i].data();
        }
    }
    const auto specs = layer_saved_specs(c);
    std::vector<std::array<std::vector<Bf16>, kLayerSavedCount>> act(kLayers);
    std::vector<std::array<std::vector<float>, kLayerSavedCount>> stats(kLayers);
    std::vector<LayerSaved<Bf16>> saved(kLayers);
    for (std::size_t l = 0; l < kLayers; ++l) {
        for (std::size_t i = 0; i < kLayerSavedCount; ++i) {
            act[l][i].resize(specs[i].act_elements);
            stats[l][i].resize(specs[i].fp32_elements);
        }
        auto& a = act[l];
        auto& s = stats[l];
        saved[l] = {s[0].data(), s[1].data(), a[2].data(), a[3].data(), s[4].data(),  a[5].data(),
                    a[6].data(), s[7].data(), s[8].data(), a[9].data(), a[10].data(), a[11].data()};
    }
    std::vector<float> workspace(
        std::max(layer_forward_workspace_bytes(c), layer_backward_workspace_bytes(c)) /
        sizeof(float));
    std::vector<std::vector<Bf16>> hidden(kLayers + 1, std::vector<Bf16>(th));
    std::normal_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> target(th);
    for (float& t : target)
        t = unit(rng);
    for (Bf16& x : hidden[0])
        x = to_bf16(unit(rng));
    std::vector<float> y(th);
    std::vector<float> dy(th);
    std::vector<Bf16> grad(th);

    std::vector<double> ms;
    for (int step = 0; step < kSteps; ++step) {
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t l = 0; l < kLayers; ++l) {
            layer_forward(c, weight_ptrs[l], hidden[l].data(), hidden[l + 1].data(), saved[l],
                          workspace.data());
        }
        to_float(hidden[kLayers], y);
        const float loss = mse_loss_forward(th, y.data(), target.data());
        mse_loss_backward(th, y.data(), target.data(), 1.0f, dy.data());
        to_bf16(dy, grad);
        for (std::size_t l = kLayers; l-- > 0;) {
            layer_backward(c, weight_ptrs[l], hidden[l].data(), saved[l], grad.data(), grad.data(),
                           grad_ptrs[l], workspace.data());
        }
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
        if (step == 0) std::printf("loss %.4f\n", static_cast<double>(loss));
    }
    std::sort(ms.begin(), ms.end());
    std::printf("reference model forward+backward step: median %.1f ms, min %.1f ms (%d steps)\n",
                ms[ms.size() / 2], ms.front(), kSteps);
    return 0;
}
