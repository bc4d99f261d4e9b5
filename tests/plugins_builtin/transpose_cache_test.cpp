// transpose-cache-retention, driven through its module's exported struct
// (ALLOCSCOPE_TEST_PLUGIN: the built .so) on synthetic streams shaped like the harness's
// quantized-init runs (docs/HARNESS.md) and like PyTorch's backward hooks.
// Expected bytes are the column-wise forms of the reference model's weights
// (docs/TE-FSDP2-FP8-MEMORY.md: 786,432 B per layer, or per shard),
// written out here.
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

enum class Recipe { bf16, delayed_sm90, block, mxfp8 };

// What the backward builds for a quantized-init [R × C] weight after the
// all-gather (harness trainer.cpp build_columnwise): the per-tensor
// transpose on sm90, Float8BlockScaling's column-wise data and scales,
// nothing for MXFP8 (gathered) or bf16; `sharded` divides each by the world.
std::vector<uint64_t> columnwise(Recipe r, uint64_t R, uint64_t C, bool sharded, uint64_t world) {
    std::vector<uint64_t> out;
    if (r == Recipe::delayed_sm90) out = {R * C};
    if (r == Recipe::block) out = {R * C, cdiv(C, 128) * up(cdiv(R, 128), 4) * 4};
    if (sharded) {
        for (uint64_t& b : out)
            b = cdiv(b, world);
    }
    return out;
}

constexpr uint64_t kSaved[] = {32768, 98304, 131072, 196608};
constexpr uint64_t kTokensHidden = 32768;  // bf16 [T × H]
constexpr uint64_t kWorld = 2;

struct Shape {
    Recipe recipe = Recipe::delayed_sm90;
    bool seed = true;      // the column-wise form kept until the layer's next forward
    bool sharded = false;  // --retain sharded
    int layers = 4;
    int steps = 3;
    std::string prefix;         // "model." for a named model root
    bool pytorch = false;       // module-hook nesting on an autograd thread
    uint32_t backward_tid = 1;  // autograd's thread
    bool params = true;
    bool provenance = true;        // DERIVED events for the forms (with params)
    bool optimizer = true;         // an optimizer scope ends each step
    uint64_t warmup_extra = 0;     // bytes step 1's backward allocates and keeps
    bool grads_in_module = false;  // bf16 weight gradients tagged with the module, kept
};

uint64_t retained_per_layer(Recipe r, bool sharded) {
    uint64_t total = 0;
    for (const Weight& w : kWeights) {
        for (uint64_t b : columnwise(r, w.rows, w.cols, sharded, kWorld))
            total += round512(b);
    }
    return total;
}

class Run {
  public:
    explicit Run(Shape shape) : shape_(std::move(shape)) {}

    Stream build() {
        Stream s;
        if (shape_.params) register_params(s);
        s.push("data", "init");
        s.alloc(take(), kTokensHidden);
        s.pop();
        for (int step = 1; step <= shape_.steps; ++step)
            one_step(s, uint64_t(step));
        return s;
    }
    std::string layer(int i) const { return shape_.prefix + "layers." + std::to_string(i); }
    std::string module(int i, const Weight& w) const { return layer(i) + "." + w.module; }
    const std::vector<uint64_t>& kept(int step, int i) const { return kept_.at({step, i}); }
    // seq of the free of an allocation made at `alloc_seq`.
    uint64_t free_of(uint64_t alloc_seq) const { return frees_.at(alloc_seq); }

  private:
    uint64_t take() { return next_ += 0x100000; }

    void register_params(Stream& s) {
        for (int i = 0; i < shape_.layers; ++i) {
            for (const Weight& w : kWeights) {
                const uint64_t n = w.rows * w.cols;
                s.param(module(i, w), "weight", n, n / kWorld,
                        shape_.recipe == Recipe::bf16 ? "bf16" : "delayed");
                s.param(module(i, w), "bias", w.rows, w.rows / kWorld);
            }
        }
    }

    void free(Stream& s, uint64_t address, uint32_t tid = 1) {
        const uint64_t seq = s.free(address, tid);
        auto it = alloc_seq_.find(address);
        if (it != alloc_seq_.end()) {
            frees_[it->second] = seq;
            alloc_seq_.erase(it);
        }
    }

