// One rank of the launcher tests. Started without RANK/WORLD_SIZE it launches
// --ranks N copies of itself through launch_ranks, as allocscope-harness does;
// started by the launcher it is one rank:
//
//   collective_test_rank --ranks N [--scenario ok|fail|hang|wait]
//                        [--fail-rank R] [--exit-code C] [--pid-dir DIR]
//
//   ok    every rank runs each collective, checks the result, prints "rank r/N ok"
//   fail  rank R exits with C after joining; the others go on into a collective
//   hang  rank R exits with C after joining; the others sleep until killed
//   wait  every rank sleeps until killed
//
// Each rank first writes its pid to DIR/<rank>.pid so a test knows it is up
// and can check later that it is gone.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/launcher.h"
#include "collective/rank_info.h"

namespace {

using namespace allocscope::harness::collective;

struct Arguments {
    int ranks = 2;
    std::string scenario = "ok";
    int fail_rank = -1;
    int exit_code = 1;
    std::string pid_dir;
};

Arguments parse(int argc, char** argv) {
    Arguments args;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const char* value = argv[i + 1];
        if (flag == "--ranks") {
            args.ranks = std::atoi(value);
        } else if (flag == "--scenario") {
            args.scenario = value;
        } else if (flag == "--fail-rank") {
            args.fail_rank = std::atoi(value);
        } else if (flag == "--exit-code") {
            args.exit_code = std::atoi(value);
        } else if (flag == "--pid-dir") {
            args.pid_dir = value;
        } else {
            throw std::invalid_argument("unknown flag " + flag);
        }
    }
    return args;
}

void expect(bool condition, const std::string& what) {
    if (!condition) throw std::runtime_error(what + " is wrong");
}

void run_collectives(Communicator& comm) {
    const int rank = comm.rank();
    const int world = comm.world_size();

    std::vector<int> ids(static_cast<size_t>(world), -1);
    comm.all_gather(&rank, sizeof rank, ids.data());
    for (int r = 0; r < world; ++r)
        expect(ids[static_cast<size_t>(r)] == r, "all_gather");

    const float mine = static_cast<float>(rank + 1);
    float total = 0;
    comm.all_reduce(&mine, &total, 1);
    expect(total == static_cast<float>(world * (world + 1) / 2), "all_reduce");

    std::vector<float> chunks(static_cast<size_t>(world), static_cast<float>(rank));
    float reduced = -1;
    comm.reduce_scatter(chunks.data(), 1, &reduced, Op::sum);
    expect(reduced == static_cast<float>(world * (world - 1) / 2), "reduce_scatter");

    char text[32] = {};
    if (rank == world - 1) std::snprintf(text, sizeof text, "from rank %d", rank);
    comm.broadcast(text, sizeof text, world - 1);
    expect(std::string(text) == "from rank " + std::to_string(world - 1), "broadcast");
}

int run_rank(const Arguments& args, const RankInfo& info) {
    CommunicatorOptions options;
    options.slot_bytes = 64 << 10;
    if (!args.pid_dir.empty()) {
        std::ofstream(args.pid_dir + "/" + std::to_string(info.rank) + ".pid") << getpid() << "\n";
    }
    Communicator comm(info, rendezvous_from_env(std::getenv), options);
    const bool failing = info.rank == args.fail_rank;
    if (args.scenario == "wait" || (args.scenario == "hang" && !failing)) {
        for (;;)
            pause();
    }
    if (failing) std::_Exit(args.exit_code);
    run_collectives(comm);
    std::printf("rank %d/%d ok\n", info.rank, info.world_size);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Arguments args = parse(argc, argv);
        if (const std::optional<RankInfo> info = rank_info_from_env(std::getenv)) {
            return run_rank(args, *info);
        }
        LaunchOptions launch;
        launch.world_size = args.ranks;
        launch.argv.assign(argv, argv + argc);
        launch.stop_grace = std::chrono::milliseconds(2'000);
        return launch_ranks(launch);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "collective_test_rank: %s\n", error.what());
        return 2;
    }
}
