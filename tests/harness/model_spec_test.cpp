#include <doctest/doctest.h>

#include "alloc/caching_allocator.h"
#include "trainer/model_spec.h"

using namespace allocscope::harness::trainer;

TEST_CASE("the reference layer has twelve parameters of 786,432 GEMM weight elements") {
    ModelShape shape;
    auto params = layer_params(shape);
    CHECK(params.size() == 12);
    int64_t gemm = 0;
    for (const ParamSpec& p : params) {
        if (p.role == ParamRole::gemm_weight) gemm += p.numel();
    }
    CHECK(gemm == 786432);
}

TEST_CASE("bf16 parameter bytes per layer match the reference test's derived sizes") {
    // TE-FSDP2-FP8-MEMORY.md: unsharded 1,579,520 B (12 tensors), shard per
    // rank 791,552 B with every allocation rounded up to 512 B.
    LayerBytes b = layer_bytes(ModelShape{}, 2, 2);
    CHECK(b.unsharded == 1579520);
    CHECK(b.shard == 791552);
    CHECK(b.all_gather == 1579520);
}

TEST_CASE("dim 0 is padded to a multiple of the world size before sharding") {
    ParamSpec p{"attn.qkv", "bias", 7, 1, ParamRole::bias};
    CHECK(p.shard_rows(2) == 4);
    CHECK(p.shard_rows(4) == 2);
    CHECK(p.shard_numel(3) == 3);
    LayerBytes b = layer_bytes(ModelShape{1, 256, 1024, 8, 32, 2}, 3, 2);
    // 768 rows of qkv.weight over 3 ranks: 256 each, no padding.
    CHECK(b.all_gather % 3 == 0);
}

TEST_CASE("blocks are rounded like PyTorch's caching allocator") {
    CHECK(allocscope::harness::alloc::round_size(0) == 512);
    CHECK(allocscope::harness::alloc::round_size(1) == 512);
    CHECK(allocscope::harness::alloc::round_size(512) == 512);
    CHECK(allocscope::harness::alloc::round_size(513) == 1024);
}
