// weight-copy-accumulation, driven through its module's exported struct
// (ALLOCSCOPE_TEST_PLUGIN: the built .so) on synthetic streams shaped like the harness's
// (docs/HARNESS.md) and like PyTorch module hooks. Expected bytes are the
// per-layer copy sizes of docs/TE-FSDP2-FP8-MEMORY.md for the reference
// model (hidden 256, FFN 1024), written out here, not computed by the plugin's
// own code.
// Longer than 600 lines: one detector's specification: its cases share the
// stream builders above them.
#include <allocscope/allocscope.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "plugin_test.h"

using allocscope::test::cdiv;
using allocscope::test::CollectedFinding;
using allocscope::test::kWeights;
using allocscope::test::Options;
using allocscope::test::Outcome;
using allocscope::test::plugin;
using allocscope::test::round512;
using allocscope::test::Stream;
using allocscope::test::up;
using allocscope::test::Weight;

namespace {

// One run on rank `rank` of `world` (2 unless given), or in baseline mode.
Outcome drive(const Stream& s, const Options& options = {}, int32_t world = 2, int32_t rank = 0) {
    return allocscope::test::drive_plugin(nullptr, s, options, rank, world);
}
Outcome drive(const Stream& baseline, const Stream& s, const Options& options = {}) {
    return allocscope::test::drive_plugin(&baseline, s, options, 0, 2);
}

enum class Recipe { bf16, delayed_sm90, current_sm90, delayed_sm100, block, mxfp8, nvfp4 };

// The buffers TransformerEngine allocates for a [R × C] weight quantized in
// forward (harness/fp8/layout.h), raw bytes in allocation order; columnwise:
// both usages (the seed), else row-wise only (the fix). Current scaling's
// 8-byte amax/scale workspace is allocated and freed by Run.
std::vector<uint64_t> te_buffers(Recipe r, uint64_t R, uint64_t C, bool columnwise) {
    const uint64_t n = R * C;
    switch (r) {
        case Recipe::bf16:
            return {};
        case Recipe::delayed_sm90:
            return columnwise ? std::vector<uint64_t>{4, n, n} : std::vector<uint64_t>{4, n};
        case Recipe::current_sm90:
            return columnwise ? std::vector<uint64_t>{n, n, 4} : std::vector<uint64_t>{n, 4};
        case Recipe::delayed_sm100:  // non-TN GEMM: data serves both usages
            return {4, n};
        case Recipe::block: {
            std::vector<uint64_t> b{n, cdiv(R, 128) * up(cdiv(C, 128), 4) * 4};
            if (columnwise) {
                b.push_back(n);
                b.push_back(cdiv(C, 128) * up(cdiv(R, 128), 4) * 4);
            }
            return b;
        }
        case Recipe::mxfp8: {
            std::vector<uint64_t> b{n, up(R, 128) * up(C / 32, 4)};
            if (columnwise) {
                b.push_back(n);
                b.push_back(up(R / 32, 4) * up(C, 128));
            }
            return b;
        }
        case Recipe::nvfp4: {
            std::vector<uint64_t> b{n / 2, up(R, 128) * up(C / 16, 4), 4};
            if (columnwise) {
                b.push_back(n / 2);
                b.push_back(up(C, 128) * up(R / 16, 4));
                b.push_back(4);
            }
            return b;
        }
    }
    return {};
}

// Saved activations per layer (bf16, T = 64 tokens, H = 256, F = 1024). Two
// of them have the size of a weight-derived buffer (131072 = NVFP4 data of
// fc1, 196608 = FP8 data of qkv); tagged with the layer, they must not match.
constexpr uint64_t kSaved[] = {32768, 98304, 131072, 196608, 131072, 32768};
constexpr uint64_t kOutput = 32768;

// How one synthetic run is shaped.
struct Shape {
    Recipe recipe = Recipe::delayed_sm90;
    bool seed = true;     // copies kept until backward (problem 1)
    bool rounded = true;  // sizes as a caching allocator reports them
    int layers = 4;
    int steps = 3;
    std::string prefix;         // "model." for a named model root
    bool pytorch = false;       // module-hook nesting instead of the harness's tags
    bool params = true;         // PARAM events
    bool provenance = true;     // DERIVED events for the copies (with params)
    uint32_t backward_tid = 1;  // the thread that frees the copies (autograd's)
    uint64_t warmup_extra = 0;  // bytes step 1 allocates in layer 0's forward and keeps
};

// Expected per-layer retained bytes for a recipe (seed, rounded sizes).
uint64_t copy_bytes_per_layer(Recipe r, bool rounded = true) {
    uint64_t total = 0;
    for (const Weight& w : kWeights) {
        for (uint64_t b : te_buffers(r, w.rows, w.cols, true))
            total += rounded ? round512(b) : b;
    }
    return total;
}

// Builds streams; records the seqs of the copies each layer keeps.
class Run {
  public:
    explicit Run(Shape shape) : shape_(std::move(shape)) {}

    Stream build() {
        Stream s;
        if (shape_.params) register_params(s);
        s.push("data", "init");
        s.alloc(take(), 32768);
        s.pop();
        for (int step = 1; step <= shape_.steps; ++step)
            one_step(s, uint64_t(step));
        return s;
    }
    std::string layer(int i) const { return shape_.prefix + "layers." + std::to_string(i); }
    std::string module(int i, const Weight& w) const { return layer(i) + "." + w.module; }
    // alloc seqs of the retained copies of layer i in step `step`.
    const std::vector<uint64_t>& kept(int step, int i) const { return kept_.at({step, i}); }

  private:
    uint64_t take() { return next_ += 0x100000; }
    uint64_t size(uint64_t raw) const { return shape_.rounded ? round512(raw) : raw; }

