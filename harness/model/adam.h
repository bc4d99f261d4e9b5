// Adam on fp32 master weights, the update of TE's FusedAdam with
// master_weights=True: the optimizer owns fp32 copies of the (sharded)
// parameters and their two moments, and writes the bf16 model parameters
// back after each step. Weight decay is decoupled (AdamW), FusedAdam's
// default adam_w_mode; with the default weight_decay = 0 both modes agree.
#pragma once

#include <cstdint>
#include <span>

#include "model/bf16.h"

namespace allocscope::harness::model {

struct AdamConfig {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
};

// One step for one tensor (or shard). step counts from 1 and drives the bias
// corrections 1 − β₁^step and 1 − β₂^step:
//   m ← β₁·m + (1−β₁)·g            v ← β₂·v + (1−β₂)·g²
//   p ← p − lr · ( (m / (1−β₁^step)) / (√(v / (1−β₂^step)) + eps) + wd·p )
// master, exp_avg, exp_avg_sq and grad have equal sizes; model_bf16 is either
// empty or that size too, and then receives round-to-nearest-even of master.
void adam_step(const AdamConfig& config, std::int64_t step, std::span<float> master,
               std::span<const float> grad, std::span<float> exp_avg, std::span<float> exp_avg_sq,
               std::span<Bf16> model_bf16);

}  // namespace allocscope::harness::model
