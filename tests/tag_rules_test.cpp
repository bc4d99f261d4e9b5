// allocscope/sdk/tag_rules.h: the rules on tag names that the analysis and
// HTML report (core/), the NVTX tag mapping (interposer/nvtx_names.cpp) and
// the plugins share; one home, so they cannot drift apart again.
#include <allocscope/sdk/tag_rules.h>

#include <doctest/doctest.h>

#include <string_view>

using namespace allocscope;

TEST_CASE("the base phase is the text up to the first slash") {
    CHECK(base_phase("forward") == "forward");
    CHECK(base_phase("forward/quantize") == "forward");
    CHECK(base_phase("backward/recompute/fc1") == "backward");
    CHECK(base_phase("") == "");
    CHECK(base_phase("/odd") == "");
    // Only '/' separates a sub-phase: dots and colons are part of the name.
    CHECK(base_phase("forward.recompute") == "forward.recompute");
    CHECK(base_phase("backward:fc1") == "backward:fc1");
}

TEST_CASE("a phase is within its base and its base's sub-phases are within it") {
    CHECK(phase_within("forward", "forward"));
    CHECK(phase_within("forward/quantize", "forward"));
    CHECK_FALSE(phase_within("forward2", "forward"));
    CHECK_FALSE(phase_within("forward", "forward/quantize"));
    CHECK_FALSE(phase_within("backward", "forward"));
}

TEST_CASE("a layer is within a scope when it is the scope or one of its sub-modules") {
    CHECK(layer_within("layers.3", "layers.3"));
    CHECK(layer_within("layers.3.mlp.fc1", "layers.3"));
    CHECK_FALSE(layer_within("layers.30", "layers.3"));
    CHECK_FALSE(layer_within("layers", "layers.3"));
    // The empty scope holds only the untagged layer (the interposer's own
    // check, interposer/tag_stack.cpp, treats "" as enclosing everything first).
    CHECK(layer_within("", ""));
    CHECK_FALSE(layer_within("layers.3", ""));
}

TEST_CASE("module paths: numbered layer, parent and the innermost common module") {
    CHECK(numbered_layer("model.layers.3.mlp.fc1") == "model.layers.3");
    CHECK(numbered_layer("layers.3") == "layers.3");
    CHECK(numbered_layer("model.embed") == "");
    CHECK(parent_module("layers.3.fc1") == "layers.3");
    CHECK(parent_module("layers") == "");
    CHECK(common_module("layers.3.mlp.fc1", "layers.3.attn") == "layers.3");
    CHECK(common_module("layers.3.fc1", "layers.30.fc1") == "layers");
    CHECK(common_module("encoder.fc1", "decoder.fc1") == "");
    CHECK(common_module("layers.3", "layers.3.fc1") == "layers.3");
}

TEST_CASE("the plugin SDK's namespace names the same rules") {
    CHECK(allocscope::plugins::base_phase("backward/recompute") == "backward");
    CHECK(allocscope::plugins::layer_within("layers.3.fc1", "layers.3"));
}