    void register_params(Stream& s) {
        for (int i = 0; i < shape_.layers; ++i) {
            s.param(layer(i) + ".ln1", "weight", 256, 128);
            s.param(layer(i) + ".ln1", "bias", 256, 128);
            for (const Weight& w : kWeights) {
                s.param(module(i, w), "weight", w.rows * w.cols, w.rows * w.cols / 2);
                s.param(module(i, w), "bias", w.rows, w.rows / 2);
            }
        }
    }

    void one_step(Stream& s, uint64_t step) {
        s.step(step);
        std::vector<std::vector<uint64_t>> copies(size_t(shape_.layers));
        std::vector<std::vector<uint64_t>> saved(size_t(shape_.layers));
        std::vector<uint64_t> outputs;
        if (shape_.pytorch) s.push(shape_.prefix.empty() ? "" : "model", "forward");
        for (int i = 0; i < shape_.layers; ++i) {
            s.push(layer(i).c_str(), "forward");
            if (step == 1 && i == 0 && shape_.warmup_extra) s.alloc(take(), shape_.warmup_extra);
            // FSDP2 unshard: tagged with the layer, freed at reshard.
            std::vector<uint64_t> unsharded;
            s.push(nullptr, "forward/all_gather");
            for (const Weight& w : kWeights) {
                unsharded.push_back(take());
                s.alloc(unsharded.back(), size(2 * w.rows * w.cols));
            }
            s.pop();
            std::vector<uint64_t> transient;
            for (const Weight& w : kWeights) {
                if (shape_.pytorch) {
                    // layers.i → layers.i.attn|mlp → layers.i.attn.qkv ...
                    const std::string m = module(i, w);
                    s.push(m.substr(0, m.rfind('.')).c_str(), "forward");
                    s.push(m.c_str(), "forward");
                } else {
                    s.push(module(i, w).c_str(), "forward/quantize");
                }
                const std::vector<uint64_t> bufs =
                    te_buffers(shape_.recipe, w.rows, w.cols, shape_.seed);
                for (size_t b = 0; b < bufs.size(); ++b) {
                    const uint64_t a = take();
                    const uint64_t seq = s.alloc(a, size(bufs[b]));
                    if (shape_.params && shape_.provenance)
                        s.derived(a, module(i, w), "weight", "quantize");
                    if (shape_.seed) {
                        copies[size_t(i)].push_back(a);
                        kept_[{int(step), i}].push_back(seq);
                    } else {
                        transient.push_back(a);
                    }
                }
                if (shape_.recipe == Recipe::current_sm90) {  // amax/scale workspace
                    const uint64_t a = take();
                    s.alloc(a, size(8));
                    s.free(a);
                }
                s.pop();
                if (shape_.pytorch) s.pop();
            }
            for (uint64_t bytes : kSaved) {
                saved[size_t(i)].push_back(take());
                s.alloc(saved[size_t(i)].back(), bytes);
            }
            outputs.push_back(take());
            s.alloc(outputs.back(), kOutput);
            for (uint64_t a : transient)  // the fix: freed after the GEMM
                s.free(a);
            for (uint64_t a : unsharded)
                s.free(a);
            s.pop();
        }
        if (shape_.pytorch) s.pop();
        s.push("loss", "backward");
        const uint64_t dy = take();
        s.alloc(dy, kOutput);
        s.pop();
        const uint32_t tid = shape_.backward_tid;
        for (int i = shape_.layers - 1; i >= 0; --i) {
            s.push(layer(i).c_str(), "backward", tid);
            for (uint64_t a : copies[size_t(i)])
                s.free(a, tid);
            for (uint64_t a : saved[size_t(i)])
                s.free(a, tid);
            s.free(outputs[size_t(i)], tid);
            s.pop(tid);
        }
        s.free(dy);
        s.push("optimizer", "optimizer");
        s.pop();
    }

    Shape shape_;
    uint64_t next_ = 0x7f0000000000;
    std::map<std::pair<int, int>, std::vector<uint64_t>> kept_;
};

std::vector<const CollectedFinding*> per_layer(const Outcome& d) {
    std::vector<const CollectedFinding*> out;
    for (const CollectedFinding& f : d.findings) {
        if (f.summary.find("alive together") == std::string::npos) out.push_back(&f);
    }
    return out;
}
const CollectedFinding* total(const Outcome& d) {
    for (const CollectedFinding& f : d.findings) {
        if (f.summary.find("alive together") != std::string::npos) return &f;
    }
    return nullptr;
}

}  // namespace

TEST_CASE("the module exports exactly one dynamic symbol, allocscope_plugin_v2") {
    // exports.map hides everything else, sanitizer instrumentation and the
    // libstdc++ template instantiations (default visibility) included.
    CHECK(allocscope::test::plugin_symbols() == std::vector<std::string>{"allocscope_plugin_v2"});
}

TEST_CASE("the plugin struct: ABI, name, and only the event kinds it needs") {
    const allocscope_plugin_v2* p = plugin();
    CHECK(p->struct_size == sizeof(allocscope_plugin_v2));
    CHECK(p->abi_version == ALLOCSCOPE_PLUGIN_V2_ABI_VERSION);
    CHECK(std::string(p->name) == "weight-copy-accumulation");
    CHECK(p->event_mask == (ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_PUSH) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_POP) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_MARK) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_DERIVED)));
}

TEST_CASE("per-layer copy sizes of the reference model, as the TE doc derives them") {
    // Guards the test's own layouts against the doc's table.
    CHECK(copy_bytes_per_layer(Recipe::delayed_sm90) == 1574912);  // 1.502 MiB
    CHECK(copy_bytes_per_layer(Recipe::delayed_sm100) == 788480);  // 0.752 MiB
    CHECK(copy_bytes_per_layer(Recipe::mxfp8) == 1622016);         // 1.547 MiB
    CHECK(copy_bytes_per_layer(Recipe::block) == 1576960);         // 1.504 MiB
    CHECK(copy_bytes_per_layer(Recipe::nvfp4) == 888832);          // 0.848 MiB
}

