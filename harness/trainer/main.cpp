// allocscope-harness: the FSDP2-style FP8 trainer (see trainer.h), one
// process per rank. Without RANK/WORLD_SIZE in the environment it launches
// --ranks processes of itself, like torchrun; with them it is one rank of an
// external launcher.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "alloc/caching_allocator.h"
#include "collective/communicator.h"
#include "collective/launcher.h"
#include "collective/rank_info.h"
#include "trainer/options.h"
#include "trainer/trainer.h"

namespace {

using namespace allocscope::harness;

std::string mib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024.0 * 1024.0));
    return buf;
}

int run_rank(const trainer::Options& options, const collective::RankInfo& rank,
             const std::string& rendezvous) {
    const fp8::Arch arch = options.arch.value_or(fp8::Arch::sm90);
    collective::Communicator comm(rank, rendezvous);
    alloc::CachingAllocator allocator(0, alloc::cuda_runtime_segments(0),
                                      alloc::allocscope_block_events());
    trainer::Trainer trainer(options, arch, allocator, comm);
    double increments = 0, deltas = 0;
    int measured = 0;
    for (int step = 0; step < options.steps; ++step) {
        trainer::StepResult r = trainer.step(step);
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

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    trainer::ParseResult parsed = trainer::parse_options(args);
    if (parsed.help) {
        std::fputs(trainer::usage().c_str(), stdout);
        return 0;
    }
    if (!parsed.error.empty()) {
        std::fprintf(stderr, "allocscope-harness: %s\n", parsed.error.c_str());
        return 2;
    }
    const trainer::Options& options = parsed.options;
    if (options.backend == trainer::Backend::cuda) {
        std::fprintf(stderr,
                     "allocscope-harness: --backend cuda is not available in this build yet; "
                     "use --backend sim (the CPU simulation)\n");
        return 2;
    }
    auto env = [](const char* name) { return std::getenv(name); };
    try {
        std::optional<collective::RankInfo> rank = collective::rank_info_from_env(env);
        if (!rank) {
            if (options.ranks == 1) {
                return run_rank(options, {0, 1, 0}, "harness-" + std::to_string(getpid()));
            }
            collective::LaunchOptions launch;
            launch.world_size = options.ranks;
            launch.argv.assign(argv, argv + argc);
            return collective::launch_ranks(launch);
        }
        return run_rank(options, *rank, collective::rendezvous_from_env(env));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "allocscope-harness: %s\n", e.what());
        return 1;
    }
}
