// The reference model's parameters and their FSDP2 sharding, as sizes only:
// what the trainer allocates, registers with allocscope and all-gathers.
//
// Per layer (TransformerEngine TransformerLayer, fused QKV, bias, LayerNorm):
//   ln1.weight [H], ln1.bias [H], attn.qkv.weight [3H x H], attn.qkv.bias [3H],
//   attn.proj.weight [H x H], attn.proj.bias [H], ln2.weight [H], ln2.bias [H],
//   mlp.fc1.weight [F x H], mlp.fc1.bias [F], mlp.fc2.weight [H x F],
//   mlp.fc2.bias [H]
// FSDP2 shards every parameter on dim 0 (Shard(0)), padding dim 0 up to a
// multiple of the world size; each rank holds ceil(rows / world) rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace allocscope::harness::trainer {

struct ModelShape {
    int layers = 8;
    int hidden = 256;
    int ffn = 1024;
    int heads = 8;
    int seq = 32;
    int batch = 2;
    int tokens() const noexcept { return seq * batch; }
};

// Which GEMM a weight feeds: the quantized forms are built for these only.
enum class ParamRole { gemm_weight, bias, norm };

struct ParamSpec {
    std::string module;  // "attn.qkv", relative to the layer
    std::string name;    // "weight"
    int64_t rows = 0;    // dim 0 (1-D parameters: their length)
    int64_t cols = 1;    // product of the remaining dims
    ParamRole role = ParamRole::bias;

    int64_t numel() const noexcept { return rows * cols; }
    // Rows per rank after padding dim 0 to a multiple of `world`.
    int64_t shard_rows(int world) const noexcept { return (rows + world - 1) / world; }
    int64_t shard_numel(int world) const noexcept { return shard_rows(world) * cols; }
};

// The twelve parameters of one layer, in registration (and all-gather) order.
std::vector<ParamSpec> layer_params(const ModelShape& shape);

struct LayerBytes {
    uint64_t unsharded = 0;   // sum of alloc::round_size(numel * elem) over params
    uint64_t shard = 0;       // sum of alloc::round_size(shard_numel * elem) on one rank
    uint64_t all_gather = 0;  // the flat all-gather buffer: world * sum(shard_numel) * elem
};

// Byte totals of one layer's parameters stored with `elem_bytes` per element.
LayerBytes layer_bytes(const ModelShape& shape, int world, uint64_t elem_bytes);

}  // namespace allocscope::harness::trainer
