// The harness tags through NVTX (--nvtx, under `allocscope run --nvtx`)
// exactly as through the C API: two sim runs, one each way, give the same
// allocation events with the same tags. Environment (tests/meson.build):
//   E2E_CLI  build/tools/allocscope     HARNESS  build/harness/allocscope-harness
#include <allocscope/allocscope.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

// (kind, level, size, layer, phase, step) of every event: allocations,
// frees, tag pushes and pops, steps, parameters (not the allocator's
// counters, which NVTX cannot carry).
using Recorded = std::tuple<int, int, uint64_t, std::string, std::string, uint64_t>;

struct HarnessRun {
    TempDir scratch;
    int status = -1;
    std::string err;
    std::vector<std::vector<Recorded>> by_rank;

    HarnessRun(const std::string& run_flags, const std::string& harness_flags) {
        const fs::path dir = scratch / "out";
        status = sh(env("E2E_CLI") + " run " + run_flags + " --plugins none --out " + dir.string() +
                        " -- " + env("HARNESS") + " --backend sim --ranks 2 --steps 2 --warmup 1 " +
                        harness_flags,
                    nullptr, &err);
        for (int r = 0; r < 2; ++r) {
            const fs::path p = dir / ("rank" + std::to_string(r) + ".trace");
            if (!fs::exists(p)) continue;
            const Trace t = load_trace(p.string());
            std::vector<Recorded>& seq = by_rank.emplace_back();
            for (const Event& e : t.events) {
                // The allocator's counters travel through the C API only.
                if (e.kind == EventKind::mark && t.str(e.aux) == ALLOCSCOPE_COUNTERS_MARK) continue;
                seq.emplace_back(int(e.kind), int(e.level), e.size, t.str(e.layer), t.str(e.phase),
                                 e.step);
            }
        }
    }
};

}  // namespace

TEST_CASE("the harness's NVTX ranges give the same events and tags as its C API calls") {
    const HarnessRun c_api("", "");
    const HarnessRun nvtx("--nvtx", "--nvtx");
    INFO(c_api.err);
    INFO(nvtx.err);
    REQUIRE(c_api.status == 0);
    REQUIRE(nvtx.status == 0);
    REQUIRE(c_api.by_rank.size() == 2);
    REQUIRE(nvtx.by_rank.size() == 2);
    for (size_t rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        const std::vector<Recorded>& a = c_api.by_rank[rank];
        const std::vector<Recorded>& b = nvtx.by_rank[rank];
        CHECK(a.size() == b.size());
        size_t differ = 0;
        for (size_t i = 0; i < std::min(a.size(), b.size()) && differ == 0; ++i) {
            if (a[i] != b[i]) {
                differ = i + 1;
                CAPTURE(i);
                CHECK(std::get<3>(a[i]) == std::get<3>(b[i]));
                CHECK(std::get<4>(a[i]) == std::get<4>(b[i]));
                CHECK(a[i] == b[i]);
            }
        }
        CHECK(differ == 0);

        // Not vacuous: every layer's forward and backward, both steps.
        std::set<std::string> layers, phases;
        std::set<uint64_t> steps;
        for (const auto& [kind, level, size, layer, phase, step] : b) {
            if (kind != int(EventKind::alloc)) continue;
            layers.insert(layer);
            phases.insert(phase);
            steps.insert(step);
        }
        for (int l = 0; l < 8; ++l)
            CHECK(layers.count("layers." + std::to_string(l)) == 1);
        CHECK(phases.count("forward") == 1);
        CHECK(phases.count("backward") == 1);
        CHECK(phases.count("forward/all_gather") == 1);
        CHECK(phases.count("optimizer") == 1);
        CHECK(steps == std::set<uint64_t>{0, 1});
    }
}

TEST_CASE("the harness's --nvtx outside `allocscope run --nvtx` warns that it tags nothing") {
    std::string err;
    const int status = sh("env -u NVTX_INJECTION64_PATH " + env("HARNESS") +
                              " --backend sim --ranks 1 --steps 1 --warmup 0 --layers 1 --nvtx",
                          nullptr, &err);
    CHECK(status == 0);
    CHECK(contains(err, "--nvtx without an NVTX injection library"));
}
