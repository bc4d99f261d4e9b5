// Command line of allocscope-harness. Parsing is separate from running so
// that every rule about invalid combinations is tested on its own.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fp8/layout.h"
#include "trainer/model_spec.h"

namespace allocscope::harness::trainer {

enum class Backend { auto_select, cuda, sim };

// Which TransformerEngine weight-caching behaviour to emulate.
enum class TeBehaviour {
    seed,   // the releases the reference test was written against (both problems)
    fixed,  // the April 2026 fix: row-wise only in forward, nothing cached
};

// Size preset of the transpose retained after backward (problem 2): the
// TE doc leaves open whether it is the full or the sharded weight.
enum class Retain { full, sharded };

// How the trainer tags its allocations (trainer/tagging.h): the C API, or
// (--nvtx) NVTX ranges that liballocscope.so maps to the same tags when it
// is the NVTX injection library (`allocscope run --nvtx`).
enum class Tagging { c_api, nvtx };

// Memory problems injected on purpose (--inject), so the detection plugins
// are proven on the harness. Each keeps what it injects until the trainer is
// destroyed (the end of the run); without injections the block allocation
// sequence is the uninjected one, byte for byte.
struct Injections {
    // This layer keeps its largest saved activation of every step past its
    // backward.
    std::optional<int> retain_activation;
    // Every optimizer step allocates one more fp32 state block per layer (the
    // size of the layer's shard), tagged (layers.<i>, optimizer).
    bool grow_optimizer = false;
    // This rank allocates one more block per step in layers.0's forward.
    std::optional<int> leak_rank;
    bool any() const { return retain_activation || grow_optimizer || leak_rank; }
};

struct Options {
    Backend backend = Backend::auto_select;
    int ranks = 2;
    fp8::Recipe recipe = fp8::Recipe::delayed;
    bool quantized_init = false;
    TeBehaviour te = TeBehaviour::seed;
    std::optional<fp8::Arch> arch;  // unset: sm90 on sim, the GPU's own on cuda
    Retain retain = Retain::full;
    ModelShape shape;
    int steps = 10;
    int warmup = 2;
    unsigned seed = 1234;
    Injections inject;
    Tagging tagging = Tagging::c_api;
    // Declare the provenance of weight-derived allocations
    // (allocscope_derived); --no-provenance leaves the detectors only sizes.
    bool provenance = true;
};

struct ParseResult {
    Options options;
    bool help = false;
    std::string error;  // one line naming the problem; empty when valid
};

// `args` excludes the program name.
ParseResult parse_options(const std::vector<std::string>& args);

// Quantized-init shards that the column-wise form built after the backward
// all-gather cannot be made from (fp8::columnwise_shard_problem) at this
// world size; empty when there are none. parse_options checks --ranks; the
// trainer checks the world it joins.
std::string check_quantized_init_shards(const Options& options, int world);

// Checks that need the machine: more ranks than GPUs on the cuda backend.
std::string check_devices(const Options& options, Backend resolved, int gpu_count);

std::string usage();

const char* to_string(fp8::Recipe recipe) noexcept;
const char* to_string(Backend backend) noexcept;
const char* to_string(TeBehaviour te) noexcept;

}  // namespace allocscope::harness::trainer
