// include/allocscope/doctest.h as a user's suite uses it: this program is
// the user's own doctest suite, linked against a CUDA runtime (the
// simulated one), run with liballocscope.so preloaded (tests/meson.build:
// run's own plugins off, so what is found is the checks' alone). The
// "without the interposer" case runs in a second test without the preload.
#include <allocscope/allocscope_dl.h>
#include <allocscope/doctest.h>

#include "cuda_decls.h"  // cuda_api/: cuda_runtime_api.h, or its declarations

#include <cstdint>
#include <string>
#include <vector>

namespace {

using allocscope::testing::Check;
using allocscope::testing::Finding;

constexpr uint64_t kNumel = 1 << 20;  // one weight: an FP8 copy is 1 MiB

void* device_alloc(size_t bytes) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
    return p;
}

}  // namespace

// Outside the anonymous namespace, not inlined, and the program linked with
// its symbols exported (tests/meson.build): dladdr names it in a finding's
// stack, as it names any exported function.
namespace model_code {

void* layer_forward(const char* layer, bool keep_copy, bool declare = true);

// A layer's forward that makes a quantized copy of its weight, freeing it
// at the end of the layer (fixed) or keeping it (the FP8 problem 1 bug).
// `declare`: the copy's provenance is declared, as a framework that knows
// it made a weight copy does; without it only its size says what it is.
[[gnu::noinline]] void* layer_forward(const char* layer, bool keep_copy, bool declare) {
    allocscope::ScopedTag tag(layer, "forward");
    void* copy = device_alloc(kNumel);
    if (declare) allocscope_dl_derived(copy, layer, "weight", "cast to fp8_e4m3");
    void* activation = device_alloc(4096);
    cudaFree(activation);
    if (keep_copy) return copy;
    cudaFree(copy);
    return nullptr;
}

}  // namespace model_code

