// allocscope replay: runs detection plugins offline on recorded traces.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "args.h"
#include "cli.h"
#include "config.h"
#include "plugin_host.h"
#include "replay_engine.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kReplayHelp =
    R"(usage: allocscope replay PATH... [--plugins LIST] [--plugin-dir DIR]
                        [--plugin-option NAME.KEY=VALUE]... [--baseline PATH] [-o FILE]

Runs detection plugins on recorded traces, exactly as they run live inside a
traced process: one plugin instance per trace (rank), fed the trace's events
in order. PATH is a trace file or an output directory (all *.trace in it).

Prints one line per finding on stdout. The findings JSON (docs/FINDINGS.md)
is written only with -o: `-o FILE` writes it to FILE, `-o -` to stdout (the
summary then goes to stderr). Traces are processed by rank, then file name,
the order `allocscope run` merges its findings.json in, so a replay of a
run's traces gives the same findings as the run.

options:
  --plugins LIST        comma list of plugin names or paths to .so files;
                        default: every built-in plugin; `none` runs nothing
  --plugin-dir DIR      where names are looked up (default: $ALLOCSCOPE_PLUGIN_DIR,
                        else the plugins built or installed with this allocscope)
  --plugin-option NAME.KEY=VALUE
                        an option for plugin NAME (repeatable; a later value
                        replaces an earlier one)
  --baseline PATH       a baseline run (trace file or directory): each trace's
                        plugins first get the baseline trace of the same rank
                        (source BASELINE), then the trace itself
  -o FILE               write the findings JSON to FILE (`-` for stdout)

exit status: 0 when the plugins ran (whatever they found; use `allocscope
check` on the -o file to gate on findings), 4 when a plugin did not run on
some trace (not found, failed to load, disabled by a bad option or an
error: one line says which; the others' findings are still written), 2 on
bad input.

example:
  allocscope replay fp8-run --baseline bf16-run -o findings.json
)";

std::string base_name(const std::string& path) {
    return fs::path(path).filename().string();
}

}  // namespace

int replay_command(const std::vector<std::string>& args) {
    std::vector<std::string> baseline_paths;
    std::vector<std::string> plugins;
    bool plugins_off = false;
    std::string plugin_dir;
    PluginOptions options;
    std::string output;
    Args parser("replay", kReplayHelp);
    parser
        .value({"--plugins"},
               [&](const std::string& v) {
                   std::string problem;
                   return parse_plugin_list(v, plugins, plugins_off, problem)
                              ? std::string()
                              : "--plugins '" + v + "': " + problem;
               })
        .value({"--plugin-dir"}, plugin_dir)
        .value({"--plugin-option"},
               [&options](const std::string& v) {
                   std::string key, value, problem;
                   if (!parse_plugin_option(v, key, value, problem))
                       return "--plugin-option " + problem;
                   options[key] = value;
                   return std::string();
               })
        .value({"--baseline"},
               [&baseline_paths](const std::string& v) {
                   baseline_paths.push_back(v);
                   return std::string();
               })
        .value({"-o"}, output);
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& paths = parser.positionals();
    if (paths.empty())
        return fail("replay needs a trace file or directory (" + parser.see_help() + ")");
    {
        std::vector<std::string> inputs = paths;
        inputs.insert(inputs.end(), baseline_paths.begin(), baseline_paths.end());
        if (const std::string problem = overwrite_problem(output, inputs); !problem.empty())
            return fail(problem);
    }
    if (!plugin_dir.empty()) {
        std::error_code ec;
        if (!fs::is_directory(plugin_dir, ec)) {
            return fail("--plugin-dir " + plugin_dir + " is not a directory");
        }
    } else {
        plugin_dir = cli_plugin_dir();
    }
    if (!plugins_off && plugins.empty() && discover_plugins(plugin_dir).empty()) {
        return fail(plugin_dir.empty()
                        ? "no plugin directory found next to this allocscope; pass --plugin-dir "
                          "or --plugins with paths"
                        : "no plugins (allocscope-plugin-*.so) in " + plugin_dir);
    }

    std::vector<TraceRef> runs, baselines;
    try {
        for (const std::string& p : paths) {
            for (TraceRef& r : trace_refs(p))
                runs.push_back(std::move(r));
        }
        for (const std::string& p : baseline_paths) {
            for (TraceRef& r : trace_refs(p))
                baselines.push_back(std::move(r));
        }
    } catch (const std::exception& e) {
        return fail(e.what());
    }
    std::stable_sort(runs.begin(), runs.end(), [](const TraceRef& a, const TraceRef& b) {
        return std::make_tuple(a.rank < 0, a.rank, base_name(a.path)) <
               std::make_tuple(b.rank < 0, b.rank, base_name(b.path));
    });
    // Pairs each trace with its baseline before anything runs, so a missing
    // one is reported before minutes of replay.
    std::vector<const TraceRef*> pair(runs.size(), nullptr);
    if (!baseline_paths.empty()) {
        for (size_t i = 0; i < runs.size(); ++i) {
            if (runs.size() == 1 && baselines.size() == 1) {
                pair[i] = &baselines[0];
                continue;
            }
            std::vector<const TraceRef*> same;
            for (const TraceRef& b : baselines) {
                if (b.rank == runs[i].rank) same.push_back(&b);
            }
            const std::string which =
                runs[i].rank >= 0 ? "rank " + std::to_string(runs[i].rank) : "no rank";
            if (same.empty()) {
                return fail("no baseline trace of " + which + " (for " + runs[i].path + ")");
            }
            if (same.size() > 1) {
                return fail("several baseline traces of " + which + " (" + same[0]->path + ", " +
                            same[1]->path + "); pass the one to use as --baseline FILE");
            }
            pair[i] = same[0];
        }
    }

    std::set<std::string> warned;  // one line per problem, not one per rank
    auto warn = [&warned](const std::string& line) {
        if (warned.insert(line).second) std::fprintf(stderr, "%s\n", line.c_str());
    };
    const PluginChoice choice{plugins, plugins_off, plugin_dir, options};
    std::vector<FindingsFile> per_trace;
    try {
        for (size_t i = 0; i < runs.size(); ++i)
            per_trace.push_back(replay_trace(runs[i], pair[i], choice, warn));
    } catch (const TraceError& e) {
        return fail(e.what());
    }
    const FindingsFile merged = merge_findings(per_trace);
    const bool json_to_stdout = output == "-";
    print_findings(merged, json_to_stdout ? stderr : stdout);
    const std::vector<std::string> missing = unchecked(merged);
    if (json_to_stdout) {
        std::fputs(to_json(merged).c_str(), stdout);
    } else if (!output.empty()) {
        try {
            write_findings_file(output, merged);
        } catch (const FindingsError& e) {
            return fail(e.what());
        }
    }
    if (!missing.empty()) {
        std::fprintf(stderr, "allocscope: not everything was replayed: %s\n",
                     unchecked_line(missing).c_str());
        return kExitUnchecked;
    }
    return 0;
}

}  // namespace allocscope::cli