    void one_step(Stream& s, uint64_t step) {
        s.step(step);
        std::vector<std::vector<uint64_t>> saved(size_t(shape_.layers));
        std::vector<uint64_t> outputs;
        for (int i = 0; i < shape_.layers; ++i) {
            s.push(layer(i).c_str(), "forward");
            // The forward asks for row-wise usage: the kept form goes now.
            for (uint64_t a : retained_[size_t(i)])
                free(s, a);
            retained_[size_t(i)].clear();
            std::vector<uint64_t> unsharded;
            s.push(nullptr, "forward/all_gather");
            for (const Weight& w : kWeights) {
                unsharded.push_back(take());
                s.alloc(unsharded.back(), round512(w.rows * w.cols));  // FP8 shards gathered
            }
            s.pop();
            for (uint64_t bytes : kSaved) {
                saved[size_t(i)].push_back(take());
                s.alloc(saved[size_t(i)].back(), bytes);
            }
            outputs.push_back(take());
            s.alloc(outputs.back(), kTokensHidden);
            for (uint64_t a : unsharded)
                s.free(a);
            s.pop();
        }
        s.push("loss", "backward");
        uint64_t dy = take();
        s.alloc(dy, kTokensHidden);
        s.pop();
        const uint32_t tid = shape_.backward_tid;
        std::vector<uint64_t> sharded_grads;
        if (shape_.pytorch) s.push(shape_.prefix.empty() ? "" : "model", "backward", tid);
        for (int i = shape_.layers - 1; i >= 0; --i) {
            s.push(layer(i).c_str(), "backward", tid);
            if (step == 1 && i == shape_.layers - 1 && shape_.warmup_extra)
                s.alloc(take(), shape_.warmup_extra, tid);
            std::vector<uint64_t> unsharded;
            s.push(nullptr, "backward/all_gather", tid);
            for (const Weight& w : kWeights) {
                unsharded.push_back(take());
                s.alloc(unsharded.back(), round512(w.rows * w.cols), tid);
            }
            s.pop(tid);
            std::vector<uint64_t> transient;
            for (const Weight& w : kWeights) {
                const std::string m = module(i, w);
                if (shape_.pytorch) {
                    s.push(m.substr(0, m.rfind('.')).c_str(), "backward", tid);
                    s.push(m.c_str(), "backward", tid);
                } else {
                    s.push(m.c_str(), "backward/transpose", tid);
                }
                for (uint64_t b :
                     columnwise(shape_.recipe, w.rows, w.cols, shape_.sharded, kWorld)) {
                    const uint64_t a = take();
                    const uint64_t seq = s.alloc(a, round512(b), tid);
                    if (shape_.params && shape_.provenance)
                        s.derived(a, m, "weight", "transpose", tid);
                    if (shape_.seed) {
                        retained_[size_t(i)].push_back(a);
                        alloc_seq_[a] = seq;
                        kept_[{int(step), i}].push_back(seq);
                    } else {
                        transient.push_back(a);
                    }
                }
                if (shape_.grads_in_module) {  // a bf16 weight gradient kept until zero_grad
                    sharded_grads.push_back(take());
                    s.alloc(sharded_grads.back(), 2 * w.rows * w.cols, tid);
                }
                s.pop(tid);
                if (shape_.pytorch) s.pop(tid);
            }
            s.push(nullptr, "backward/dgrad", tid);
            const uint64_t dx = take();
            s.alloc(dx, kTokensHidden, tid);
            s.pop(tid);
            for (uint64_t a : transient)  // the fix: gone after dgrad
                s.free(a, tid);
            for (uint64_t a : saved[size_t(i)])
                s.free(a, tid);
            s.free(outputs[size_t(i)], tid);
            s.free(dy, tid);
            dy = dx;
            s.push(nullptr, "backward/reduce_scatter", tid);
            sharded_grads.push_back(take());
            s.alloc(sharded_grads.back(), 2 * 786432 / kWorld, tid);  // tagged with the layer
            s.pop(tid);
            for (uint64_t a : unsharded)
                s.free(a, tid);
            s.pop(tid);
        }
        if (shape_.pytorch) s.pop(tid);
        s.free(dy);
        if (shape_.optimizer) {
            s.push("optimizer", "optimizer");
            for (uint64_t a : sharded_grads)  // zero_grad
                s.free(a);
            s.pop();
        } else {
            for (uint64_t a : sharded_grads)
                s.free(a);
        }
    }

