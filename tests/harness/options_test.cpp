#include <doctest/doctest.h>

#include "trainer/options.h"

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

TEST_CASE("more ranks than GPUs is refused on the cuda backend only") {
    Options o = parse({"--ranks", "4"}).options;
    CHECK(check_devices(o, Backend::cuda, 2) == "--ranks 4 needs as many GPUs, but 2 are visible");
    CHECK(check_devices(o, Backend::cuda, 4).empty());
    CHECK(check_devices(o, Backend::sim, 0).empty());
}

TEST_CASE("--help is recognised anywhere and the usage names every flag") {
    CHECK(parse({"--ranks", "2", "--help"}).help);
    std::string u = usage();
    for (const char* flag : {"--backend", "--ranks", "--recipe", "--quantized-init", "--te",
                             "--arch", "--retain", "--layers", "--hidden", "--ffn", "--heads",
                             "--seq", "--batch", "--steps", "--warmup", "--seed"}) {
        CAPTURE(flag);
        CHECK(u.find(flag) != std::string::npos);
    }
}
