#include "trainer/run.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "collective/launcher.h"
#include "trainer/tagging.h"
#include "trainer/trainer.h"

namespace allocscope::harness::trainer {

namespace {

std::string mib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024.0 * 1024.0));
    return buf;
}

int run_rank(const Options& options, const collective::RankInfo& rank,
             const std::string& rendezvous, const RankBackend& backend) {
    const int device = backend.device(rank);
    const fp8::Arch arch = backend.arch(options, device);
    collective::Communicator comm(rank, rendezvous);
    std::unique_ptr<Compute> compute = backend.make_compute(rank, device, comm, options);
    alloc::CachingAllocator allocator(device, alloc::cuda_runtime_segments(device),
                                      alloc::allocscope_block_events());
    Trainer trainer(options, arch, allocator, comm, *compute);
    double increments = 0, deltas = 0;
    int measured = 0;
    if (rank.rank == 0) {
        std::printf("backend %s, %d rank%s, recipe %s%s, te %s, arch %s\n", compute->name(),
                    rank.world_size, rank.world_size == 1 ? "" : "s", to_string(options.recipe),
                    options.quantized_init ? " (quantized init)" : "", to_string(options.te),
                    arch == fp8::Arch::sm90 ? "sm90" : "sm100");
    }
    for (int step = 0; step < options.steps; ++step) {
        StepResult r = trainer.step(step);
        const auto& layers = r.memory.after_layer_forward;
        if (step >= options.warmup && layers.size() > 1) {
            increments +=
                (double(layers.back()) - double(layers.front())) / double(layers.size() - 1);
            deltas += double(r.memory.after_backward) - double(r.memory.after_forward);
            ++measured;
        }
        if (rank.rank == 0) {
            std::printf("step %d loss %.6f allocated %s reserved %s step %.1f ms\n", step, r.loss,
                        mib(r.allocated).c_str(), mib(r.reserved).c_str(), r.milliseconds);
            std::fflush(stdout);
        }
    }
    if (rank.rank == 0 && measured > 0) {
        std::printf(
            "memory (rank 0, mean over steps %d..%d): forward increment per layer %.0f B, "
            "post-backward minus post-forward %.0f B\n",
            options.warmup, options.steps - 1, increments / measured, deltas / measured);
    }
    return 0;
}

}  // namespace

std::optional<int> parse_command_line(int argc, char** argv, Options& options) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    ParseResult parsed = parse_options(args);
    if (parsed.help) {
        std::fputs(usage().c_str(), stdout);
        return 0;
    }
    if (!parsed.error.empty()) {
        std::fprintf(stderr, "allocscope-harness: %s\n", parsed.error.c_str());
        return 2;
    }
    options = parsed.options;
    if (options.tagging == Tagging::nvtx) {
        if (!nvtx_available()) {
            std::fprintf(stderr,
                         "allocscope-harness: --nvtx: this build has no NVTX (nvtx3/nvToolsExt.h "
                         "was not found when it was configured); tag through the C API instead\n");
            return 2;
        }
        // The launching process says it once; its ranks inherit the environment.
        if (!std::getenv("NVTX_INJECTION64_PATH") && !std::getenv("RANK")) {
            std::fprintf(stderr,
                         "allocscope-harness: --nvtx without an NVTX injection library: the "
                         "ranges tag nothing (run under `allocscope run --nvtx`)\n");
        }
    }
    return std::nullopt;
}

int run_harness(const Options& options, int argc, char** argv, const RankBackend& backend) {
    auto env = [](const char* name) { return std::getenv(name); };
    try {
        std::optional<collective::RankInfo> rank = collective::rank_info_from_env(env);
        if (!rank || rank->rank == 0) {
            // Checked once, before any rank starts (or by rank 0 of an
            // external launcher, whose failure stops the job).
            Options checked = options;
            if (rank) checked.ranks = rank->world_size;
            if (std::string problem = backend.check(checked); !problem.empty()) {
                std::fprintf(stderr, "allocscope-harness: %s\n", problem.c_str());
                return 2;
            }
        }
        if (!rank) {
            if (options.ranks == 1) {
                return run_rank(options, {0, 1, 0}, "harness-" + std::to_string(getpid()), backend);
            }
            collective::LaunchOptions launch;
            launch.world_size = options.ranks;
            launch.argv.assign(argv, argv + argc);
            return collective::launch_ranks(launch);
        }
        return run_rank(options, *rank, collective::rendezvous_from_env(env), backend);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "allocscope-harness: %s\n", e.what());
        return 1;
    }
}

}  // namespace allocscope::harness::trainer
