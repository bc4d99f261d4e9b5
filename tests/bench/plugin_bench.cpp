// Plugin cost on an event stream: events per second through the built-in
// plugins on one core, all together and each alone, replaying a recorded
// trace (the harness's, say) through PluginHost as the interposer's writer
// thread does. Each repetition is a fresh host (a new stream); the trace is
// loaded once, outside the timing. Prints the median of the repetitions.
//
//   plugin_bench TRACE PLUGIN_DIR [REPETITIONS [ONLY]]
//
// ONLY: one row, for a profiler: "all" (the built-ins together), "null"
// (the host) or a plugin's name.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "plugin_host.h"
#include "plugin_replay.h"
#include "trace_reader.h"

namespace {

using namespace allocscope;

// A plugin that takes every event and does nothing with it: the host's own
// cost (live table, tag strings, the event view, one call per event).
allocscope_plugin_status null_init(const allocscope_host_v2*, void** state) {
    *state = nullptr;
    return ALLOCSCOPE_PLUGIN_OK;
}
allocscope_plugin_status null_event(void*, const allocscope_event_v2*) {
    return ALLOCSCOPE_PLUGIN_OK;
}
allocscope_plugin_status null_step(void*, uint64_t, uint32_t) {
    return ALLOCSCOPE_PLUGIN_OK;
}
allocscope_plugin_status null_finish(void*) {
    return ALLOCSCOPE_PLUGIN_OK;
}
const allocscope_plugin_v2 null_plugin = {sizeof(allocscope_plugin_v2),
                                          ALLOCSCOPE_PLUGIN_V2_ABI_VERSION,
                                          "null",
                                          "does nothing",
                                          ALLOCSCOPE_EVENT_V2_ALL,
                                          null_init,
                                          null_event,
                                          null_step,
                                          null_finish};

// Seconds to feed the trace through a host with `plugins` (empty: all
// found in dir; `dir` "": the null plugin only); the plugins' findings are
// produced (finish) inside the timing too.
double feed_seconds(const Trace& trace, const std::vector<std::string>& plugins,
                    const std::string& dir, size_t& enabled) {
    HostSettings settings;
    settings.rank = trace.header.rank;
    settings.world_size = trace.header.world_size;
    settings.warn = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    settings.info = [](const std::string&) {};
    PluginHost host(settings);
    if (dir.empty()) {
        host.add(&null_plugin, "plugin_bench");
    } else {
        host.load(plugins, dir);
    }
    enabled = host.enabled_count();
    const auto t0 = std::chrono::steady_clock::now();
    feed_trace(host, trace);
    host.finish();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: plugin_bench TRACE PLUGIN_DIR [REPETITIONS [ONLY]]\n");
        return 2;
    }
    const std::string dir = argv[2];
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
    const std::string only = argc > 4 ? argv[4] : "";
    try {
        const Trace trace = load_trace(argv[1]);
        // The host (null plugin), all built-ins together, then each alone.
        std::vector<std::vector<std::string>> sets = {{"(host, null plugin)"}, {}};
        for (const std::string& path : discover_plugins(dir)) {
            std::string name = path.substr(path.rfind('/') + 1);
            name = name.substr(std::string("allocscope-plugin-").size());
            name = name.substr(0, name.size() - 3);  // ".so"
            sets.push_back({name});
        }
        std::printf("trace %s: %zu events; median of %d runs, one core\n", argv[1],
                    trace.events.size(), reps);
        std::printf("%-28s %8s %14s %12s\n", "plugins", "enabled", "events/s", "ns/event");
        for (const auto& set : sets) {
            const std::string row = set.empty() ? "all" : set[0] == sets[0][0] ? "null" : set[0];
            if (!only.empty() && row != only) continue;
            std::vector<double> seconds;
            size_t enabled = 0;
            const bool host_only = !set.empty() && set[0] == "(host, null plugin)";
            for (int r = 0; r < reps; ++r) {
                seconds.push_back(host_only ? feed_seconds(trace, {}, "", enabled)
                                            : feed_seconds(trace, set, dir, enabled));
            }
            std::sort(seconds.begin(), seconds.end());
            const double s = seconds[seconds.size() / 2];
            const double n = double(trace.events.size());
            std::printf("%-28s %8zu %14.0f %12.1f\n",
                        set.empty() ? "(all built-ins)" : set[0].c_str(), enabled, n / s,
                        s * 1e9 / n);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "plugin_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
