// `--ranks N`: the harness parent starts one process per rank, like torchrun,
// and supervises them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace allocscope::harness::collective {

struct LaunchOptions {
    int world_size = 2;
    // exec'd for every rank (not just forked), so each rank is a fresh
    // process in which an LD_PRELOADed interposer starts from scratch.
    std::string executable = "/proc/self/exe";
    std::vector<std::string> argv;  // every rank's argv, argv[0] included
    // After a rank fails or the launcher is interrupted, how long the others
    // get to exit after SIGTERM before SIGKILL.
    std::chrono::milliseconds stop_grace{5'000};
};

// Starts the ranks with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and a
// rendezvous id unique to this launch (kRendezvousVariable) added to the
// environment, and waits for all of them. Returns 0 when every rank exits 0;
// otherwise the status of the first rank seen failing (its exit code, or
// 128 + its signal), after stopping the others; or 128 + the signal when the
// launcher itself got SIGINT or SIGTERM, which it forwards to the ranks.
// Ranks also get SIGKILL if the launcher dies. Afterwards it removes the
// ranks' shared-memory segment in case they died before unlinking it.
//
// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread while it runs:
// call it before starting other threads. Throws std::runtime_error when a
// rank cannot be started (the ones already started are killed first).
int launch_ranks(const LaunchOptions& options);

}  // namespace allocscope::harness::collective