    Shape shape_;
    uint64_t next_ = 0x7f0000000000;
    std::vector<std::vector<uint64_t>> retained_ = std::vector<std::vector<uint64_t>>(64);
    std::map<uint64_t, uint64_t> alloc_seq_;  // address → seq of a kept form
    std::map<uint64_t, uint64_t> frees_;      // alloc seq → free seq
    std::map<std::pair<int, int>, std::vector<uint64_t>> kept_;
};

const CollectedFinding* find_layer(const Outcome& d, const std::string& layer) {
    for (const CollectedFinding& f : d.findings) {
        if (f.layer == layer) return &f;
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
    CHECK(std::string(p->name) == "transpose-cache-retention");
    CHECK(p->event_mask == (ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_PUSH) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_POP) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_PARAM) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_MARK) |
                            ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_DERIVED)));
}

TEST_CASE("retained sizes of the reference model, as the TE doc derives them") {
    CHECK(retained_per_layer(Recipe::delayed_sm90, false) == 786432);
    CHECK(retained_per_layer(Recipe::delayed_sm90, true) == 393216);
    CHECK(retained_per_layer(Recipe::block, false) == 786432 + 4 * 512);
    CHECK(retained_per_layer(Recipe::block, true) == 393216 + 4 * 512);
    CHECK(retained_per_layer(Recipe::mxfp8, false) == 0);
}

TEST_CASE("seed-like column-wise forms kept past backward: one finding per layer") {
    struct Case {
        Recipe recipe;
        bool sharded;
        uint64_t per_layer;
        uint64_t allocations;
    };
    const Case cases[] = {
        {Recipe::delayed_sm90, false, 786432, 4},
        {Recipe::delayed_sm90, true, 393216, 4},
        {Recipe::block, false, 788480, 8},
        {Recipe::block, true, 395264, 8},
    };
    for (const Case& c : cases) {
        CAPTURE(int(c.recipe));
        CAPTURE(c.sharded);
        Shape shape;
        shape.recipe = c.recipe;
        shape.sharded = c.sharded;
        Run run(shape);
        const Stream s = run.build();
        const Outcome d = drive(s);
        CHECK(d.logs.empty());
        REQUIRE(d.findings.size() == 4);
        for (int i = 0; i < 4; ++i) {
            const CollectedFinding* f = find_layer(d, run.layer(i));
            REQUIRE(f != nullptr);
            CHECK(f->plugin == "transpose-cache-retention");
            CHECK(f->severity == ALLOCSCOPE_SEVERITY_ERROR);
            CHECK(f->basis == "proven");
            CHECK(f->phase == "backward");
            CHECK(f->bytes == c.per_layer);
            CHECK(f->count == c.allocations);
            std::vector<uint64_t> seqs;
            std::vector<uint64_t> sizes;
            for (const auto& e : f->evidence) {
                seqs.push_back(e.alloc_seq);
                sizes.push_back(e.size);
                // Every backward retains the same: the latest is reported,
                // still held when the stream ends (no next forward frees it).
                CHECK(e.step == 3);
                CHECK(e.phase == "backward/transpose");
                CHECK(e.layer.rfind(run.layer(i) + ".", 0) == 0);
                CHECK(e.free_seq == 0);
                CHECK(e.note ==
                      "derived from " + e.layer + ".weight: transpose; alive after backward");
            }
            // The largest first: the same allocations, sizes never growing.
            CHECK(std::is_sorted(sizes.begin(), sizes.end(), std::greater<uint64_t>()));
            std::sort(seqs.begin(), seqs.end());
            CHECK(seqs == run.kept(3, i));
            CHECK(f->summary.find("retained after 3 backwards") != std::string::npos);
        }
    }
}

TEST_CASE("fixed-like, MXFP8 (gathered) and bf16 runs give nothing") {
    for (auto [recipe, seed] :
         {std::pair{Recipe::delayed_sm90, false}, std::pair{Recipe::block, false},
          std::pair{Recipe::mxfp8, true}, std::pair{Recipe::bf16, true}}) {
        CAPTURE(int(recipe));
        Shape shape;
        shape.recipe = recipe;
        shape.seed = seed;
        Run run(shape);
        const Outcome d = drive(run.build());
        CHECK(d.findings.empty());
        CHECK(d.logs.empty());
    }
}

