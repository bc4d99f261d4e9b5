#include "collective/rank_info.h"

#include <charconv>
#include <climits>
#include <stdexcept>
#include <string_view>

namespace allocscope::harness::collective {

namespace {

// A set variable must be a plain decimal integer in [min_value, max_value];
// anything else is an error rather than a silent default, because a rank that
// guesses its identity deadlocks or corrupts the collectives of its peers.
std::optional<int> read_int(const EnvLookup& env, const char* name, int min_value, int max_value,
                            std::string_view requirement) {
    const char* text = env(name);
    if (!text) return std::nullopt;
    const std::string_view view(text);
    int value = 0;
    auto [ptr, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
    if (view.empty() || ec != std::errc() || ptr != view.data() + view.size() ||
        value < min_value || value > max_value) {
        throw std::invalid_argument(std::string(name) + "='" + text + "' is not " +
                                    std::string(requirement));
    }
    return value;
}

}  // namespace

std::optional<RankInfo> rank_info_from_env(const EnvLookup& env) {
    const std::optional<int> world = read_int(env, "WORLD_SIZE", 1, INT_MAX, "an integer >= 1");
    if (!world) {
        if (env("RANK")) throw std::invalid_argument("RANK is set but WORLD_SIZE is not");
        return std::nullopt;
    }
    const std::string below_world = "an integer in [0, WORLD_SIZE=" + std::to_string(*world) + ")";
    const std::optional<int> rank = read_int(env, "RANK", 0, *world - 1, below_world);
    if (!rank) throw std::invalid_argument("WORLD_SIZE is set but RANK is not");
    const std::optional<int> local_rank = read_int(env, "LOCAL_RANK", 0, *world - 1, below_world);
    return RankInfo{*rank, *world, local_rank.value_or(*rank)};
}

std::string rendezvous_from_env(const EnvLookup& env) {
    if (const char* id = env(kRendezvousVariable); id && *id) return id;
    const char* addr = env("MASTER_ADDR");
    const char* port = env("MASTER_PORT");
    if (addr && *addr && port && *port) return std::string(addr) + "-" + port;
    throw std::invalid_argument(std::string("no rendezvous id: set ") + kRendezvousVariable +
                                " or MASTER_ADDR and MASTER_PORT (launch_ranks sets them)");
}

}  // namespace allocscope::harness::collective