TEST_CASE("seed-like copies kept until backward: one finding per layer and the total") {
    struct Case {
        Recipe recipe;
        uint64_t per_layer;
        uint64_t allocations;  // per layer
    };
    const Case cases[] = {
        {Recipe::delayed_sm90, 1574912, 12},  // scale_inv, data, transpose × 4
        {Recipe::current_sm90, 1574912, 12},  // + a workspace freed at once
        {Recipe::delayed_sm100, 788480, 8},
        {Recipe::block, 1576960, 16},
        {Recipe::mxfp8, 1622016, 16},
        {Recipe::nvfp4, 888832, 24},  // data, scales, amax per usage
    };
    for (const Case& c : cases) {
        CAPTURE(int(c.recipe));
        Shape shape;
        shape.recipe = c.recipe;
        Run run(shape);
        const Stream s = run.build();
        const Outcome d = drive(s);
        CHECK(d.logs.empty());
        const auto layers = per_layer(d);
        REQUIRE(layers.size() == 4);
        for (int i = 0; i < 4; ++i) {
            const CollectedFinding& f = *layers[size_t(i)];
            CHECK(f.plugin == "weight-copy-accumulation");
            CHECK(f.severity == ALLOCSCOPE_SEVERITY_ERROR);
            CHECK(f.basis == "proven");
            CHECK(f.layer == run.layer(i));
            CHECK(f.phase == "forward");
            CHECK(f.bytes == c.per_layer);
            CHECK(f.count == c.allocations);
            // Every step retains the same: the latest is reported.
            std::vector<uint64_t> seqs;
            std::vector<uint64_t> sizes;
            uint64_t evidence_bytes = 0;
            for (const auto& e : f.evidence) {
                seqs.push_back(e.alloc_seq);
                sizes.push_back(e.size);
                evidence_bytes += e.size;
                CHECK(e.step == 3);
                CHECK(e.phase == "forward/quantize");
                CHECK(e.layer.rfind(run.layer(i) + ".", 0) == 0);
                CHECK(e.stack_id != 0);
                CHECK(e.free_seq > e.alloc_seq);  // freed in that step's backward
                CHECK(e.note.rfind("derived from " + e.layer + ".weight: quantize; alive after " +
                                       run.layer(i) + "'s forward",
                                   0) == 0);
            }
            // The largest first: the same allocations, sizes never growing.
            CHECK(std::is_sorted(sizes.begin(), sizes.end(), std::greater<uint64_t>()));
            std::sort(seqs.begin(), seqs.end());
            CHECK(seqs == run.kept(3, i));
            CHECK(evidence_bytes == c.per_layer);
            CHECK(f.summary.find("retained in 3 forwards") != std::string::npos);
        }
        const CollectedFinding* t = total(d);
        REQUIRE(t != nullptr);
        CHECK(t->severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(t->basis == "proven");
        CHECK(t->bytes == 4 * c.per_layer);
        CHECK(t->count == 4 * c.allocations);
        CHECK(t->layer == "layers");
        CHECK(t->evidence.size() == 4 * c.allocations);
    }
}

TEST_CASE("raw (unrounded) sizes are matched too") {
    Shape shape;
    shape.rounded = false;
    shape.provenance = false;
    Run run(shape);
    const Outcome d = drive(run.build());
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 4);
    // 4 × (4 B scale_inv + data + transpose)
    CHECK(layers[0]->bytes == 4 * 4 + 2 * 786432);
    CHECK(layers[0]->count == 12);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_INFO);

    Shape nv;
    nv.rounded = false;
    nv.provenance = false;
    nv.recipe = Recipe::nvfp4;
    Run run_nv(nv);
    const Outcome d_nv = drive(run_nv.build());
    REQUIRE(per_layer(d_nv).size() == 4);
    // data n/2 ×2, the scales exactly, amax 4 B ×2, per weight
    CHECK(per_layer(d_nv)[0]->bytes == 786432 + 98304 + 8 * 4);
}

TEST_CASE("fixed-like copies freed before the layer's forward ends, and bf16, give nothing") {
    for (Recipe r : {Recipe::delayed_sm90, Recipe::current_sm90, Recipe::block, Recipe::mxfp8,
                     Recipe::nvfp4, Recipe::bf16}) {
        CAPTURE(int(r));
        Shape shape;
        shape.recipe = r;
        shape.seed = false;
        Run run(shape);
        const Outcome d = drive(run.build());
        CHECK(d.findings.empty());
        CHECK(d.logs.empty());
    }
}

TEST_CASE("the outermost forward scope judges: PyTorch-style nesting") {
    SUBCASE("root module \"\": copies alive when layers.i's forward ends") {
        Shape shape;
        shape.pytorch = true;
        Run run(shape);
        const Outcome d = drive(run.build());
        const auto layers = per_layer(d);
        REQUIRE(layers.size() == 4);
        CHECK(layers[2]->layer == "layers.2");
        CHECK(layers[2]->bytes == 1574912);
        CHECK(layers[2]->evidence.front().phase == "forward");
    }
    SUBCASE("a named root (model) is not a layer: model.layers.i is") {
        Shape shape;
        shape.pytorch = true;
        shape.prefix = "model.";
        Run run(shape);
        const Outcome d = drive(run.build());
        const auto layers = per_layer(d);
        REQUIRE(layers.size() == 4);
        CHECK(layers[0]->layer == "model.layers.0");
        CHECK(layers[3]->layer == "model.layers.3");
        CHECK(layers[3]->bytes == 1574912);
        REQUIRE(total(d) != nullptr);
        CHECK(total(d)->layer == "model.layers");
    }
    SUBCASE("freed after the GEMM module's scope but inside the layer's: not retained") {
        Stream s;
        s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
        s.step(1);
        s.push("", "forward");
        s.push("layers.0", "forward");
        s.push("layers.0.mlp", "forward");
        s.push("layers.0.mlp.fc1", "forward");
        s.alloc(0x1000000, 262144);
        s.derived(0x1000000, "layers.0.mlp.fc1", "weight");  // proven or not: the same
        s.alloc(0x2000000, 262144);
        s.pop();
        s.free(0x1000000);  // in layers.0.mlp: still inside layers.0's forward
        s.pop();
        s.free(0x2000000);  // in layers.0
        s.pop();
        s.pop();
        const Outcome d = drive(s);
        CHECK(d.findings.empty());
    }
}

