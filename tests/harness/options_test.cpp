#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "alloc/caching_allocator.h"
#include "collective/communicator.h"
#include "trainer/options.h"
#include "trainer/trainer.h"

using namespace allocscope::harness;
using namespace allocscope::harness::trainer;

namespace {
ParseResult parse(std::vector<std::string> args) {
    return parse_options(args);
}
}  // namespace

TEST_CASE("defaults are the reference test's model on 2 ranks, delayed scaling, seed behaviour") {
    ParseResult r = parse({});
    REQUIRE(r.error.empty());
    const Options& o = r.options;
    CHECK(o.backend == Backend::auto_select);
    CHECK(o.ranks == 2);
    CHECK(o.recipe == fp8::Recipe::delayed);
    CHECK(!o.quantized_init);
    CHECK(o.te == TeBehaviour::seed);
    CHECK(!o.arch.has_value());
    CHECK(o.retain == Retain::full);
    CHECK(o.shape.layers == 8);
    CHECK(o.shape.hidden == 256);
    CHECK(o.shape.ffn == 1024);
    CHECK(o.shape.heads == 8);
    CHECK(o.shape.tokens() == 64);
    CHECK(o.warmup == 2);
}

TEST_CASE("every documented flag is parsed") {
    ParseResult r = parse(
        {"--backend", "sim",      "--ranks", "4",     "--recipe", "mxfp8",   "--quantized-init",
         "--te",      "fixed",    "--arch",  "sm100", "--retain", "sharded", "--layers",
         "2",         "--hidden", "64",      "--ffn", "128",      "--heads", "4",
         "--seq",     "16",       "--batch", "2",     "--steps",  "5",       "--warmup",
         "1",         "--seed",   "7"});
    REQUIRE(r.error.empty());
    const Options& o = r.options;
    CHECK(o.backend == Backend::sim);
    CHECK(o.ranks == 4);
    CHECK(o.recipe == fp8::Recipe::mxfp8);
    CHECK(o.quantized_init);
    CHECK(o.te == TeBehaviour::fixed);
    CHECK(o.arch == fp8::Arch::sm100);
    CHECK(o.retain == Retain::sharded);
    CHECK(o.shape.layers == 2);
    CHECK(o.shape.hidden == 64);
    CHECK(o.shape.ffn == 128);
    CHECK(o.shape.heads == 4);
    CHECK(o.shape.seq == 16);
    CHECK(o.steps == 5);
    CHECK(o.warmup == 1);
    CHECK(o.seed == 7);
}

TEST_CASE("invalid combinations are refused with one message naming the problem") {
    CHECK(parse({"--recipe", "nvfp4", "--quantized-init"}).error.find("nvfp4") !=
          std::string::npos);
    CHECK(parse({"--heads", "7"}).error == "--heads 7 does not divide --hidden 256");
    CHECK(parse({"--recipe", "fp16"}).error ==
          "unknown recipe 'fp16' (bf16|delayed|current|block|mxfp8|nvfp4)");
    CHECK(parse({"--ranks", "0"}).error.find("--ranks expects an integer from 1") == 0);
    CHECK(parse({"--layers", "x"}).error.find("got 'x'") != std::string::npos);
    CHECK(parse({"--steps"}).error == "--steps needs a value");
    CHECK(parse({"--frobnicate", "1"}).error == "unknown option '--frobnicate' (see --help)");
    CHECK(parse({"--warmup", "10", "--steps", "10"}).error.find("--warmup 10") == 0);
    CHECK(parse({"--recipe", "bf16", "--quantized-init"}).error.find("bf16") != std::string::npos);
    CHECK(parse({"--recipe", "mxfp8", "--hidden", "48", "--heads", "4"}).error ==
          "--recipe mxfp8 needs --hidden to be a multiple of 32, got 48");
    CHECK(parse({"--recipe", "nvfp4", "--seq", "3", "--batch", "2"}).error.find("tokens") !=
          std::string::npos);
}

TEST_CASE("--nvtx tags through NVTX ranges instead of the C API, which stays the default") {
    CHECK(parse({}).options.tagging == Tagging::c_api);
    ParseResult r = parse({"--ranks", "1", "--nvtx", "--steps", "3"});
    REQUIRE(r.error.empty());
    CHECK(r.options.tagging == Tagging::nvtx);
    CHECK(r.options.steps == 3);
    CHECK(usage().find("--nvtx") != std::string::npos);
}

