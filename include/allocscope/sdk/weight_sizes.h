// Plugin SDK: the byte counts of what a quantized (or copied) weight
// allocates (weight_derived_sizes), per TransformerEngine's recipes.
#pragma once

#include <allocscope/sdk/size_set.h>

#include <cstdint>
#include <vector>

namespace allocscope::plugins {

// Which forms of a weight count as derived from it.
struct WeightSizeRules {
    // A bf16 copy (2·numel bytes). Off where an allocation of that size is
    // as likely to be the weight's gradient (backward).
    bool bf16_copy = true;
    // Shard-sized forms too (a column-wise form built per shard: numel/world
    // bytes and its scales divided by the world size), for the shard count
    // numel / sharded_numel and for `world`.
    bool sharded = false;
    // The host's world size (0: unknown).
    uint64_t world = 0;
    // Parameters' gradients are made where the forms are (backward): a
    // scale-sized allocation that is a registered parameter's gradient size
    // is taken for the gradient (WeightParams::match).
    bool gradients = false;
};

// The byte counts of what a quantized (or copied) weight of `numel` elements
// allocates, per TransformerEngine's quantizers (harness/fp8/layout.h):
//   data   FP8 E4M3/E5M2 data or transpose, MXFP8 row-/column-wise data,
//          Float8BlockScaling data: numel; NVFP4 data: numel/2 (two E2M1 per
//          byte); a bf16 copy: 2·numel (rules.bf16_copy).
//   scales per-tensor scale_inv and NVFP4 amax (4 B); MXFP8 E8M0 scales
//          [round_up(R,128) × round_up(C/32,4)] and [round_up(R/32,4) ×
//          round_up(C,128)]; NVFP4 E4M3 scales [round_up(R,128) ×
//          round_up(C/16,4)] and the transposed form; Float8BlockScaling fp32
//          scales, 2-D 128×128 blocks (weights) and 1-D 1×128 blocks.
// A parameter event has no shape, so the scales are those of every shape
// R × C = numel with R, C >= 16 that the recipe accepts (numels of real
// weights have few divisors; above 2^44 elements only the 4-byte scales are
// listed).
struct WeightSizes {
    SizeSet data;
    SizeSet scales;
};

inline WeightSizes weight_derived_sizes(uint64_t numel, uint64_t sharded_numel,
                                        const WeightSizeRules& rules) {
    auto ceil_div = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
    auto round_up = [&](uint64_t a, uint64_t b) { return ceil_div(a, b) * b; };
    // Shard counts: the registered shard's (HSDP shards over a subgroup) and
    // the host's world size.
    std::vector<uint64_t> shards;
    if (rules.sharded) {
        if (sharded_numel > 0 && sharded_numel < numel)
            shards.push_back(ceil_div(numel, sharded_numel));
        if (rules.world > 1) shards.push_back(rules.world);
    }

    WeightSizes out;
    out.data.add(numel);
    out.data.add(ceil_div(numel, 2));
    if (rules.bf16_copy) out.data.add(2 * numel);
    for (uint64_t w : shards) {
        out.data.add(ceil_div(numel, w));
        out.data.add(ceil_div(ceil_div(numel, 2), w));
    }
    if (!shards.empty() && sharded_numel > 0 && sharded_numel < numel) {
        out.data.add(sharded_numel);
        out.data.add(ceil_div(sharded_numel, 2));
    }

    auto scale = [&](uint64_t bytes) {
        out.scales.add(bytes);
        for (uint64_t w : shards)
            out.scales.add(ceil_div(bytes, w));
    };
    scale(4);
    auto shape = [&](uint64_t r, uint64_t c) {
        // FP8 GEMMs want both dimensions to be multiples of 16; degenerate
        // shapes ([n/2 × 2]) would give 1-D block scales the size of a bf16
        // gradient (2·numel).
        if (r < 16 || c < 16) return;
        if (r % 32 == 0 && c % 32 == 0) {  // MXFP8, 1×32 / 32×1 blocks, E8M0
            scale(round_up(r, 128) * round_up(c / 32, 4));
            scale(round_up(r / 32, 4) * round_up(c, 128));
        }
        if (r % 16 == 0 && c % 16 == 0) {  // NVFP4, 16-element blocks, E4M3
            scale(round_up(r, 128) * round_up(c / 16, 4));
            scale(round_up(c, 128) * round_up(r / 16, 4));
        }
        // Float8BlockScaling, fp32: 2-D weight blocks, then 1-D blocks.
        scale(ceil_div(r, 128) * round_up(ceil_div(c, 128), 4) * 4);
        scale(ceil_div(c, 128) * round_up(ceil_div(r, 128), 4) * 4);
        scale(ceil_div(c, 128) * round_up(r, 4) * 4);
        scale(ceil_div(r, 128) * round_up(c, 4) * 4);
    };
    if (numel > 0 && numel <= (uint64_t{1} << 44)) {
        for (uint64_t d = 1; d * d <= numel; ++d) {
            if (numel % d != 0) continue;
            shape(d, numel / d);
            shape(numel / d, d);
        }
    }
    out.data.seal();
    out.scales.seal();
    return out;
}

}  // namespace allocscope::plugins
