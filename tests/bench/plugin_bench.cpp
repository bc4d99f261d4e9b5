// Plugin cost on an event stream: events per second through the built-in
// plugins on one core, all together and each alone, replaying a recorded
// trace (the harness's, say) through PluginHost as the interposer's writer
// thread does. Each repetition is a fresh host (a new stream); the trace is
// loaded once, outside the timing. Prints the median of the repetitions.
//
//   plugin_bench TRACE PLUGIN_DIR [REPETITIONS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "plugin_host.h"
#include "trace_reader.h"

namespace {

using namespace allocscope;

// Seconds to feed the trace through a host with `plugins` (empty: all
// found in dir); the plugins' findings are produced (finish) inside the
// timing too.
// `dir` "" loads nothing: the host's own cost (live table, strings).
double feed_seconds(const Trace& trace, const std::vector<std::string>& plugins,
                    const std::string& dir, size_t& enabled) {
    HostSettings settings;
    settings.rank = trace.header.rank;
    settings.world_size = trace.header.world_size;
    settings.warn = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    settings.info = [](const std::string&) {};
    PluginHost host(settings);
    host.load(plugins, dir);
    enabled = host.enabled_count();
    const auto t0 = std::chrono::steady_clock::now();
    host.feed_trace(trace);
    host.finish();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: plugin_bench TRACE PLUGIN_DIR [REPETITIONS]\n");
        return 2;
    }
    const std::string dir = argv[2];
    const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
    try {
        const Trace trace = load_trace(argv[1]);
        // The host alone, all built-ins together, then each alone.
        std::vector<std::vector<std::string>> sets = {{"(host only)"}, {}};
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
            std::vector<double> seconds;
            size_t enabled = 0;
            const bool host_only = !set.empty() && set[0] == "(host only)";
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