TEST_CASE("--no-provenance switches the declarations off; they are on by default") {
    CHECK(parse({}).options.provenance);
    ParseResult r = parse({"--no-provenance", "--recipe", "current"});
    REQUIRE(r.error.empty());
    CHECK(!r.options.provenance);
    CHECK(r.options.recipe == fp8::Recipe::current);
    CHECK(usage().find("--no-provenance") != std::string::npos);
}

TEST_CASE("block quantized init needs shards of whole 128-row blocks") {
    // hidden 256: qkv has 768 rows, 384 per rank on 2 ranks, 192 on 4.
    CHECK(parse({"--recipe", "block", "--quantized-init", "--ranks", "2"}).error.empty());
    const std::string e = parse({"--recipe", "block", "--quantized-init", "--ranks", "4"}).error;
    CHECK(e.find("--recipe block --quantized-init with 4 ranks: attn.qkv.weight (768 rows)") == 0);
    CHECK(parse({"--recipe", "block", "--ranks", "4"}).error.empty());
    CHECK(parse({"--recipe", "delayed", "--quantized-init", "--ranks", "4"}).error.empty());
    Options o = parse({"--recipe", "block", "--quantized-init"}).options;
    CHECK(check_quantized_init_shards(o, 2).empty());
    CHECK(!check_quantized_init_shards(o, 3).empty());
}

TEST_CASE("more ranks than GPUs is refused on the cuda backend only") {
    Options o = parse({"--ranks", "4"}).options;
    CHECK(check_devices(o, Backend::cuda, 2) == "--ranks 4 needs as many GPUs, but 2 are visible");
    CHECK(check_devices(o, Backend::cuda, 4).empty());
    CHECK(check_devices(o, Backend::sim, 0).empty());
}

TEST_CASE("--help is recognised anywhere and the usage names every flag") {
    CHECK(parse({"--ranks", "2", "--help"}).help);
    std::string u = usage();
    for (const char* flag :
         {"--backend", "--ranks", "--recipe", "--quantized-init", "--te", "--arch", "--retain",
          "--layers", "--hidden", "--ffn", "--heads", "--seq", "--batch", "--steps", "--warmup",
          "--seed", "--inject", "--nvtx", "--no-provenance"}) {
        CAPTURE(flag);
        CHECK(u.find(flag) != std::string::npos);
    }
}

TEST_CASE("--inject: each form, repeatable, none by default") {
    CHECK(!parse({}).options.inject.any());
    ParseResult r = parse({"--inject", "retain-activation:3", "--inject", "grow-optimizer",
                           "--inject", "leak-rank:1"});
    REQUIRE(r.error.empty());
    const Injections& i = r.options.inject;
    CHECK(i.retain_activation == 3);
    CHECK(i.grow_optimizer);
    CHECK(i.leak_rank == 1);
    CHECK(i.any());
    // The layer and rank are checked against --layers and --ranks given
    // after them.
    r = parse({"--inject", "retain-activation:9", "--layers", "10", "--inject", "leak-rank:3",
               "--ranks", "4"});
    REQUIRE(r.error.empty());
    CHECK(r.options.inject.retain_activation == 9);
    CHECK(r.options.inject.leak_rank == 3);
    CHECK(!r.options.inject.grow_optimizer);
}

TEST_CASE("--inject: an invalid value is one message naming it") {
    CHECK(parse({"--inject", "leak"}).error ==
          "unknown --inject value 'leak' (retain-activation:LAYER|grow-optimizer|leak-rank:RANK)");
    CHECK(parse({"--inject", "grow-optimizer:2"})
              .error.find("unknown --inject value "
                          "'grow-optimizer:2'") == 0);
    CHECK(parse({"--inject", "retain-activation"}).error ==
          "--inject retain-activation expects retain-activation:N with N from 0 to 1023, got "
          "'retain-activation'");
    CHECK(parse({"--inject", "retain-activation:x"}).error.find("got 'retain-activation:x'") !=
          std::string::npos);
    CHECK(parse({"--inject", "leak-rank:-1"}).error ==
          "--inject leak-rank expects leak-rank:N with N from 0 to 63, got 'leak-rank:-1'");
    CHECK(parse({"--inject", "retain-activation:8"}).error ==
          "--inject retain-activation:8 names no layer of --layers 8");
    CHECK(parse({"--inject", "leak-rank:2"}).error ==
          "--inject leak-rank:2 names no rank of "
          "--ranks 2");
    CHECK(parse({"--inject"}).error == "--inject needs a value");
}