TEST_CASE("bf16 weight gradients kept until zero_grad are not column-wise forms") {
    Shape shape;
    shape.recipe = Recipe::mxfp8;  // builds nothing itself
    shape.grads_in_module = true;  // 2·numel, under the module, alive at the optimizer
    Run run(shape);
    const Outcome d = drive(run.build());
    CHECK(d.findings.empty());
}

TEST_CASE("where backward ends") {
    auto stream = [](auto&& after_backward) {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        s.step(1);
        s.push("layers.0", "forward");
        s.pop();
        s.push("layers.0", "backward");
        s.push("layers.0.attn.qkv", "backward/transpose");
        s.alloc(0x100000, 196608);
        s.derived(0x100000, "layers.0.attn.qkv", "weight");
        s.alloc(0x200000, 512);  // a scale next to it
        s.derived(0x200000, "layers.0.attn.qkv", "weight");
        s.pop();
        s.pop();
        after_backward(s);
        return s;
    };
    SUBCASE("at the optimizer scope: a form freed during the optimizer step was retained") {
        const Outcome d = drive(stream([](Stream& s) {
            s.push("optimizer", "optimizer");
            s.free(0x100000);
            s.pop();
        }));
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(d.findings[0].layer == "layers.0");
        CHECK(d.findings[0].bytes == 196608 + 512);
        CHECK(d.findings[0].count == 2);
        CHECK(d.findings[0].evidence[0].free_seq != 0);
        CHECK(d.findings[0].evidence[1].free_seq == 0);
    }
    SUBCASE("freed between the backward scope and the optimizer: not retained") {
        const Outcome d = drive(stream([](Stream& s) {
            s.free(0x100000);
            s.free(0x200000);
            s.push("optimizer", "optimizer");
            s.pop();
        }));
        CHECK(d.findings.empty());
    }
    SUBCASE("at the next forward when there is no optimizer scope") {
        const Outcome d = drive(stream([](Stream& s) {
            s.push("layers.0", "forward");
            s.free(0x100000);
            s.free(0x200000);
            s.pop();
        }));
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 196608 + 512);
    }
    SUBCASE("at the step change") {
        const Outcome d = drive(stream([](Stream& s) {
            s.step(2);
            s.free(0x100000);
        }));
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 196608 + 512);
    }
    SUBCASE("at the end of the stream when every backward scope was left") {
        // The run's last backward (no optimizer step or forward after it,
        // as at the end of a run with gradient accumulation).
        const Outcome d = drive(stream([](Stream&) {}));
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(d.findings[0].bytes == 196608 + 512);
    }
    SUBCASE("a stream that ends inside a backward scope is not judged") {
        // Killed mid-backward (another thread's scope still open): nothing
        // shows that backward was over.
        const Outcome d = drive(stream([](Stream& s) { s.push("layers.1", "backward", 2); }));
        CHECK(d.findings.empty());
    }
}

TEST_CASE("activation recomputation inside backward does not end backward") {
    Stream s;
    s.param("layers.1.attn.qkv", "weight", 196608, 98304);
    s.step(1);
    s.push("layers.1", "backward", 2);
    s.push("layers.1.attn.qkv", "backward/transpose", 2);
    s.alloc(0x100000, 196608, 2);
    s.derived(0x100000, "layers.1.attn.qkv", "weight", "", 2);
    s.pop(2);
    s.pop(2);
    s.push("layers.0", "backward", 2);
    s.push("layers.0", "forward", 2);  // checkpointed layer 0 re-run by autograd
    s.pop(2);
    s.free(0x100000, 2);  // layer 1's form goes before backward ends
    s.pop(2);
    s.push("optimizer", "optimizer");
    s.pop();
    const Outcome d = drive(s);
    CHECK(d.findings.empty());
}

TEST_CASE("scale-sized allocations alone, untagged ones and forward ones are ignored") {
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 98304);
    s.step(1);
    s.push("layers.0", "forward");
    s.push("layers.0.attn.qkv", "forward/quantize");
    s.alloc(0x100000, 196608);  // problem 1's, not this plugin's
    s.pop();
    s.pop();
    s.push("layers.0", "backward");
    s.alloc(0x200000, 196608);  // tagged with the layer: an activation gradient
    s.push("layers.0.attn.qkv", "backward/transpose");
    s.alloc(0x300000, 512);        // scale-sized, no data-sized form next to it
    s.alloc(0x400000, 196608, 4);  // another thread, untagged
    s.pop();
    s.pop();
    s.alloc(0x500000, 196608);  // untagged
    s.push("optimizer", "optimizer");
    s.pop();
    const Outcome d = drive(s);
    CHECK(d.findings.empty());
}

