// allocscope-harness end to end: two rank processes under `allocscope run`
// (LD_PRELOAD), their traces read back. Environment (tests/meson.build):
//   E2E_CLI  build/tools/allocscope     HARNESS  build/harness/allocscope-harness
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support.h"
#include "trace_reader.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

using namespace allocscope::test;

// (size, layer, phase) of every block allocation, in order.
using BlockSequence = std::vector<std::tuple<uint64_t, std::string, std::string>>;

BlockSequence blocks(const Trace& t) {
    BlockSequence seq;
    for (const Event& e : t.events) {
        if (e.kind == EventKind::alloc && e.level == Level::block) {
            seq.emplace_back(e.size, t.str(e.layer), t.str(e.phase));
        }
    }
    return seq;
}

// A provenance declaration (allocscope_derived) and the block it names.
struct Declared {
    std::string param;  // "layers.1.attn.qkv.weight"
    std::string how;
    uint64_t size = 0;  // the block's, 0 if no live block starts there
    std::string layer;  // the tag it was declared under
    std::string phase;
    bool adjacent = false;  // right after the block's allocation, same tag
};

std::vector<Declared> declarations(const Trace& t) {
    std::map<uint64_t, const Event*> live;
    const Event* last_block = nullptr;
    std::vector<Declared> out;
    for (const Event& e : t.events) {
        if (e.level == Level::block && e.kind == EventKind::alloc) {
            live[e.address] = &e;
            last_block = &e;
        } else if (e.level == Level::block && e.kind == EventKind::free) {
            live.erase(e.address);
            last_block = nullptr;
        } else if (e.kind == EventKind::derived) {
            const ParamRecord& p = t.params.at(e.aux);
            Declared d{t.str(p.layer) + "." + t.str(p.name),
                       t.str(uint32_t(e.stream)),
                       0,
                       t.str(e.layer),
                       t.str(e.phase),
                       false};
            if (auto it = live.find(e.address); it != live.end()) d.size = it->second->size;
            d.adjacent = last_block && last_block->address == e.address &&
                         last_block->layer == e.layer && last_block->phase == e.phase;
            out.push_back(std::move(d));
            last_block = nullptr;
        }
    }
    return out;
}

struct HarnessRun {
    TempDir scratch;
    int status = -1;
    std::string out;
    std::vector<Trace> traces;  // by rank

    explicit HarnessRun(const std::string& args) {
        fs::path dir = scratch.dir / "out";
        status =
            sh(env("E2E_CLI") + " run --out " + dir.string() + " -- " + env("HARNESS") + " " + args,
               &out);
        for (int r = 0; r < 2; ++r) {
            fs::path p = dir / ("rank" + std::to_string(r) + ".trace");
            if (fs::exists(p)) traces.push_back(load_trace(p.string()));
        }
    }
};

const HarnessRun& delayed_seed() {
    static HarnessRun run("--ranks 2 --steps 2 --warmup 1 --recipe delayed --te seed");
    return run;
}

}  // namespace

TEST_CASE("two ranks each write a complete trace and rank 0 prints one line per step") {
    const HarnessRun& r = delayed_seed();
    CHECK(r.status == 0);
    REQUIRE(r.traces.size() == 2);
    for (int rank = 0; rank < 2; ++rank) {
        const Trace& t = r.traces[size_t(rank)];
        CHECK(t.header.rank == rank);
        CHECK(t.header.world_size == 2);
        CHECK(t.footer.has_value());
        CHECK(t.footer->events_dropped == 0);
    }
    CHECK(r.out.find("step 0 loss ") != std::string::npos);
    CHECK(r.out.find("step 1 loss ") != std::string::npos);
    CHECK(r.out.find("forward increment per layer") != std::string::npos);
}

TEST_CASE("every parameter is registered once with its full and sharded size") {
    const Trace& t = delayed_seed().traces.at(0);
    REQUIRE(t.params.size() == 96);
    std::set<std::string> names;
    for (const ParamRecord& p : t.params) {
        names.insert(t.str(p.layer) + "." + t.str(p.name));
        CHECK(t.str(p.dtype) == "bf16");
        CHECK(p.sharded_numel * 2 == p.numel);
    }
    CHECK(names.size() == 96);
    const ParamRecord* qkv = nullptr;
    for (const ParamRecord& p : t.params) {
        if (t.str(p.layer) == "layers.3.attn.qkv" && t.str(p.name) == "weight") qkv = &p;
    }
    REQUIRE(qkv != nullptr);
    CHECK(qkv->numel == 768 * 256);
}

TEST_CASE("block allocations carry the documented layers and phases") {
    const Trace& t = delayed_seed().traces.at(0);
    std::set<std::string> phases;
    std::map<std::string, uint64_t> quantize_bytes;  // layers.3.* forward/quantize
    for (const auto& [size, layer, phase] : blocks(t)) {
        phases.insert(phase);
        if (phase == "forward/quantize" && layer.rfind("layers.3.", 0) == 0) {
            quantize_bytes[layer] += size;
        }
    }
    for (const char* p : {"init", "forward", "forward/all_gather", "forward/quantize", "backward",
                          "backward/all_gather", "backward/dgrad", "backward/wgrad",
                          "backward/reduce_scatter", "optimizer"}) {
        CAPTURE(p);
        CHECK(phases.count(p) == 1);
    }
    // Delayed scaling on sm90: data + transpose + scale_inv per weight, both
    // steps; layer 3's four copies total the TE doc's 1.502 MiB per step.
    uint64_t total = 0;
    for (const auto& [layer, bytes] : quantize_bytes)
        total += bytes;
    CHECK(quantize_bytes.size() == 4);
    CHECK(total == 2 * 1574912);
}

