#include "trainer/options.h"

#include <charconv>
#include <cstdint>

#include "fp8/columnwise.h"

namespace allocscope::harness::trainer {

namespace {

template <typename Enum, size_t N>
bool parse_choice(const std::string& text, const std::pair<const char*, Enum> (&choices)[N],
                  Enum& out) {
    for (const auto& [name, value] : choices) {
        if (text == name) {
            out = value;
            return true;
        }
    }
    return false;
}

template <typename Enum, size_t N>
std::string choice_list(const std::pair<const char*, Enum> (&choices)[N]) {
    std::string s;
    for (const auto& [name, value] : choices)
        s += (s.empty() ? "" : "|") + std::string(name);
    return s;
}

constexpr std::pair<const char*, fp8::Recipe> kRecipes[] = {
    {"bf16", fp8::Recipe::bf16},       {"delayed", fp8::Recipe::delayed},
    {"current", fp8::Recipe::current}, {"block", fp8::Recipe::block},
    {"mxfp8", fp8::Recipe::mxfp8},     {"nvfp4", fp8::Recipe::nvfp4},
};
constexpr std::pair<const char*, Backend> kBackends[] = {
    {"auto", Backend::auto_select}, {"cuda", Backend::cuda}, {"sim", Backend::sim}};
constexpr std::pair<const char*, TeBehaviour> kTe[] = {{"seed", TeBehaviour::seed},
                                                       {"fixed", TeBehaviour::fixed}};
constexpr std::pair<const char*, fp8::Arch> kArchs[] = {{"sm90", fp8::Arch::sm90},
                                                        {"sm100", fp8::Arch::sm100}};
constexpr std::pair<const char*, Retain> kRetain[] = {{"full", Retain::full},
                                                      {"sharded", Retain::sharded}};

bool parse_int(const std::string& text, int64_t min, int64_t max, int64_t& out) {
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && ptr == text.data() + text.size() && out >= min && out <= max;
}

constexpr const char* kInjectForms = "retain-activation:LAYER|grow-optimizer|leak-rank:RANK";

// One --inject value into o.inject; the error message otherwise. Layer and
// rank are checked against --layers and --ranks once every flag is read.
std::string parse_injection(const std::string& v, Injections& inject) {
    const size_t colon = v.find(':');
    const std::string kind = v.substr(0, colon);
    const std::string arg = colon == std::string::npos ? std::string() : v.substr(colon + 1);
    auto index = [&](int64_t max, std::optional<int>& out) -> std::string {
        int64_t n = 0;
        if (colon == std::string::npos || !parse_int(arg, 0, max, n)) {
            return "--inject " + kind + " expects " + kind + ":N with N from 0 to " +
                   std::to_string(max) + ", got '" + v + "'";
        }
        out = int(n);
        return {};
    };
    if (kind == "retain-activation") return index(1023, inject.retain_activation);
    if (kind == "leak-rank") return index(63, inject.leak_rank);
    if (v == "grow-optimizer") {
        inject.grow_optimizer = true;
        return {};
    }
    return "unknown --inject value '" + v + "' (" + kInjectForms + ")";
}

// Block-scaled recipes quantize along rows and columns of every GEMM operand:
// tokens, hidden and ffn must be whole blocks.
std::string check_block_shapes(const Options& o) {
    size_t block = o.recipe == fp8::Recipe::mxfp8 ? 32 : o.recipe == fp8::Recipe::nvfp4 ? 16 : 0;
    if (block == 0) return {};
    const ModelShape& s = o.shape;
    for (auto [name, value] : {std::pair<const char*, int>{"--hidden", s.hidden},
                               {"--ffn", s.ffn},
                               {"tokens per rank (--seq x --batch)", s.tokens()}}) {
        if (value % static_cast<int>(block) != 0) {
            return std::string("--recipe ") + to_string(o.recipe) + " needs " + name +
                   " to be a multiple of " + std::to_string(block) + ", got " +
                   std::to_string(value);
        }
    }
    return {};
}

}  // namespace

const char* to_string(fp8::Recipe recipe) noexcept {
    for (const auto& [name, value] : kRecipes) {
        if (value == recipe) return name;
    }
    return "unknown";
}

const char* to_string(Backend backend) noexcept {
    for (const auto& [name, value] : kBackends) {
        if (value == backend) return name;
    }
    return "unknown";
}

const char* to_string(TeBehaviour te) noexcept {
    return te == TeBehaviour::seed ? "seed" : "fixed";
}

std::string usage() {
    return "usage: allocscope-harness [options]\n"
           "\n"
           "An FSDP2-style FP8 trainer of the reference model (TransformerLayer x N, MSE loss,\n"
           "Adam), one process per rank, allocating like PyTorch + TransformerEngine.\n"
           "\n"
           "  --backend " +
           choice_list(kBackends) +
           "   (default auto: cuda where a GPU is present and\n"
           "                            the cuda backend is built, else sim)\n"
           "  --ranks N                 ranks to launch (default 2); RANK/WORLD_SIZE in the\n"
           "                            environment join an external launcher instead\n"
           "  --recipe " +
           choice_list(kRecipes) +
           "   (default delayed)\n"
           "  --quantized-init          parameters stored quantized (not with nvfp4)\n"
           "  --te " +
           choice_list(kTe) +
           "           weight-caching behaviour to emulate (default seed)\n"
           "  --arch " +
           choice_list(kArchs) +
           "        whether the FP8 GEMM needs TN layouts (sm90)\n"
           "                            (default sm90 on sim, the GPU's own on cuda)\n"
           "  --retain " +
           choice_list(kRetain) +
           "    size of the retained transpose (default full)\n"
           "  --layers N --hidden N --ffn N --heads N --seq N --batch N\n"
           "                            model shape (default 8, 256, 1024, 8, 32, 2)\n"
           "  --steps N --warmup N --seed N   (default 10, 2, 1234)\n"
           "  --inject WHAT             inject a memory problem, for testing detectors\n"
           "                            (repeatable; each keeps what it adds until the run ends):\n"
           "      retain-activation:LAYER  layer LAYER keeps its largest saved activation of\n"
           "                               every step past its backward\n"
           "      grow-optimizer           every optimizer step adds an fp32 state block per\n"
           "                               layer (the layer's shard size)\n"
           "      leak-rank:RANK           rank RANK (below --ranks) adds one activation-sized\n"
           "                               block per step in layers.0's forward\n"
           "  --nvtx                    tag through NVTX ranges (\"allocscope:<layer>/<phase>\",\n"
           "                            the step as mark \"allocscope:step=<n>\") instead of the\n"
           "                            C API; needs `allocscope run --nvtx`, tags are identical\n"
           "  --no-provenance           do not declare which parameter each quantized copy,\n"
           "                            scale and column-wise form was computed from\n"
           "                            (allocscope_derived); the detectors then have sizes only\n"
           "\n"
           "example: allocscope run -- allocscope-harness --recipe delayed --te seed --ranks 2\n";
}

ParseResult parse_options(const std::vector<std::string>& args) {
    ParseResult r;
    Options& o = r.options;
    auto fail = [&](std::string message) {
        r.error = std::move(message);
        return r;
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (a == "--help" || a == "-h") {
            r.help = true;
            return r;
        }
        if (a == "--quantized-init") {
            o.quantized_init = true;
            continue;
        }
        if (a == "--nvtx") {
            o.tagging = Tagging::nvtx;
            continue;
        }
        if (a == "--no-provenance") {
            o.provenance = false;
            continue;
        }
        if (a.rfind("--", 0) != 0) return fail("unexpected argument '" + a + "'");
        if (i + 1 >= args.size()) return fail(a + " needs a value");
        const std::string& v = args[++i];
        int64_t n = 0;
        auto number = [&](int64_t min, int64_t max, auto& field) {
            if (!parse_int(v, min, max, n)) {
                r.error = a + " expects an integer from " + std::to_string(min) + " to " +
                          std::to_string(max) + ", got '" + v + "'";
                return false;
            }
            field = static_cast<std::remove_reference_t<decltype(field)>>(n);
            return true;
        };
        bool ok = true;
        if (a == "--backend") {
            if (!parse_choice(v, kBackends, o.backend)) {
                return fail("unknown backend '" + v + "' (" + choice_list(kBackends) + ")");
            }
        } else if (a == "--recipe") {
            if (!parse_choice(v, kRecipes, o.recipe)) {
                return fail("unknown recipe '" + v + "' (" + choice_list(kRecipes) + ")");
            }
        } else if (a == "--te") {
            if (!parse_choice(v, kTe, o.te)) {
                return fail("unknown --te value '" + v + "' (" + choice_list(kTe) + ")");
            }
        } else if (a == "--arch") {
            fp8::Arch arch;
            if (!parse_choice(v, kArchs, arch)) {
                return fail("unknown --arch value '" + v + "' (" + choice_list(kArchs) + ")");
            }
            o.arch = arch;
        } else if (a == "--retain") {
            if (!parse_choice(v, kRetain, o.retain)) {
                return fail("unknown --retain value '" + v + "' (" + choice_list(kRetain) + ")");
            }
        } else if (a == "--ranks") {
            ok = number(1, 64, o.ranks);
        } else if (a == "--layers") {
            ok = number(1, 1024, o.shape.layers);
        } else if (a == "--hidden") {
            ok = number(1, 1 << 16, o.shape.hidden);
        } else if (a == "--ffn") {
            ok = number(1, 1 << 18, o.shape.ffn);
        } else if (a == "--heads") {
            ok = number(1, 1024, o.shape.heads);
        } else if (a == "--seq") {
            ok = number(1, 1 << 16, o.shape.seq);
        } else if (a == "--batch") {
            ok = number(1, 1 << 12, o.shape.batch);
        } else if (a == "--steps") {
            ok = number(1, 1 << 20, o.steps);
        } else if (a == "--warmup") {
            ok = number(0, 1 << 20, o.warmup);
        } else if (a == "--seed") {
            ok = number(0, UINT32_MAX, o.seed);
        } else if (a == "--inject") {
            if (std::string e = parse_injection(v, o.inject); !e.empty()) return fail(e);
        } else {
            return fail("unknown option '" + a + "' (see --help)");
        }
        if (!ok) return r;
    }
    if (o.recipe == fp8::Recipe::nvfp4 && o.quantized_init) {
        return fail(
            "--recipe nvfp4 cannot be combined with --quantized-init (TE does not "
            "support quantized NVFP4 parameters)");
    }
    if (o.quantized_init && o.recipe == fp8::Recipe::bf16) {
        return fail("--quantized-init needs an FP8 recipe, not bf16");
    }
    if (o.shape.hidden % o.shape.heads != 0) {
        return fail("--heads " + std::to_string(o.shape.heads) + " does not divide --hidden " +
                    std::to_string(o.shape.hidden));
    }
    if (o.warmup >= o.steps) {
        return fail("--warmup " + std::to_string(o.warmup) + " must be below --steps " +
                    std::to_string(o.steps));
    }
    if (std::string e = check_block_shapes(o); !e.empty()) return fail(e);
    if (std::string e = check_quantized_init_shards(o, o.ranks); !e.empty()) return fail(e);
    if (o.inject.retain_activation && *o.inject.retain_activation >= o.shape.layers) {
        return fail("--inject retain-activation:" + std::to_string(*o.inject.retain_activation) +
                    " names no layer of --layers " + std::to_string(o.shape.layers));
    }
    if (o.inject.leak_rank && *o.inject.leak_rank >= o.ranks) {
        return fail("--inject leak-rank:" + std::to_string(*o.inject.leak_rank) +
                    " names no rank of --ranks " + std::to_string(o.ranks));
    }
    return r;
}

std::string check_quantized_init_shards(const Options& o, int world) {
    if (!o.quantized_init || world < 1) return {};
    for (const ParamSpec& p : layer_params(o.shape)) {
        if (p.role != ParamRole::gemm_weight) continue;
        const std::string problem =
            fp8::columnwise_shard_problem(o.recipe, size_t(p.shard_rows(world)));
        if (!problem.empty()) {
            return std::string("--recipe ") + to_string(o.recipe) + " --quantized-init with " +
                   std::to_string(world) + " ranks: " + p.module + "." + p.name + " (" +
                   std::to_string(p.rows) + " rows): " + problem;
        }
    }
    return {};
}

std::string check_devices(const Options& o, Backend resolved, int gpu_count) {
    if (resolved == Backend::cuda && o.ranks > gpu_count) {
        return "--ranks " + std::to_string(o.ranks) + " needs as many GPUs, but " +
               std::to_string(gpu_count) + " " + (gpu_count == 1 ? "is" : "are") + " visible";
    }
    return {};
}

}  // namespace allocscope::harness::trainer