TEST_CASE("scale-sized allocations kept without a kept data-sized form are not retention") {
    // Gradient accumulation without gradient sync (FSDP2's
    // set_requires_gradient_sync(False)): the fixed recipe builds its
    // column-wise form in backward and frees it, while the module's bias
    // gradient (1536 B: a size some weight shape's block scales also have)
    // stays alive into the next micro-batch.
    Stream s;
    s.param("layers.0.attn.qkv", "weight", 196608, 196608);
    s.step(1);
    for (int micro = 0; micro < 2; ++micro) {
        s.push("layers.0", "forward");
        s.pop();
        s.push("layers.0", "backward");
        s.push("layers.0.attn.qkv", "backward");
        s.alloc(0x100000, 196608);  // the column-wise form, freed in backward
        s.alloc(0x200000 + uint64_t(micro) * 0x1000, 1536);  // the accumulated bias gradient
        s.free(0x100000);
        s.pop();
        s.pop();
    }
    s.push("optimizer", "optimizer");
    s.pop();
    const Outcome d = drive(s);
    CHECK(d.findings.empty());
}

TEST_CASE("a kept bias gradient beside a kept column-wise form is the bias's, not a scale") {
    // Gradient accumulation under the seed recipe: the column-wise form and
    // the bias gradient (1536 B, a size some factorization of the weight
    // gives block scales) both outlive backward.
    auto stream = [](const char* bias_layer, uint64_t bias_numel) {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 196608);
        if (bias_layer) s.param(bias_layer, "bias", bias_numel, bias_numel, "bf16");
        s.step(1);
        s.push("layers.0", "forward");
        s.pop();
        s.push("layers.0", "backward");
        s.push("layers.0.attn.qkv", "backward");
        s.alloc(0x100000, 196608);  // the column-wise form, kept
        s.alloc(0x200000, 1536);    // the bias gradient, kept for the next micro-batch
        s.pop();
        s.pop();
        s.push("optimizer", "optimizer");
        s.pop();
        return s;
    };
    auto retained = [](const Stream& s) {
        const Outcome d = drive(s);
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_INFO);  // sizes only
        CHECK(d.findings[0].layer == "layers.0");
        return d.findings[0].bytes;
    };
    // 768 bf16 elements: 1536 B.
    CHECK(retained(stream("layers.0.attn.qkv", 768)) == 196608);
    // 384 bf16 elements with an fp32 gradient (FSDP2's reduce_dtype): 1536 B.
    CHECK(retained(stream("layers.0.attn.qkv", 384)) == 196608);
    // A norm's weight elsewhere in the same numbered layer.
    CHECK(retained(stream("layers.0.norm", 768)) == 196608);
    // Nothing explains the 1536 B: no bias, or one of another layer.
    CHECK(retained(stream(nullptr, 0)) == 196608 + 1536);
    CHECK(retained(stream("layers.1.attn.qkv", 768)) == 196608 + 1536);
    // A bias whose gradient has another size (1000 bf16: 2000 B).
    CHECK(retained(stream("layers.0.attn.qkv", 1000)) == 196608 + 1536);
}

TEST_CASE("autograd threads, frees from other threads, unknown frees, address reuse") {
    SUBCASE("backward on thread 5, optimizer on thread 1") {
        Shape shape;
        shape.backward_tid = 5;
        Run run(shape);
        const Outcome d = drive(run.build());
        REQUIRE(d.findings.size() == 4);
        CHECK(find_layer(d, "layers.2")->bytes == 786432);
    }
    SUBCASE("reuse of a freed form's address and unknown frees") {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        s.step(1);
        s.free(0xabc);  // unknown
        s.push("layers.0", "backward", 2);
        s.push("layers.0.attn.qkv", "backward/transpose", 2);
        s.alloc(0x100000, 196608, 2);
        s.free(0x100000, 3);  // freed by another thread
        const uint64_t again = s.alloc(0x100000, 196608, 2);
        s.free(0x999999, 3);  // unknown
        s.pop(2);
        s.pop(2);
        s.push("optimizer", "optimizer");
        s.pop();
        s.step(2);
        s.push("layers.0", "backward", 2);
        s.free(0x100000, 3);
        s.alloc(0x100000, 4096, 2);  // the address again, tagged with the layer
        s.pop(2);
        const Outcome d = drive(s);
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 196608);
        CHECK(d.findings[0].count == 1);
        REQUIRE(d.findings[0].evidence.size() == 1);
        CHECK(d.findings[0].evidence[0].alloc_seq == again);
        CHECK(d.findings[0].evidence[0].free_seq == again + 8);  // the free in step 2
    }
}