TEST_CASE("the ranks allocate the same block sequence, and so does a second run") {
    const HarnessRun& a = delayed_seed();
    REQUIRE(a.traces.size() == 2);
    CHECK(blocks(a.traces[0]) == blocks(a.traces[1]));
    HarnessRun b("--ranks 2 --steps 2 --warmup 1 --recipe delayed --te seed");
    REQUIRE(b.traces.size() == 2);
    CHECK(blocks(a.traces[0]) == blocks(b.traces[0]));
}

TEST_CASE("quantized init: the column-wise forms are built at the backward all-gather") {
    // Per layer and step: qkv, proj, fc1 and fc2 transposed, 786,432 B in
    // all (full) or half of it on each of two ranks (sharded); made in the
    // block's all-gather scope (layers.1, backward/all_gather), not under
    // the GEMM modules, as TE's post-all-gather hook makes them.
    for (auto [preset, expected] :
         {std::pair<const char*, uint64_t>{"full", 786432}, {"sharded", 393216}}) {
        CAPTURE(preset);
        HarnessRun r(std::string("--ranks 2 --steps 2 --warmup 1 --layers 2 --recipe delayed "
                                 "--quantized-init --retain ") +
                     preset);
        CHECK(r.status == 0);
        REQUIRE(r.traces.size() == 2);
        uint64_t bytes = 0;
        std::set<std::string> params;
        for (const Declared& d : declarations(r.traces[1])) {
            if (d.how.find("column-wise") == std::string::npos) continue;
            CAPTURE(d.param);
            CAPTURE(d.how);
            CHECK(d.how.find("from the all-gathered row-wise data") != std::string::npos);
            CHECK(d.phase == "backward/all_gather");
            CHECK(d.layer == d.param.substr(0, d.param.find('.', 7)));
            if (d.layer == "layers.1") bytes += d.size;
            params.insert(d.param);
        }
        CHECK(bytes == 2 * expected);
        CHECK(params ==
              std::set<std::string>{"layers.0.attn.qkv.weight", "layers.0.attn.proj.weight",
                                    "layers.0.mlp.fc1.weight", "layers.0.mlp.fc2.weight",
                                    "layers.1.attn.qkv.weight", "layers.1.attn.proj.weight",
                                    "layers.1.mlp.fc1.weight", "layers.1.mlp.fc2.weight"});
    }
}

TEST_CASE("every quantized weight copy is declared with its parameter, unless --no-provenance") {
    // Delayed scaling on sm90, seed: each forward copy is scale_inv, data
    // and transpose, declared right after allocation, at the block's own
    // address and tag.
    const Trace& t = delayed_seed().traces.at(0);
    uint64_t copies = 0, declared_bytes = 0;
    for (const auto& [size, layer, phase] : blocks(t)) {
        if (phase == "forward/quantize") {
            ++copies;
            declared_bytes += size;
        }
    }
    const std::vector<Declared> all = declarations(t);
    REQUIRE(all.size() == copies);
    std::map<std::string, int> hows;
    uint64_t bytes = 0;
    for (const Declared& d : all) {
        CAPTURE(d.param);
        CHECK(d.phase == "forward/quantize");
        CHECK(d.param == d.layer + ".weight");
        CHECK(d.adjacent);
        bytes += d.size;
        ++hows[d.how];
    }
    CHECK(bytes == declared_bytes);
    CHECK(hows == std::map<std::string, int>{
                      {"delayed scale_inv", int(copies / 3)},
                      {"cast to fp8_e4m3 (delayed), row-wise", int(copies / 3)},
                      {"cast to fp8_e4m3 (delayed), column-wise (transposed)", int(copies / 3)}});

    HarnessRun off(
        "--ranks 2 --steps 2 --warmup 1 --layers 2 --recipe current --te fixed "
        "--quantized-init --no-provenance");
    CHECK(off.status == 0);
    REQUIRE(off.traces.size() == 2);
    CHECK(declarations(off.traces[0]).empty());
    HarnessRun on(
        "--ranks 2 --steps 2 --warmup 1 --layers 2 --recipe current --te fixed "
        "--quantized-init");
    REQUIRE(on.traces.size() == 2);
    CHECK(blocks(on.traces[0]) == blocks(off.traces[0]));
    // Column-wise forms only (the quantized shards are the parameters
    // themselves, not derived from them): transposes in backward.
    const std::vector<Declared> columnwise = declarations(on.traces[0]);
    CHECK(columnwise.size() == 2 * 2 * 4);
    for (const Declared& d : columnwise)
        CHECK(d.how ==
              "cast to fp8_e4m3 (current), column-wise (transposed), from the "
              "all-gathered row-wise data");
}

TEST_CASE("four ranks train together") {
    HarnessRun r("--ranks 4 --steps 2 --warmup 1 --layers 2 --recipe mxfp8");
    CHECK(r.status == 0);
    CHECK(r.out.find("step 1 loss ") != std::string::npos);
}

TEST_CASE("an invalid option is one message and exit status 2") {
    std::string err;
    CHECK(sh(env("HARNESS") + " --recipe nvfp4 --quantized-init", nullptr, &err) == 2);
    CHECK(err ==
          "allocscope-harness: --recipe nvfp4 cannot be combined with --quantized-init (TE does "
          "not support quantized NVFP4 parameters)\n");
    CHECK(sh(env("HARNESS") + " --backend cuda", nullptr, &err) == 2);
    CHECK(err.find("--backend cuda") != std::string::npos);
}
