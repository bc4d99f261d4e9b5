#include "model/bf16.h"

#include <cassert>

namespace allocscope::harness::model {

void to_bf16(std::span<const float> in, std::span<Bf16> out) {
    assert(in.size() == out.size());
    for (std::size_t i = 0; i < in.size(); ++i)
        out[i] = to_bf16(in[i]);
}

void to_float(std::span<const Bf16> in, std::span<float> out) {
    assert(in.size() == out.size());
    for (std::size_t i = 0; i < in.size(); ++i)
        out[i] = to_float(in[i]);
}

}  // namespace allocscope::harness::model