TEST_CASE("PyTorch-style nesting: attributed to the numbered layer, not the model root") {
    Shape shape;
    shape.pytorch = true;
    shape.prefix = "model.";
    shape.backward_tid = 3;
    Run run(shape);
    const Outcome d = drive(run.build());
    REQUIRE(d.findings.size() == 4);
    const CollectedFinding* f = find_layer(d, "model.layers.1");
    REQUIRE(f != nullptr);
    CHECK(f->bytes == 786432);
    CHECK(f->evidence[0].phase == "backward");
    CHECK(f->evidence[0].layer == "model.layers.1.mlp.fc1");  // the largest (4H x H), first made
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

    Stream registered;  // registered parameters, nothing else: nothing to say
    registered.param("layers.0.attn.qkv", "weight", 196608, 98304);
    CHECK(drive(registered).logs.empty());
}

TEST_CASE("shard-sized forms: from sharded_numel, else from the world size") {
    auto stream = [](uint64_t sharded_numel) {
        Stream s;
        s.param("layers.0.mlp.fc1", "weight", 262144, sharded_numel);
        s.push("layers.0", "backward");
        s.push("layers.0.mlp.fc1", "backward/transpose");
        s.alloc(0x100000, 65536);  // a quarter of the FP8 transpose
        s.pop();
        s.pop();
        s.push("optimizer", "optimizer");
        s.pop();
        return s;
    };
    {  // a 4-way shard (HSDP: the world may be larger than the shard group)
        const Outcome d = drive(stream(65536), {}, 8, 1);
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 65536);
        CHECK(d.findings[0].layer == "layers.0");
    }
    {  // shard size not registered: the host's world size
        const Outcome d = drive(stream(262144), {}, 4, 1);
        REQUIRE(d.findings.size() == 1);
    }
    {  // neither: no shard-sized forms (65536 is only some shape's scale size)
        const Outcome d = drive(stream(262144), {}, 0, -1);
        CHECK(d.findings.empty());
    }
}

TEST_CASE("baseline mode: post-backward minus post-forward, run minus baseline") {
    Shape base_shape;
    base_shape.recipe = Recipe::bf16;

    SUBCASE("seed over bf16: one finding with the retained forms as excess") {
        Shape run_shape;
        run_shape.warmup_extra = 16 << 20;  // kept from step 1 on: the warm-up is excluded
        Run baseline(base_shape), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        const CollectedFinding& f = d.findings[0];
        CHECK(f.severity == ALLOCSCOPE_SEVERITY_ERROR);
        CHECK(f.basis == "baseline");
        CHECK(f.phase == "backward");
        CHECK(f.layer == "layers");
        CHECK(f.bytes == 4 * 786432);
        CHECK(f.count == 4 * 4);
        CHECK(f.summary.find("2 steps after the warm-up step") != std::string::npos);
        CHECK(f.summary.find("1.00 MiB (1048576 B)") != std::string::npos);
    }
    SUBCASE("the sharded preset") {
        Shape run_shape;
        run_shape.sharded = true;
        Run baseline(base_shape), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 4 * 393216);
    }
    SUBCASE("the warm-up step counts when it is the only step") {
        Shape run_shape;
        run_shape.steps = 1;
        run_shape.warmup_extra = 1 << 20;
        Shape b = base_shape;
        b.steps = 1;
        Run baseline(b), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        CHECK(d.findings[0].bytes == 4 * 786432 + (1 << 20));
    }
    SUBCASE("fixed against bf16: nothing") {
        Shape run_shape;
        run_shape.seed = false;
        Run baseline(base_shape), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        CHECK(d.findings.empty());
        CHECK(d.logs.empty());
    }
    SUBCASE("the threshold is an option") {
        Run baseline(base_shape), run(Shape{});
        const Outcome high = drive(baseline.build(), run.build(),
                                   {{"backward_threshold", "3MiB"}});  // 3145728: equal, not over
        CHECK(high.findings.empty());
        const Outcome low =
            drive(baseline.build(), run.build(), {{"backward_threshold", "3145727"}});
        REQUIRE(low.findings.size() == 1);
    }
    SUBCASE("steps ended by the step change instead of an optimizer scope") {
        Shape b = base_shape;
        b.optimizer = false;
        Shape run_shape;
        run_shape.optimizer = false;
        Run baseline(b), run(run_shape);
        const Outcome d = drive(baseline.build(), run.build());
        REQUIRE(d.findings.size() == 1);
        // Only steps 1 and 2 end with a step change; step 1 is the warm-up.
        CHECK(d.findings[0].bytes == 4 * 786432);
        CHECK(d.findings[0].summary.find("1 step after the warm-up") != std::string::npos);
    }
    SUBCASE("a baseline without a complete backward: logged, baseline-free findings") {
        Stream empty;
        empty.step(1);
        Run run(Shape{});
        const Outcome d = drive(empty, run.build());
        REQUIRE(d.logs.size() == 1);
        CHECK(d.logs[0].find("baseline stream has no complete backward") != std::string::npos);
        CHECK(d.findings.size() == 4);
    }
}

