// DelayedScaling's per-tensor state: a window of recent amaxes and the scale
// derived from it, with TE's defaults (history length 1024, "max" algorithm,
// margin 0). Mirrors TE's pytorch/quantization.py: quantization during a step
// uses the scale computed at the end of the previous step; the step's own
// amaxes (max-accumulated into slot 0) only affect later steps.
#pragma once

#include <cstddef>
#include <vector>

namespace allocscope::harness::fp8 {

class AmaxHistory {
  public:
    static constexpr std::size_t kDefaultLength = 1024;

    explicit AmaxHistory(std::size_t length = kDefaultLength);

    // The scale to quantize with now (1 before the first update).
    float scale() const { return scale_; }

    // Folds a quantized tensor's amax into the current step's slot; the
    // quantize kernel does this with an atomic max.
    void record(float amax);

    // Ends the step (TE's amax-and-scale update): scale = fp8_max / the max of
    // the last `length` step amaxes, the current one included. An amax of 0 or
    // a non-finite amax keeps the previous scale; a scale that overflows fp32
    // becomes FLT_MAX. The window then moves on and the new slot starts at 0.
    // Returns the new scale.
    float update(float fp8_max);

    // Max over the window as the next update() would see it.
    float window_amax() const;

    std::size_t length() const { return slots_.size(); }

  private:
    // slots_[current_] is the step being recorded; the others hold the
    // previous length − 1 steps (0 where no step has run yet).
    std::vector<float> slots_;
    std::size_t current_ = 0;
    float scale_ = 1.0f;
};

}  // namespace allocscope::harness::fp8
