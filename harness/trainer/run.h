// The harness's command line and rank loop, shared by its two executables:
// allocscope-harness (the sim backend; it hands --backend cuda over to the
// other) and allocscope-harness-cuda (linked with the real CUDA runtime,
// cuBLASLt and NCCL). Both launch their ranks as copies of themselves.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "alloc/caching_allocator.h"
#include "collective/communicator.h"
#include "collective/rank_info.h"
#include "trainer/compute.h"
#include "trainer/options.h"

namespace allocscope::harness::trainer {

struct RankBackend {
    // Before launching: checks that need the machine (more ranks than GPUs);
    // returns one line naming the problem, or empty.
    std::function<std::string(const Options&)> check;
    // In the rank process: the device this rank's segments come from, the
    // resolved --arch, and its Compute (after the communicator exists).
    std::function<int(const collective::RankInfo&)> device;
    std::function<fp8::Arch(const Options&, int device)> arch;
    std::function<std::unique_ptr<Compute>(const collective::RankInfo&, int device,
                                           collective::Communicator&, const Options&)>
        make_compute;
};

// Parses argv. Returns the exit status when the process is done (0 after
// printing --help, 2 after printing the error), nullopt with `options` set
// otherwise.
std::optional<int> parse_command_line(int argc, char** argv, Options& options);

// Parses `options` already read from argv (argv is re-used to launch the
// ranks), then launches or runs this rank. Returns the process exit code.
int run_harness(const Options& options, int argc, char** argv, const RankBackend& backend);

}  // namespace allocscope::harness::trainer
