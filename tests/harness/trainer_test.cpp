// The trainer's memory behaviour against the reference test's method
// (TE-FSDP2-FP8-MEMORY.md): per-layer forward increments sampled after each
// layer's reshard, and post-backward minus post-forward, one rank in process.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "alloc/caching_allocator.h"
#include "collective/communicator.h"
#include "trainer/trainer.h"

using namespace allocscope::harness;
using namespace allocscope::harness::trainer;

namespace {

struct Run {
    std::vector<StepResult> steps;
    std::vector<std::pair<size_t, bool>> block_events;  // (size, alloc?) in order
};

Run run(const Options& options, fp8::Arch arch = fp8::Arch::sm90) {
    static std::atomic<int> counter{0};
    std::string rendezvous =
        "trainer-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    collective::Communicator comm({0, 1, 0}, rendezvous);
    Run out;
    alloc::BlockEventSink sink{[&](void*, size_t size, int, alloc::Stream) {
                                   out.block_events.push_back({size, true});
                               },
                               [&](void*) {
                                   out.block_events.push_back({0, false});
                               },
                               nullptr};
    alloc::CachingAllocator allocator(0, alloc::cuda_runtime_segments(0), sink);
    {
        std::unique_ptr<Compute> compute = make_host_compute(comm, layer_config(options.shape));
        Trainer trainer(options, arch, allocator, comm, *compute);
        for (int s = 0; s < options.steps; ++s)
            out.steps.push_back(trainer.step(s));
    }
    return out;
}

Options reference(fp8::Recipe recipe, TeBehaviour te = TeBehaviour::seed, int steps = 2) {
    Options o;
    o.recipe = recipe;
    o.te = te;
    o.steps = steps;
    o.warmup = 1;
    return o;
}

// The reference layer with fewer layers: per-layer sizes depend on hidden and
// ffn only, and the sanitizer build runs these tests several times slower.
Options short_reference(fp8::Recipe recipe, TeBehaviour te = TeBehaviour::seed) {
    Options o = reference(recipe, te);
    o.shape.layers = 2;
    return o;
}

// Mean of the per-layer forward increments of the last step.
double mean_increment(const Run& r) {
    const auto& a = r.steps.back().memory.after_layer_forward;
    return (double(a.back()) - double(a.front())) / double(a.size() - 1);
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

TEST_CASE("bf16 per-layer forward increments are uniform and equal the saved activations") {
    Run r = run(reference(fp8::Recipe::bf16));
    const auto& a = r.steps.back().memory.after_layer_forward;
    REQUIRE(a.size() == 8);
    std::vector<double> inc;
    for (size_t i = 1; i < a.size(); ++i)
        inc.push_back(double(a[i]) - double(a[i - 1]));
    double mean = mean_increment(r);
    for (double v : inc)
        CHECK(std::abs(v - mean) <= 0.10 * mean + 1024);
    // TE doc: bf16 saved activations per layer ~ 516 KiB (16TH + 4TF + small).
    CHECK(mean == doctest::Approx(516.0 * 1024).epsilon(0.01));
}

TEST_CASE("two identical bf16 runs have the same backward delta and block sequence") {
    Run a = run(short_reference(fp8::Recipe::bf16));
    Run b = run(short_reference(fp8::Recipe::bf16));
    auto delta = [](const Run& r) {
        const StepMemory& m = r.steps.back().memory;
        return double(m.after_backward) - double(m.after_forward);
    };
    CHECK(std::abs(delta(a) - delta(b)) <= 256 * 1024);
    CHECK(a.block_events == b.block_events);
    CHECK(a.block_events.size() > 300);
}

TEST_CASE("seed behaviour: each FP8 recipe's forward increment exceeds bf16 by the weight copy") {
    // TE-FSDP2-FP8-MEMORY.md, problem 1: derived per-layer copy size Q.
    struct Case {
        fp8::Recipe recipe;
        fp8::Arch arch;
        double q_mib;
    };
    const double bf16 = mean_increment(run(short_reference(fp8::Recipe::bf16)));
    for (Case c : {Case{fp8::Recipe::delayed, fp8::Arch::sm100, 0.752},
                   Case{fp8::Recipe::delayed, fp8::Arch::sm90, 1.502},
                   Case{fp8::Recipe::current, fp8::Arch::sm90, 1.502},
                   Case{fp8::Recipe::mxfp8, fp8::Arch::sm90, 1.547},
                   Case{fp8::Recipe::block, fp8::Arch::sm90, 1.504},
                   Case{fp8::Recipe::nvfp4, fp8::Arch::sm90, 0.848}}) {
        CAPTURE(to_string(c.recipe));
        CAPTURE(int(c.arch));
        double excess = mean_increment(run(short_reference(c.recipe), c.arch)) - bf16;
        CHECK(excess / kMiB == doctest::Approx(c.q_mib).epsilon(0.05));
        CHECK(excess > 50 * 1024);  // the reference test's threshold flags it
    }
}

TEST_CASE("fixed behaviour: no FP8 weight copy outlives the forward") {
    const double bf16 = mean_increment(run(short_reference(fp8::Recipe::bf16)));
    for (fp8::Recipe recipe : {fp8::Recipe::delayed, fp8::Recipe::mxfp8, fp8::Recipe::nvfp4}) {
        CAPTURE(to_string(recipe));
        double excess = mean_increment(run(short_reference(recipe, TeBehaviour::fixed))) - bf16;
        CHECK(std::abs(excess) <= 50 * 1024);
    }
}

TEST_CASE("the loss decreases over 20 steps for every recipe") {
    for (fp8::Recipe recipe : {fp8::Recipe::bf16, fp8::Recipe::delayed, fp8::Recipe::current,
                               fp8::Recipe::block, fp8::Recipe::mxfp8, fp8::Recipe::nvfp4}) {
        CAPTURE(to_string(recipe));
        Options o = reference(recipe, TeBehaviour::seed, 20);
        o.shape = {2, 128, 256, 4, 16, 2};
        Run r = run(o);
        CHECK(r.steps.back().loss < 0.8 * r.steps.front().loss);
    }
}

TEST_CASE("quantized init, seed behaviour: column-wise forms built in backward outlive it") {
    // TE-FSDP2-FP8-MEMORY.md, problem 2: one transposed weight per layer,
    // 786,432 B with the full preset, kept until the layer's next forward.
    // Measured as post-backward minus post-forward of --te seed against the
    // same run with --te fixed: with quantized init the FP8 all-gather buffer
    // kept after forward is smaller than bf16's, so bf16 is not the baseline
    // that isolates the retained forms. (These runs have one rank, where the
    // sharded preset equals the full one; a 2-rank run halves it.)
    auto delta = [](const Run& r) {
        const StepMemory& m = r.steps.back().memory;
        return double(m.after_backward) - double(m.after_forward);
    };
    struct Case {
        fp8::Recipe recipe;
        fp8::Arch arch;
        Retain retain;
        double per_layer;
    };
    for (Case c : {Case{fp8::Recipe::delayed, fp8::Arch::sm90, Retain::full, 786432},
                   Case{fp8::Recipe::current, fp8::Arch::sm90, Retain::sharded, 786432},
                   Case{fp8::Recipe::block, fp8::Arch::sm100, Retain::full, 786432},
                   Case{fp8::Recipe::delayed, fp8::Arch::sm100, Retain::full, 0},
                   Case{fp8::Recipe::mxfp8, fp8::Arch::sm90, Retain::full, 0}}) {
        CAPTURE(to_string(c.recipe));
        CAPTURE(int(c.arch));
        Options seed = short_reference(c.recipe);
        seed.quantized_init = true;
        seed.retain = c.retain;
        Options fixed = seed;
        fixed.te = TeBehaviour::fixed;
        Run r = run(seed, c.arch);
        Run f = run(fixed, c.arch);
        const double excess = delta(r) - delta(f);
        CHECK(excess == doctest::Approx(2 * c.per_layer).epsilon(0.05).scale(1024));
        // Still there after the optimizer step: they go at the next forward.
        const double after_step = double(r.steps.back().memory.after_optimizer) -
                                  double(f.steps.back().memory.after_optimizer);
        CHECK(after_step == doctest::Approx(2 * c.per_layer).epsilon(0.05).scale(1024));
    }
}