TEST_CASE("activation recomputation (a forward scope inside backward) is not a layer forward") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.step(1);
    s.push("layers.0", "backward", 2);
    s.push("layers.0", "forward", 2);  // checkpointed layer re-run by autograd
    s.push("layers.0.attn.qkv", "forward/quantize", 2);
    s.alloc(0x100000, 196608, 2);
    s.derived(0x100000, "layers.0.attn.qkv", "weight", "", 2);
    s.alloc(0x200000, 196608, 2);  // size-matched only
    s.pop(2);
    s.pop(2);  // the copies outlive the recomputed forward, until dgrad
    s.free(0x200000, 2);
    s.free(0x100000, 2);
    s.pop(2);
    const Outcome d = drive(s);
    CHECK(d.findings.empty());
}

TEST_CASE("scale-sized allocations count only next to a data-sized one of the same module") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.param("layers.0.attn.proj", "weight", 65536, 32768);
    s.step(1);
    s.push("layers.0", "forward");
    s.push("layers.0.attn.qkv", "forward/quantize");
    const uint64_t scale_qkv = s.alloc(0x100000, 512);  // before its data, as delayed does
    const uint64_t data_qkv = s.alloc(0x200000, 196608);
    s.pop();
    s.push("layers.0.attn.proj", "forward/quantize");
    s.alloc(0x300000, 512);   // scale-sized, but proj made no data-sized allocation
    s.alloc(0x400000, 2048);  // MXFP8 scales of proj: same
    s.pop();
    s.alloc(0x500000, 196608);  // activation of qkv's size, tagged with the layer
    s.push("layers.0.attn.qkv", "forward/quantize");
    s.alloc(0x600000, 12345);  // not a size derived from qkv
    s.pop();
    s.pop();
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_INFO);  // sizes only
    CHECK(layers[0]->bytes == 512 + 196608);
    CHECK(layers[0]->count == 2);
    REQUIRE(layers[0]->evidence.size() == 2);
    // The FP8 data first (the largest), then its scale, made before it.
    CHECK(layers[0]->evidence[0].alloc_seq == data_qkv);
    CHECK(layers[0]->evidence[1].alloc_seq == scale_qkv);
    CHECK(layers[0]->evidence[1].free_seq == 0);  // never freed
    REQUIRE(total(d) != nullptr);  // the step ended without backward: the total at the step end
    CHECK(total(d)->bytes == 512 + 196608);
}

TEST_CASE("small parameters (biases, norms) are not matched") {
    // The bias of qkv (768 elements) would make any 1536 B allocation a bf16 copy.
    Stream s;
    s.param("layers.0.attn.qkv", "bias", 768, 384);
    s.push("layers.0", "forward");
    s.push("layers.0.attn.qkv", "forward/quantize");
    s.alloc(0x100000, 1536);
    s.alloc(0x200000, 1024);
    s.pop();
    s.pop();
    const Outcome d = drive(s);
    CHECK(d.findings.empty());

    // ... unless min_numel lets them in.
    const Outcome low = drive(s, {{"min_numel", "256"}});
    REQUIRE(per_layer(low).size() == 1);
    CHECK(per_layer(low)[0]->bytes == 1536 + 1024);
}

TEST_CASE("a large-pool block handed out unsplit still matches") {
    // 2048 × 2048 FP8 data: 4 MiB; PyTorch may hand out a cached block up to
    // 1 MiB larger instead of splitting it.
    Stream s;
    s.param("layers.0.mlp.fc1", "weight", 4194304, 2097152);
    s.push("layers.0", "forward");
    s.push("layers.0.mlp.fc1", "forward/quantize");
    s.alloc(0x10000000, 4194304 + 786432);   // within 1 MiB: matches
    s.alloc(0x20000000, 4194304 + 1572864);  // 1.5 MiB over: no
    s.pop();
    s.pop();
    const Outcome d = drive(s);
    REQUIRE(per_layer(d).size() == 1);
    CHECK(per_layer(d)[0]->bytes == 4194304 + 786432);
    CHECK(per_layer(d)[0]->count == 1);
}

TEST_CASE("address reuse after free: the allocation alive at the end counts once") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.push("layers.0", "forward");
    s.push("layers.0.attn.qkv", "forward/quantize");
    s.alloc(0x100000, 196608);
    s.free(0x100000);
    const uint64_t second = s.alloc(0x100000, 196608);
    s.pop();
    s.pop();
    s.push("layers.1", "forward");  // reuse of the address in a later layer
    s.free(0x100000);
    s.alloc(0x100000, 196608);  // no param of layers.1: not a copy
    s.pop();
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->bytes == 196608);
    CHECK(layers[0]->count == 1);
    REQUIRE(layers[0]->evidence.size() == 1);
    CHECK(layers[0]->evidence[0].alloc_seq == second);
    CHECK(layers[0]->evidence[0].free_seq == second + 4);  // the free in layers.1
}

