#include "trainer/model_spec.h"

#include "alloc/caching_allocator.h"

namespace allocscope::harness::trainer {

std::vector<ParamSpec> layer_params(const ModelShape& s) {
    const int64_t h = s.hidden;
    const int64_t f = s.ffn;
    return {
        {"ln1", "weight", h, 1, ParamRole::norm},
        {"ln1", "bias", h, 1, ParamRole::norm},
        {"attn.qkv", "weight", 3 * h, h, ParamRole::gemm_weight},
        {"attn.qkv", "bias", 3 * h, 1, ParamRole::bias},
        {"attn.proj", "weight", h, h, ParamRole::gemm_weight},
        {"attn.proj", "bias", h, 1, ParamRole::bias},
        {"ln2", "weight", h, 1, ParamRole::norm},
        {"ln2", "bias", h, 1, ParamRole::norm},
        {"mlp.fc1", "weight", f, h, ParamRole::gemm_weight},
        {"mlp.fc1", "bias", f, 1, ParamRole::bias},
        {"mlp.fc2", "weight", h, f, ParamRole::gemm_weight},
        {"mlp.fc2", "bias", h, 1, ParamRole::bias},
    };
}

LayerBytes layer_bytes(const ModelShape& shape, int world, uint64_t elem_bytes) {
    LayerBytes b;
    uint64_t flat_shard_elems = 0;
    for (const ParamSpec& p : layer_params(shape)) {
        b.unsharded += alloc::round_size(static_cast<uint64_t>(p.numel()) * elem_bytes);
        b.shard += alloc::round_size(static_cast<uint64_t>(p.shard_numel(world)) * elem_bytes);
        flat_shard_elems += static_cast<uint64_t>(p.shard_numel(world));
    }
    b.all_gather = static_cast<uint64_t>(world) * flat_shard_elems * elem_bytes;
    return b;
}

}  // namespace allocscope::harness::trainer
