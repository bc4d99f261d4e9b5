// Which rank this process is, read from the environment a launcher sets
// (RANK, WORLD_SIZE, LOCAL_RANK as torchrun does, or launch_ranks() here),
// and the rendezvous id that names the ranks' shared-memory segment.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace allocscope::harness::collective {

struct RankInfo {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
};

// Set by launch_ranks(); unique per launch so concurrent runs never share a
// segment.
inline constexpr const char* kRendezvousVariable = "ALLOCSCOPE_RENDEZVOUS";

using EnvLookup = std::function<const char*(const char*)>;

// nullopt when neither RANK nor WORLD_SIZE is set (no launcher around us).
// LOCAL_RANK defaults to RANK (launchers without it run on one host). Throws
// std::invalid_argument naming the variable and its value when one is
// malformed: not a decimal integer, negative, RANK or LOCAL_RANK not below
// WORLD_SIZE, WORLD_SIZE below 1, or only one of RANK / WORLD_SIZE set.
std::optional<RankInfo> rank_info_from_env(const EnvLookup& getenv_fn);

// ALLOCSCOPE_RENDEZVOUS, else "<MASTER_ADDR>-<MASTER_PORT>" for torchrun-style
// launchers (the ranks of one job share both; jobs on one host differ in the
// port). Throws std::invalid_argument when neither is available.
std::string rendezvous_from_env(const EnvLookup& getenv_fn);

}  // namespace allocscope::harness::collective
