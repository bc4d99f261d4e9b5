// Sizes the harness's FP8 weights take, for the suites that check the
// detectors' and the diff's numbers against them (harness/fp8/layout.h).
#pragma once

#include <cstdint>
#include <vector>

#include "fp8/layout.h"

namespace allocscope::test {

// The buffers of the seed-era forward copy of one layer's four GEMM weights
// (the reference model: hidden 256, ffn 1024, fused QKV).
inline uint64_t forward_copy_bytes(harness::fp8::Recipe recipe, harness::fp8::Arch arch) {
    namespace fp8 = harness::fp8;
    const std::vector<fp8::Shape> weights = {{768, 256}, {256, 256}, {1024, 256}, {256, 1024}};
    uint64_t total = 0;
    for (const fp8::Shape& s : weights) {
        fp8::QuantSpec spec;
        spec.recipe = recipe;
        spec.role = fp8::TensorRole::weight;
        spec.arch = arch;
        total += fp8::allocated_bytes(fp8::layout(s, spec));
    }
    return total;
}

}  // namespace allocscope::test