namespace {

using model_code::layer_forward;

const Finding* find(const std::vector<Finding>& all, const std::string& plugin,
                    const std::string& layer) {
    for (const Finding& f : all) {
        if (f.plugin == plugin && f.layer == layer) return &f;
    }
    return nullptr;
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

struct Model {
    Model() {
        for (const char* layer : {"layers.0", "layers.1"})
            allocscope_dl_register_param(layer, "weight", kNumel, "bf16", kNumel);
    }
};

const Model& model() {
    static const Model m;  // registered once, before any check
    return m;
}

}  // namespace

TEST_CASE("a forward that frees its weight copies passes the check") {
    model();
    Check check("weight-copy-accumulation");
    layer_forward("layers.0", false);
    layer_forward("layers.1", false);
    ALLOCSCOPE_CHECK_NO_FINDINGS(check);
}

TEST_CASE("copies kept past their layer's forward are found, per layer and with their bytes") {
    model();
    std::vector<void*> kept;
    Check check("weight-copy-accumulation");
    kept.push_back(layer_forward("layers.0", true));
    kept.push_back(layer_forward("layers.1", true));
    const std::vector<Finding> findings = check.end();
    CHECK(check.error().empty());
    for (const char* layer : {"layers.0", "layers.1"}) {
        const Finding* f = find(findings, "weight-copy-accumulation", layer);
        REQUIRE_MESSAGE(f, layer);
        CHECK(f->severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(f->phase == "forward");
        CHECK(f->bytes == kNumel);
        CHECK(f->count == 1);
    }
    for (void* p : kept)
        cudaFree(p);
}

TEST_CASE("a kept allocation of a weight's size without provenance does not fail the check") {
    model();
    Check check("weight-copy-accumulation");
    void* kept = layer_forward("layers.0", true, false);
    ALLOCSCOPE_CHECK_NO_FINDINGS(check);  // at most an info finding: size alone proves nothing
    cudaFree(kept);
}

TEST_CASE("the assertion fails on a kept copy and names the plugin" * doctest::should_fail()) {
    model();
    Check check("weight-copy-accumulation");
    void* kept = layer_forward("layers.0", true);
    ALLOCSCOPE_CHECK_NO_FINDINGS(check);
    cudaFree(kept);
}

TEST_CASE("the verdict lists each finding at or above the level, and only those") {
    model();
    Check check("weight-copy-accumulation,peak-owner");
    void* kept = layer_forward("layers.1", true);
    const allocscope::testing::Verdict errors =
        allocscope::testing::conclude(check, ALLOCSCOPE_SEVERITY_WARNING);
    CHECK_FALSE(errors.clean);
    CHECK(contains(errors.report, "weight-copy-accumulation [error]"));
    CHECK_FALSE(contains(errors.report, "peak-owner"));  // info only
    // Under the finding, the stack of the kept copy, from this program's
    // function that allocated it, allocscope's own frames dropped.
    const std::string under = errors.report.substr(errors.report.find("[error]"));
    const size_t stack = under.find("\n      ");
    REQUIRE(stack != std::string::npos);
    const std::string first = under.substr(stack + 7, under.find('\n', stack + 7) - stack - 7);
    INFO(errors.report);
    CHECK(
        contains(under, "model_code::layer_forward(char const*, bool, bool) (test_check_helper)"));
    CHECK_FALSE(contains(first, "allocscope"));
    cudaFree(kept);

    Check info_level("peak-owner");
    cudaFree(device_alloc(1 << 16));
    const allocscope::testing::Verdict any =
        allocscope::testing::conclude(info_level, ALLOCSCOPE_SEVERITY_INFO);
    CHECK_FALSE(any.clean);
    CHECK(contains(any.report, "peak-owner [info]"));
}

TEST_CASE("memory that grows every step inside the check is a cross-step leak") {
    std::vector<void*> leaked;
    Check check("cross-step-leak", "cross-step-leak.steps=3");
    for (uint64_t step = 100; step < 106; ++step) {
        allocscope_dl_step(step);
        allocscope::ScopedTag tag("optimizer.state", "optimizer");
        leaked.push_back(device_alloc(1 << 16));
    }
    allocscope_dl_step(106);
    const std::vector<Finding> findings = check.end();
    CHECK(check.error().empty());
    const Finding* f = find(findings, "cross-step-leak", "optimizer.state");
    REQUIRE(f);
    CHECK(f->phase == "optimizer");
    CHECK(f->bytes >= 3 * (1 << 16));
    for (void* p : leaked)
        cudaFree(p);
}

TEST_CASE("allocations made before the check and freed during it do not count") {
    model();
    void* early = layer_forward("layers.0", true);  // kept, but before the check
    Check check("weight-copy-accumulation,cross-step-leak");
    cudaFree(early);
    layer_forward("layers.1", false);
    ALLOCSCOPE_CHECK_NO_FINDINGS(check);
}

TEST_CASE("overlapping checks each see their own stretch") {
    model();
    Check outer("weight-copy-accumulation");
    void* kept = layer_forward("layers.0", true);
    std::vector<Finding> inner_findings;
    {
        Check inner("weight-copy-accumulation");
        layer_forward("layers.1", false);
        inner_findings = inner.end();
        CHECK(inner.error().empty());
    }
    CHECK(inner_findings.empty());
    const std::vector<Finding> outer_findings = outer.end();
    CHECK(find(outer_findings, "weight-copy-accumulation", "layers.0"));
    CHECK_FALSE(find(outer_findings, "weight-copy-accumulation", "layers.1"));
    cudaFree(kept);
}

TEST_CASE("a check without a plugin list runs every plugin of the plugin directory") {
    model();
    for (const char* everything : {static_cast<const char*>(nullptr), ""}) {
        Check check(everything);
        void* kept = layer_forward("layers.0", true);
        const std::vector<Finding> findings = check.end();
        CHECK(check.error().empty());
        CHECK(find(findings, "weight-copy-accumulation", "layers.0"));
        cudaFree(kept);
    }
}

TEST_CASE("a plugin that does not exist fails the check, naming it") {
    Check check("no-such-plugin");
    CHECK(contains(check.error(), "no-such-plugin"));
    const allocscope::testing::Verdict v =
        allocscope::testing::conclude(check, ALLOCSCOPE_SEVERITY_WARNING);
    CHECK_FALSE(v.clean);
    CHECK(contains(v.report, "did not run"));
}

TEST_CASE("a malformed option or one no plugin takes fails the check, naming it") {
    Check bad_value("cross-step-leak", "cross-step-leak.steps=many");
    CHECK(contains(bad_value.error(), "steps=many"));
    Check unknown_plugin("cross-step-leak", "peak-owner.top=3");
    CHECK(contains(unknown_plugin.error(), "peak-owner"));
    Check malformed("cross-step-leak", "steps");
    CHECK(contains(malformed.error(), "bad plugin option"));
    // The program goes on: a good check right after works.
    Check good("cross-step-leak");
    good.end();
    CHECK(good.error().empty());
}

TEST_CASE("ending a check twice returns nothing more and no error") {
    Check check("cross-step-leak");
    check.end();
    CHECK(check.end().empty());
    CHECK(check.error().empty());
}

TEST_CASE("without the interposer the check fails and says how to load it") {
    REQUIRE_FALSE(allocscope_dl_available());
    Check check("weight-copy-accumulation");
    CHECK(contains(check.error(), "not loaded"));
    const allocscope::testing::Verdict v =
        allocscope::testing::conclude(check, ALLOCSCOPE_SEVERITY_WARNING);
    CHECK_FALSE(v.clean);
    CHECK(contains(v.report, "LD_PRELOAD"));
}