TEST_CASE("--help documents --inject and its forms") {
    const std::string u = usage();
    for (const char* text :
         {"--inject", "retain-activation:LAYER", "grow-optimizer", "leak-rank:RANK"}) {
        CAPTURE(text);
        CHECK(u.find(text) != std::string::npos);
    }
}

namespace {

// Live blocks (count, bytes) at the end of each step of a one-rank run, from
// the allocator's block events.
struct Live {
    int64_t count = 0;
    int64_t bytes = 0;
};
std::vector<Live> live_per_step(const Options& o) {
    static std::atomic<int> counter{0};
    const std::string rendezvous =
        "options-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    collective::Communicator comm({0, 1, 0}, rendezvous);
    Live live;
    std::map<void*, size_t> sizes;
    alloc::BlockEventSink sink{[&](void* p, size_t size, int, alloc::Stream) {
                                   ++live.count;
                                   live.bytes += int64_t(size);
                                   sizes[p] = size;
                               },
                               [&](void* p) {
                                   --live.count;
                                   live.bytes -= int64_t(sizes[p]);
                               },
                               nullptr};
    alloc::CachingAllocator allocator(0, alloc::cuda_runtime_segments(0), sink);
    std::vector<Live> out;
    {
        std::unique_ptr<Compute> compute = make_host_compute(comm, layer_config(o.shape));
        Trainer trainer(o, fp8::Arch::sm90, allocator, comm, *compute);
        for (int step = 0; step < o.steps; ++step) {
            trainer.step(step);
            out.push_back(live);
        }
    }
    CHECK(live.count == 0);  // what an injection keeps goes with the trainer
    return out;
}

Options small(std::vector<std::string> inject) {
    std::vector<std::string> args = {"--recipe", "bf16",     "--layers", "2",       "--steps",
                                     "4",        "--warmup", "1",        "--ranks", "1"};
    for (const std::string& i : inject) {
        args.push_back("--inject");
        args.push_back(i);
    }
    ParseResult r = parse_options(args);
    REQUIRE(r.error.empty());
    return r.options;
}

}  // namespace

TEST_CASE("--inject: what each injection keeps, step after step") {
    // Without injections live memory at the end of every step after the
    // first (which creates the optimizer's moments) is the same.
    const std::vector<Live> clean = live_per_step(small({}));
    REQUIRE(clean.size() == 4);
    for (size_t s = 2; s < clean.size(); ++s) {
        CHECK(clean[s].count == clean[1].count);
        CHECK(clean[s].bytes == clean[1].bytes);
    }
    // Reference shape: tokens × ffn bf16 (fc1_out) is the largest saved
    // activation, tokens × hidden bf16 an activation-sized block.
    const int64_t tokens = 64, hidden = 256, ffn = 1024;
    struct Case {
        const char* inject;
        int64_t blocks_per_step;
        int64_t min_bytes_per_step;
    };
    for (const Case& c :
         {Case{"retain-activation:1", 1, tokens * ffn * 2},
          Case{"leak-rank:0", 1, tokens * hidden * 2},
          // one fp32 state block per layer, at least the
          // layer's GEMM weights (4 hidden² + 2 hidden·ffn)
          Case{"grow-optimizer", 2, 2 * (4 * hidden * hidden + 2 * hidden * ffn) * 4}}) {
        CAPTURE(c.inject);
        const std::vector<Live> run = live_per_step(small({c.inject}));
        REQUIRE(run.size() == 4);
        for (size_t s = 0; s < run.size(); ++s) {
            CAPTURE(s);
            CHECK(run[s].count == clean[s].count + int64_t(s + 1) * c.blocks_per_step);
            CHECK(run[s].bytes - clean[s].bytes >= int64_t(s + 1) * c.min_bytes_per_step);
        }
    }
}