TEST_CASE("a bad option value disables the plugin with a message") {
    for (auto [key, value] :
         {std::pair{"backward_threshold", "lots"}, std::pair{"backward_threshold", "12XB"},
          std::pair{"level", "blocks"}, std::pair{"min_numel", "many"}}) {
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

bool any_warning_or_error(const Outcome& d) {
    for (const CollectedFinding& f : d.findings) {
        if (f.severity >= ALLOCSCOPE_SEVERITY_WARNING) return true;
    }
    return false;
}

}  // namespace

TEST_CASE(
    "a size-matched form without provenance is only an info finding and says how to settle it") {
    Shape shape;
    shape.provenance = false;
    Run run(shape);
    const Outcome d = drive(run.build());
    CHECK_FALSE(any_warning_or_error(d));
    REQUIRE(d.findings.size() == 4);
    for (int i = 0; i < 4; ++i) {
        const CollectedFinding* f = find_layer(d, run.layer(i));
        REQUIRE(f != nullptr);
        CHECK(f->severity == ALLOCSCOPE_SEVERITY_INFO);
        CHECK(f->basis == "size-only");
        CHECK(f->bytes == 786432);  // what the proven run reports as an error
        CHECK(f->summary.find("size alone does not show") != std::string::npos);
        CHECK(f->summary.find("allocscope diff BASE CAND") != std::string::npos);
        CHECK(f->summary.find("on by default under allocscope run") != std::string::npos);
        REQUIRE(f->evidence.size() == 4);
        // The largest first: fc1's (4H x H), made before fc2's of that size.
        CHECK(f->evidence[0].note == "size of " + run.layer(i) +
                                         ".mlp.fc1.weight's FP8 data or transpose (size only); "
                                         "alive after backward");
    }
}

TEST_CASE("a sharded bf16 gradient whose bytes equal an FP8 transpose gives no warning or error") {
    // Two ranks: fc1's bf16 gradient shard (numel/2 elements) is numel
    // bytes, the size of its FP8 transpose, and lives until the optimizer.
    Stream s;
    s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
    s.step(1);
    s.push("layers.0", "backward");
    s.push("layers.0.mlp.fc1", "backward");
    s.alloc(0x100000, 2 * 131072);
    s.pop();
    s.pop();
    s.push("optimizer", "optimizer");
    s.free(0x100000);
    s.pop();
    const Outcome d = drive(s);
    CHECK_FALSE(any_warning_or_error(d));
    REQUIRE(d.findings.size() == 1);
    CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_INFO);
}