TEST_CASE("frees from another thread, in any order, and unknown frees") {
    SUBCASE("seed copies freed by the autograd thread: same findings") {
        Shape shape;
        shape.backward_tid = 7;
        Run run(shape);
        const Outcome d = drive(run.build());
        REQUIRE(per_layer(d).size() == 4);
        CHECK(per_layer(d)[1]->bytes == 1574912);
        REQUIRE(total(d) != nullptr);
        CHECK(total(d)->bytes == 4 * 1574912);
    }
    SUBCASE("copies freed by another thread before the forward ends, in reverse order") {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        s.push("layers.0", "forward");
        s.push("layers.0.attn.qkv", "forward/quantize");
        s.alloc(0x100000, 512);
        s.alloc(0x200000, 196608);
        s.alloc(0x300000, 196608);
        s.pop();
        s.free(0x300000, 9);
        s.free(0xdead0000, 9);  // unknown address
        s.free(0x100000, 9);
        s.free(0x200000, 9);
        s.pop();
        const Outcome d = drive(s);
        CHECK(d.findings.empty());
    }
    SUBCASE("unknown frees interleaved change nothing") {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        s.free(0x42);
        s.push("layers.0", "forward");
        s.free(0x100000);  // the address about to be used, before its alloc
        s.push("layers.0.attn.qkv", "forward/quantize");
        s.alloc(0x100000, 196608);
        s.free(0x77);
        s.pop();
        s.pop();
        s.free(0x88);
        const Outcome d = drive(s);
        REQUIRE(per_layer(d).size() == 1);
        CHECK(per_layer(d)[0]->bytes == 196608);
    }
}

TEST_CASE("untagged allocations and allocations outside forward are ignored") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.alloc(0x100000, 196608);  // no tag at all
    s.push("layers.0", "forward");
    s.alloc(0x200000, 196608, 3);  // another thread, untagged
    s.pop();
    s.push("layers.0.attn.qkv", "backward/transpose");  // backward: the other plugin's
    s.alloc(0x300000, 196608);
    s.pop();
    const Outcome d = drive(s);
    CHECK(d.findings.empty());
}

TEST_CASE("no registered parameters: one log line, no findings") {
    Shape shape;
    shape.params = false;
    Run run(shape);
    const Outcome d = drive(run.build());
    CHECK(d.findings.empty());
    CHECK(d.failed_call.empty());
    REQUIRE(d.logs.size() == 1);
    CHECK(d.logs[0].find("no parameters were registered") != std::string::npos);
    CHECK(d.logs[0].find("allocscope_register_param()") != std::string::npos);
    CHECK(d.logs[0].find("PyTorch shim") != std::string::npos);

    // Registered parameters, nothing else: nothing to say.
    Stream registered;
    registered.param("layers.0.attn.qkv", "weight", 196608, 98304);
    CHECK(drive(registered).logs.empty());

    // A program that never runs a forward or backward pass (any CUDA
    // program that is not training) is not told about weights.
    Stream untrained;
    untrained.push("io", "load");
    untrained.alloc(0x1000, 4096);
    untrained.pop();
    CHECK(drive(untrained).logs.empty());
}

TEST_CASE("params registered in the baseline's stream serve the run's") {
    // The parameter table outlives the stream switch: a run that registers
    // nothing itself still has its copies matched (the evidence).
    Shape base_shape;
    base_shape.recipe = Recipe::bf16;
    base_shape.seed = false;
    Shape run_shape;
    run_shape.params = false;
    Run baseline(base_shape), run(run_shape);
    const Outcome d = drive(baseline.build(), run.build());
    REQUIRE(d.findings.size() == 1);
    CHECK(d.findings[0].bytes == 1574912);
    CHECK(d.findings[0].count == 4 * 12);
    CHECK(d.findings[0].basis == "baseline");
    CHECK(d.logs.empty());
}

TEST_CASE("each layer is reported once, from the step that retained the most") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    for (uint64_t step = 1; step <= 3; ++step) {
        s.step(step);
        s.push("layers.0", "forward");
        s.push("layers.0.attn.qkv", "forward/quantize");
        s.alloc(0x100000, 196608);
        if (step == 2) s.alloc(0x200000, 196608);  // step 2 keeps two copies
        s.pop();
        s.pop();
        s.push("layers.0", "backward");
        s.free(0x100000);
        if (step == 2) s.free(0x200000);
        s.pop();
    }
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->bytes == 2 * 196608);
    CHECK(layers[0]->count == 2);
    CHECK(layers[0]->evidence[0].step == 2);
    CHECK(layers[0]->summary.find("step 2") != std::string::npos);
    CHECK(layers[0]->summary.find("retained in 3 forwards") != std::string::npos);
    REQUIRE(total(d) != nullptr);
    CHECK(total(d)->bytes == 2 * 196608);
}

TEST_CASE("levels: blocks when the stream has them, segments otherwise") {
    auto stream = [](uint32_t copy_level, bool with_blocks) {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        if (with_blocks) s.alloc(0x900000, 512, 1, ALLOCSCOPE_LEVEL_BLOCK);
        s.push("layers.0", "forward");
        s.push("layers.0.attn.qkv", "forward/quantize");
        s.alloc(0x100000, 196608, 1, copy_level);
        s.pop();
        s.pop();
        return s;
    };
    {  // cudaMallocAsync backend: every tensor is a segment
        const Outcome d = drive(stream(ALLOCSCOPE_LEVEL_SEGMENT, false));
        REQUIRE(per_layer(d).size() == 1);
        CHECK(per_layer(d)[0]->bytes == 196608);
    }
    {  // a caching allocator reports blocks: its segments are not tensors
        const Outcome d = drive(stream(ALLOCSCOPE_LEVEL_SEGMENT, true));
        CHECK(d.findings.empty());
    }
    {  // ... unless asked for
        const Outcome d = drive(stream(ALLOCSCOPE_LEVEL_SEGMENT, true), {{"level", "segment"}});
        REQUIRE(per_layer(d).size() == 1);
    }
    {  // a segment free at a block's address does not free the block
        Stream s = stream(ALLOCSCOPE_LEVEL_BLOCK, true);
        s.free(0x100000, 1, ALLOCSCOPE_LEVEL_SEGMENT);
        const Outcome d = drive(s);
        REQUIRE(total(d) != nullptr);
        CHECK(total(d)->bytes == 196608);
        CHECK(total(d)->evidence[0].free_seq == 0);
    }
}

