#include "fp8/amax_history.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace allocscope::harness::fp8 {

AmaxHistory::AmaxHistory(std::size_t length) : slots_(length, 0.0f) {
    if (length == 0) throw std::invalid_argument("amax history length must be at least 1");
}

void AmaxHistory::record(float amax) {
    float& slot = slots_[current_];
    // A NaN amax poisons the slot as it would TE's history, so update() keeps
    // the old scale instead of silently dropping the observation.
    if (std::isnan(amax) || std::isnan(slot)) {
        slot = std::numeric_limits<float>::quiet_NaN();
    } else {
        slot = std::max(slot, amax);
    }
}

float AmaxHistory::window_amax() const {
    float amax = 0.0f;
    for (float a : slots_) {
        if (std::isnan(a)) return a;
        amax = std::max(amax, a);
    }
    return amax;
}

float AmaxHistory::update(float fp8_max) {
    const float amax = window_amax();
    if (amax > 0.0f && std::isfinite(amax)) {
        const float scale = fp8_max / amax;
        scale_ = std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
    }
    current_ = (current_ + 1) % slots_.size();
    slots_[current_] = 0.0f;
    return scale_;
}

}  // namespace allocscope::harness::fp8
