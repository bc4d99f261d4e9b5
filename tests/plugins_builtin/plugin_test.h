// What the built-in plugins' tests share: the plugin under test
// (ALLOCSCOPE_TEST_PLUGIN: the built .so), one drive of it over a stream (or
// a baseline and a run), its exported symbols, and the reference model's
// weights with the size arithmetic the weight-derived streams use.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "driver.h"

namespace allocscope::test {

using Options = std::map<std::string, std::string>;

inline const allocscope_plugin_v2* plugin() {
    static const allocscope_plugin_v2* p = load_plugin("ALLOCSCOPE_TEST_PLUGIN");
    return p;
}

// What the plugin produced over a stream (or a baseline and a run).
struct Outcome {
    bool enabled = true;
    std::string failed_call;
    std::vector<CollectedFinding> findings;
    std::vector<std::string> logs;
};

// One run on rank `rank` of `world`; with `baseline`, in baseline mode.
inline Outcome drive_plugin(const Stream* baseline, const Stream& s, const Options& options,
                            int32_t rank, int32_t world) {
    Driver d(plugin());
    for (const auto& [key, value] : options)
        d.set_option(key, value);
    d.set_rank(rank, world);
    const bool ok = baseline ? d.run(*baseline, s) : d.run(s);
    return {ok, d.failed_call(), d.findings(), d.logs()};
}

// The module's defined dynamic symbols.
inline std::vector<std::string> plugin_symbols() {
    const auto names = defined_dynamic_symbols(std::getenv("ALLOCSCOPE_TEST_PLUGIN"));
    REQUIRE(names.has_value());
    return *names;
}
// The same, less AddressSanitizer's instrumentation symbols (in a sanitized
// build).
inline std::vector<std::string> plugin_symbols_without_asan() {
    std::vector<std::string> ours;
    for (const std::string& n : plugin_symbols()) {
        if (n.rfind("__odr_asan", 0) == 0 || n.rfind("__asan", 0) == 0) continue;
        ours.push_back(n);
    }
    return ours;
}

// The name of numbered layer i.
inline std::string layer(int i) {
    return "layers." + std::to_string(i);
}

inline uint64_t round512(uint64_t bytes) {
    return bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
}
inline uint64_t up(uint64_t a, uint64_t b) {
    return (a + b - 1) / b * b;
}
inline uint64_t cdiv(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

// The reference model's weights (hidden 256, FFN 1024), [rows × cols].
struct Weight {
    const char* module;
    uint64_t rows, cols;
};
inline constexpr Weight kWeights[] = {{"attn.qkv", 768, 256},
                                      {"attn.proj", 256, 256},
                                      {"mlp.fc1", 1024, 256},
                                      {"mlp.fc2", 256, 1024}};

}  // namespace allocscope::test