TEST_CASE("baseline mode: the reference test's per-layer forward increment") {
    Shape base_shape;
    base_shape.recipe = Recipe::bf16;
    base_shape.seed = false;

    SUBCASE("FP8 seed over bf16: one finding, the per-layer copy size as excess") {
        Shape run_shape;
        run_shape.warmup_extra = 10 << 20;  // the warm-up step is excluded
        Run baseline(base_shape), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        const CollectedFinding& f = d.findings[0];
        CHECK(f.severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(f.basis == "baseline");
        CHECK(f.layer == "layers");
        CHECK(f.phase == "forward");
        CHECK(f.bytes == 1574912);
        CHECK(f.count == 4 * 12);  // the weight-derived allocations as evidence
        CHECK(f.evidence.size() == 4 * 12);
        CHECK(f.summary.find("8 layer forwards in 2 steps") != std::string::npos);
        CHECK(f.summary.find("threshold of 50.0 KiB (51200 B)") != std::string::npos);
    }
    SUBCASE("the warm-up step counts when it is the only step") {
        Shape run_shape;
        run_shape.steps = 1;
        run_shape.warmup_extra = 4 << 20;
        Shape b = base_shape;
        b.steps = 1;
        Run baseline(b), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        // (4 layers × copies + 4 MiB once) / 4 layers
        CHECK(d.findings[0].bytes == 1574912 + (4 << 20) / 4);
        CHECK(d.findings[0].summary.find("no warm-up step excluded") != std::string::npos);
    }
    SUBCASE("FP8 fixed against bf16: below the threshold, nothing") {
        Shape run_shape;
        run_shape.seed = false;
        Run baseline(base_shape), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        CHECK(d.findings.empty());
        CHECK(d.logs.empty());
    }
    SUBCASE("the threshold is an option") {
        Run baseline(base_shape), run(Shape{});
        const Outcome above = drive(baseline.build(), run.build(),
                                    {{"forward_threshold", "1574912"}});  // equal: not over
        CHECK(above.findings.empty());
        const Outcome below = drive(baseline.build(), run.build(), {{"forward_threshold", "1MiB"}});
        REQUIRE(below.findings.size() == 1);
        CHECK(below.findings[0].bytes == 1574912);
    }
    SUBCASE("a baseline without layer scopes: logged, baseline-free findings instead") {
        Stream empty;
        empty.step(1);
        Run run(Shape{});
        const Outcome d = drive(empty, run.build());
        REQUIRE(d.logs.size() == 1);
        CHECK(d.logs[0].find("baseline stream has no layer forward scopes") != std::string::npos);
        CHECK(per_layer(d).size() == 4);
        REQUIRE(total(d) != nullptr);
    }
}

TEST_CASE("a bad option value disables the plugin with a message") {
    for (auto [key, value] :
         {std::pair{"forward_threshold", "fifty"}, std::pair{"forward_threshold", "-1"},
          std::pair{"level", "tensor"}, std::pair{"min_numel", "0"}}) {
        CAPTURE(key);
        const Outcome d = drive(Run(Shape{}).build(), {{key, value}});
        CHECK_FALSE(d.enabled);
        CHECK(d.failed_call == "init");
        REQUIRE(d.logs.size() == 1);
        CHECK(d.logs[0].find(key) != std::string::npos);
        CHECK(d.findings.empty());
    }
}

// ---- Evidence levels: proven (DERIVED events) and size-only ----

namespace {

// Whether any finding is a warning or an error.
bool any_warning_or_error(const Outcome& d) {
    for (const CollectedFinding& f : d.findings) {
        if (f.severity >= ALLOCSCOPE_SEVERITY_WARNING) return true;
    }
    return false;
}

// Ends forward with a backward scope that frees `addresses`.
void backward_freeing(Stream& s, std::initializer_list<uint64_t> addresses) {
    s.push("layers.0", "backward");
    for (uint64_t a : addresses)
        s.free(a);
    s.pop();
}

}  // namespace

TEST_CASE(
    "a size-matched copy without provenance is only an info finding and says how to settle it") {
    Shape shape;
    shape.provenance = false;
    Run run(shape);
    const Outcome d = drive(run.build());
    CHECK_FALSE(any_warning_or_error(d));
    CHECK(d.logs.empty());
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 4);
    for (int i = 0; i < 4; ++i) {
        const CollectedFinding& f = *layers[size_t(i)];
        CHECK(f.severity == ALLOCSCOPE_SEVERITY_INFO);
        CHECK(f.basis == "size-only");
        CHECK(f.layer == run.layer(i));
        CHECK(f.bytes == 1574912);  // what the proven run reports as an error
        CHECK(f.count == 12);
        CHECK(f.summary.find("size alone does not show") != std::string::npos);
        CHECK(f.summary.find("allocscope diff BASE CAND") != std::string::npos);
        CHECK(f.summary.find("on by default under allocscope run") != std::string::npos);
        CHECK(f.summary.find("allocscope_derived()") != std::string::npos);
        CHECK(f.summary.find("provenance was off in this run") != std::string::npos);
        REQUIRE(f.evidence.size() == 12);
        // qkv's scale_inv, its FP8 data, its transpose: which form each size
        // is (the largest first: a scale after every data-sized copy).
        auto noted = [&f](const std::string& note) {
            return std::count_if(f.evidence.begin(), f.evidence.end(),
                                 [&note](const auto& e) { return e.note == note; });
        };
        const std::string scale = "size of " + run.layer(i) +
                                  ".attn.qkv.weight's scale (size only); alive after " +
                                  run.layer(i) + "'s forward";
        CHECK(noted(scale) == 1);
        CHECK(noted("size of " + run.layer(i) +
                    ".attn.qkv.weight's FP8 data or transpose (size only); alive after " +
                    run.layer(i) + "'s forward") == 2);
        std::vector<uint64_t> sizes;
        for (const auto& e : f.evidence)
            sizes.push_back(e.size);
        CHECK(std::is_sorted(sizes.begin(), sizes.end(), std::greater<uint64_t>()));
        // The scale, the smallest, comes after every data-sized copy.
        const auto at = std::find_if(f.evidence.begin(), f.evidence.end(),
                                     [&scale](const auto& e) { return e.note == scale; });
        REQUIRE(at != f.evidence.end());
        CHECK(std::all_of(f.evidence.begin(), at,
                          [&at](const auto& e) { return e.size > at->size; }));
    }
    const CollectedFinding* t = total(d);
    REQUIRE(t != nullptr);
    CHECK(t->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(t->basis == "size-only");
    CHECK(t->bytes == 4 * 1574912);
    CHECK(t->summary.find("allocscope diff BASE CAND") != std::string::npos);
}

TEST_CASE("a saved activation whose bytes equal a weight's (T == H) gives no warning or error") {
    // PyTorch module hooks: fc1 ([4H, H], H = 256) saves its output
    // [T, 4H] bf16 for backward under its own tag; with T == H that is
    // 2·numel bytes, a bf16 copy of the weight by size.
    Stream s;
    s.param("layers.0.mlp.fc1", "weight", 1024 * 256, 1024 * 128);
    s.step(1);
    s.push("", "forward");
    s.push("layers.0", "forward");
    s.push("layers.0.mlp", "forward");
    s.push("layers.0.mlp.fc1", "forward");
    const uint64_t saved = s.alloc(0x1000000, 2 * 256 * 1024);
    s.pop();
    s.pop();
    s.pop();
    s.pop();
    backward_freeing(s, {0x1000000});
    const Outcome d = drive(s);
    CHECK_FALSE(any_warning_or_error(d));
    // Reported as what it may be, no more.
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(layers[0]->evidence[0].alloc_seq == saved);
    CHECK(layers[0]->evidence[0].note.find("bf16 copy (size only)") != std::string::npos);
}

TEST_CASE("a proven copy made under a block-level tag is attributed to its parameter's layer") {
    // The whole stack of layers runs under one tag ("layers", a block
    // scope): no scope of layers.3 exists, and the tag encloses no
    // parameter's module, so no size could match.
    Stream s;
    s.param("layers.3.attn.qkv", "weight", 196608, 98304);
    s.step(1);
    s.push("layers", "forward");
    const uint64_t copy = s.alloc(0x100000, 196608);
    s.derived(0x100000, "layers.3.attn.qkv", "weight", "cast to fp8_e4m3 (row-wise)");
    s.alloc(0x200000, 196608);  // the same size, not declared: nothing
    s.pop();
    backward_freeing(s, {0x100000, 0x200000});
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    const CollectedFinding& f = *layers[0];
    CHECK(f.severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(f.basis == "proven");
    CHECK(f.layer == "layers.3");
    CHECK(f.bytes == 196608);
    CHECK(f.count == 1);
    REQUIRE(f.evidence.size() == 1);
    CHECK(f.evidence[0].alloc_seq == copy);
    CHECK(f.evidence[0].layer == "layers");
    CHECK(f.evidence[0].note ==
          "derived from layers.3.attn.qkv.weight: cast to fp8_e4m3 (row-wise); alive after "
          "layers.3's forward");
    const CollectedFinding* t = total(d);
    REQUIRE(t != nullptr);
    CHECK(t->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(t->bytes == 196608);
    CHECK(t->layer == "layers.3");
}

TEST_CASE("proven copies made outside their layer's scope are judged at its next forward pop") {
    SUBCASE("an untagged thread during the layer's forward: judged at the layer's pop") {
        Stream s;
        s.param("layers.3.mlp.fc1", "weight", 262144, 131072);
        s.step(1);
        s.push("layers.3", "forward");
        s.alloc(0x100000, 262144, 2);  // thread 2 has no tag
        s.derived(0x100000, "layers.3.mlp.fc1", "weight", "", 2);
        s.pop();
        s.free(0x100000, 2);  // after layers.3's forward, before the end of forward
        s.push("layers.3", "backward");
        s.pop();
        const Outcome d = drive(s);
        const auto layers = per_layer(d);
        REQUIRE(layers.size() == 1);
        CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(layers[0]->layer == "layers.3");
        CHECK(layers[0]->bytes == 262144);
        CHECK(total(d) == nullptr);  // freed before the end of forward
    }
    SUBCASE("FSDP's all-gather range of the next layer, inside this layer's forward") {
        // Made for layers.4's forward to use: judged when that forward ends,
        // not when the range does.
        Stream s;
        s.param("layers.4.mlp.fc1", "weight", 262144, 131072);
        s.step(1);
        s.push("layers.3", "forward");
        s.push("layers.4", "forward/all_gather");
        s.alloc(0x100000, 524288);
        s.derived(0x100000, "layers.4.mlp.fc1", "weight", "all_gather_copy_in");
        s.pop();
        s.pop();
        s.push("layers.4", "forward");
        s.free(0x100000);  // resharded within layers.4's forward
        s.pop();
        const Outcome d = drive(s);
        CHECK(d.findings.empty());
    }
}

TEST_CASE("a proven copy of an unusual size (not a weight-derived size) is still found") {
    Stream s;
    s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
    s.step(1);
    s.push("layers.0", "forward");
    s.push("layers.0.mlp.fc1", "forward/quantize");
    s.alloc(0x100000, 200001);  // a copy's bytes (more than half a byte per element), no form's
    s.derived(0x100000, "layers.0.mlp.fc1", "weight", "abs -> amax");
    s.pop();
    s.pop();
    backward_freeing(s, {0x100000});
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(layers[0]->bytes == 200001);
    CHECK(layers[0]->layer == "layers.0");
}

TEST_CASE("proven statistics of a weight kept alone (a compiled graph's saved amax) are an info") {
    // A compiled graph may save a weight's amax or scale for backward
    // instead of recomputing it: derived, retained, but no copy.
    auto stream = [](bool with_copy) {
        Stream s;
        s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
        s.step(1);
        s.push("layers.0", "forward");
        s.push("layers.0.mlp.fc1", "forward");
        s.alloc(0x100000, 512);
        s.derived(0x100000, "layers.0.mlp.fc1", "weight", "weight -> abs -> amax");
        if (with_copy) {
            s.alloc(0x200000, 131072);  // the FP8 copy of this rank's shard
            s.derived(0x200000, "layers.0.mlp.fc1", "weight", "weight -> _to_copy");
        }
        s.pop();
        s.pop();
        backward_freeing(s, {0x100000, 0x200000});
        return drive(s);
    };
    const Outcome alone = stream(false);
    const auto layers = per_layer(alone);
    REQUIRE(layers.size() == 1);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(layers[0]->basis == "proven");
    CHECK(layers[0]->bytes == 512);
    CHECK(layers[0]->summary.find("statistics of the weights (scales, amax), not copies") !=
          std::string::npos);
    for (const auto& f : alone.findings)
        CHECK(f.severity != ALLOCSCOPE_SEVERITY_ERROR);

    const Outcome copied = stream(true);
    const auto both = per_layer(copied);
    REQUIRE(both.size() == 1);
    CHECK(both[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(both[0]->bytes == 512 + 131072);
    CHECK(both[0]->summary.find("not copies") == std::string::npos);
}

TEST_CASE(
    "provenance of an earlier allocation at the same address does not carry over to a new "
    "allocation") {
    auto stream = [](bool free_first) {
        Stream s;
        s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
        s.step(1);
        s.push("layers.0", "forward");
        s.push("layers.0.mlp.fc1", "forward/quantize");
        s.alloc(0x100000, 12345);
        s.derived(0x100000, "layers.0.mlp.fc1", "weight");
        if (free_first) s.free(0x100000);  // else a missed free
        s.alloc(0x100000, 12345);          // a new allocation at the address, not declared
        s.pop();
        s.pop();
        backward_freeing(s, {0x100000});
        return s;
    };
    CHECK(drive(stream(true)).findings.empty());
    CHECK(drive(stream(false)).findings.empty());
}

TEST_CASE("a layer with proven and size-only copies: an error and an info, no allocation in both") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.param("layers.0.attn.proj", "weight", 65536, 32768);
    s.step(1);
    s.push("layers.0", "forward");
    s.push("layers.0.attn.qkv", "forward/quantize");
    const uint64_t proven = s.alloc(0x100000, 196608);
    s.derived(0x100000, "layers.0.attn.qkv", "weight", "cast");
    s.pop();
    s.push("layers.0.attn.proj", "forward/quantize");
    const uint64_t sized = s.alloc(0x200000, 65536);  // proj's FP8 size, not declared
    s.pop();
    s.pop();
    backward_freeing(s, {0x100000, 0x200000});
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 2);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(layers[0]->basis == "proven");
    CHECK(layers[0]->bytes == 196608);
    REQUIRE(layers[0]->evidence.size() == 1);
    CHECK(layers[0]->evidence[0].alloc_seq == proven);
    CHECK(layers[1]->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(layers[1]->basis == "size-only");
    CHECK(layers[1]->layer == "layers.0");
    CHECK(layers[1]->bytes == 65536);
    REQUIRE(layers[1]->evidence.size() == 1);
    CHECK(layers[1]->evidence[0].alloc_seq == sized);
    // Provenance was on: it named nothing for this one, which a baseline
    // settles.
    CHECK(layers[1]->summary.find("provenance was on in this run") != std::string::npos);
    CHECK(layers[1]->summary.find("provenance was off") == std::string::npos);
    // The totals at the end of forward split the same way.
    std::vector<const CollectedFinding*> totals;
    for (const CollectedFinding& f : d.findings) {
        if (f.summary.find("alive together") != std::string::npos) totals.push_back(&f);
    }
    REQUIRE(totals.size() == 2);
    CHECK(totals[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(totals[0]->bytes == 196608);
    CHECK(totals[0]->evidence[0].note ==
          "derived from layers.0.attn.qkv.weight: cast; alive at the end of forward");
    CHECK(totals[1]->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(totals[1]->bytes == 65536);
}

TEST_CASE("while provenance is paused no size is matched; what observed steps proved stands") {
    // The PyTorch bridge observes some steps only (ALLOCSCOPE_PROVENANCE_STEPS):
    // step 1 observed (a proven copy), step 2 paused (the same copy, not
    // declared: the observer was not looking), step 3 observed again (an
    // undeclared allocation of a weight-derived size: matched by size).
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.mark(ALLOCSCOPE_PROVENANCE_ON);
    auto forward = [&s](uint64_t address, bool declared) {
        s.push("layers.0", "forward");
        s.push("layers.0.attn.qkv", "forward/quantize");
        const uint64_t seq = s.alloc(address, 196608);
        if (declared) s.derived(address, "layers.0.attn.qkv", "weight", "cast");
        s.pop();
        s.pop();
        backward_freeing(s, {address});
        return seq;
    };
    s.step(1);
    const uint64_t proven = forward(0x100000, true);
    s.step(2);
    s.mark(ALLOCSCOPE_PROVENANCE_PAUSED);
    forward(0x200000, false);
    s.step(3);
    s.mark(ALLOCSCOPE_PROVENANCE_RESUMED);
    const uint64_t sized = forward(0x300000, false);
    const Outcome d = drive(s);
    const auto layers = per_layer(d);
    REQUIRE(layers.size() == 2);
    CHECK(layers[0]->severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(layers[0]->basis == "proven");
    REQUIRE(layers[0]->evidence.size() == 1);
    CHECK(layers[0]->evidence[0].alloc_seq == proven);
    CHECK(layers[0]->summary.find("retained in 1 forward)") != std::string::npos);
    // Only step 3's: step 2's copy, made while paused, is no candidate.
    CHECK(layers[1]->severity == ALLOCSCOPE_SEVERITY_INFO);
    CHECK(layers[1]->basis == "size-only");
    REQUIRE(layers[1]->evidence.size() == 1);
    CHECK(layers[1]->evidence[0].alloc_seq == sized);
    CHECK(layers[1]->summary.find("retained in 1 forward)") != std::string::npos);
}