TEST_CASE("a proven transpose built in backward/all_gather outside the GEMM module is found") {
    // Tagged with the layer (FSDP's range), not the GEMM module: no
    // parameter's module encloses the tag, so no size could match.
    Stream s;
    s.param("layers.1.attn.qkv", "weight", 196608, 98304);
    s.step(1);
    s.push("layers.1", "backward", 3);
    s.push(nullptr, "backward/all_gather", 3);
    const uint64_t form = s.alloc(0x100000, 196608, 3);
    s.derived(0x100000, "layers.1.attn.qkv", "weight", "all_gather -> transpose", 3);
    s.alloc(0x200000, 196608, 3);  // the same size, not declared: nothing
    s.pop(3);
    s.pop(3);
    s.push("optimizer", "optimizer");
    s.pop();
    const Outcome d = drive(s);
    REQUIRE(d.findings.size() == 1);
    const CollectedFinding& f = d.findings[0];
    CHECK(f.severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(f.basis == "proven");
    CHECK(f.layer == "layers.1");
    CHECK(f.bytes == 196608);
    REQUIRE(f.evidence.size() == 1);
    CHECK(f.evidence[0].alloc_seq == form);
    CHECK(f.evidence[0].phase == "backward/all_gather");
    CHECK(f.evidence[0].note ==
          "derived from layers.1.attn.qkv.weight: all_gather -> transpose; alive after backward");
}

TEST_CASE(
    "a proven form made by an untagged thread during backward belongs to its parameter's "
    "layer") {
    Stream s;
    s.param("model.layers.2.mlp.fc2", "weight", 262144, 131072);
    s.step(1);
    s.push("model.layers.2", "backward");
    s.alloc(0x100000, 262921, 4);  // thread 4: no tag; an unusual size, a copy's bytes
    s.derived(0x100000, "model.layers.2.mlp.fc2", "weight", "", 4);
    s.pop();
    s.push("optimizer", "optimizer");
    s.pop();
    const Outcome d = drive(s);
    REQUIRE(d.findings.size() == 1);
    CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(d.findings[0].layer == "model.layers.2");
    CHECK(d.findings[0].bytes == 262921);
    CHECK(d.findings[0].evidence[0].note ==
          "derived from model.layers.2.mlp.fc2.weight; alive after backward");
}

TEST_CASE(
    "provenance of an earlier allocation at the same address does not carry over to a new "
    "allocation") {
    auto stream = [](bool free_first) {
        Stream s;
        s.param("layers.0.attn.qkv", "weight", 196608, 98304);
        s.step(1);
        s.push("layers.0", "backward");
        s.push("layers.0.attn.qkv", "backward/transpose");
        s.alloc(0x100000, 4000);
        s.derived(0x100000, "layers.0.attn.qkv", "weight");
        if (free_first) s.free(0x100000);  // else a missed free
        s.alloc(0x100000, 4000);           // a new allocation at the address, not declared
        s.pop();
        s.pop();
        s.push("optimizer", "optimizer");
        s.pop();
        return s;
    };
    CHECK(drive(stream(true)).findings.empty());
    CHECK(drive(stream(false)).findings.empty());
}

TEST_CASE("while provenance is paused no size is matched in backward; proven forms stand") {
    Stream s;
    s.param("layers.0.mlp.fc1", "weight", 262144, 131072);
    s.mark(ALLOCSCOPE_PROVENANCE_ON);
    auto backward = [&s](uint64_t address, bool declared) {
        s.push("layers.0", "backward");
        s.push("layers.0.mlp.fc1", "backward");
        const uint64_t seq = s.alloc(address, 262144);  // the FP8 transpose's size
        if (declared) s.derived(address, "layers.0.mlp.fc1", "weight", "transpose");
        s.pop();
        s.pop();
        s.push("optimizer", "optimizer");
        s.pop();
        return seq;
    };
    s.step(1);
    const uint64_t proven = backward(0x100000, true);
    s.step(2);
    s.mark(ALLOCSCOPE_PROVENANCE_PAUSED);
    backward(0x200000, false);  // kept, undeclared, while paused: nothing
    const Outcome d = drive(s);
    REQUIRE(d.findings.size() == 1);
    CHECK(d.findings[0].severity == ALLOCSCOPE_SEVERITY_ERROR);
    CHECK(d.findings[0].basis == "proven");
    REQUIRE(d.findings[0].evidence.size() == 1);
    CHECK(d.findings[0].evidence[0].alloc_seq == proven);

    // The same stream without the pause: step 2's form is a size match.
    Stream t;
    t.param("layers.0.mlp.fc1", "weight", 262144, 131072);
    t.mark(ALLOCSCOPE_PROVENANCE_ON);
    t.step(1);
    t.push("layers.0", "backward");
    t.push("layers.0.mlp.fc1", "backward");
    t.alloc(0x200000, 262144);
    t.pop();
    t.pop();
    t.push("optimizer", "optimizer");
    t.pop();
    const Outcome e = drive(t);
    REQUIRE(e.findings.size() == 1);
    CHECK(e.findings[0].basis == "size-only");
}
