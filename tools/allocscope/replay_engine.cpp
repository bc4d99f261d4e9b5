// The CLI's replay of traces through plugins (replay_engine.h).
#include "replay_engine.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "cli.h"
#include "plugin_host.h"
#include "plugin_replay.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace fs = std::filesystem;

std::vector<TraceRef> trace_refs(const std::string& path) {
    std::vector<std::string> files;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        files = trace_files_in(path);
        if (files.empty()) throw std::runtime_error(path + ": no .trace files in this directory");
    } else if (fs::exists(path, ec)) {
        files.push_back(path);
    } else {
        throw std::runtime_error(path + ": no such file or directory");
    }
    std::vector<TraceRef> refs;
    for (const std::string& f : files) {
        TraceReader reader(f);  // the header only; throws TraceError
        refs.push_back({f, reader.header().rank, reader.header().world_size, reader.header().pid});
    }
    return refs;
}

PluginChoice plugin_choice_from_environment() {
    const Config c = parse_config([](const char* name) { return std::getenv(name); });
    PluginChoice choice;
    choice.plugins = c.plugins;
    choice.off = c.plugins_off;
    choice.dir = c.plugin_dir;
    choice.options = c.plugin_options;
    return choice;
}

namespace {

// Feeds the trace at `path` to `host` as it is read (one pass, the events
// never all held); a trace cut short or corrupt after its first event is
// replayed up to there, with one warning.
void replay_file(PluginHost& host, const std::string& path, uint32_t source) {
    TraceStream stream(path);
    feed_trace(host, stream, source);
    const TraceTables& t = stream.tables();
    if (t.truncated) {
        std::fprintf(stderr, "allocscope: warning: %s; replayed the events before that point\n",
                     t.truncation_message.c_str());
    }
}

std::string file_name(const std::string& path) {
    return fs::path(path).filename().string();
}

}  // namespace

FindingsFile replay_trace(const TraceRef& run, const TraceRef* baseline, const PluginChoice& choice,
                          const std::function<void(const std::string&)>& warn) {
    HostSettings settings;
    settings.rank = run.rank;
    settings.pid = run.pid;
    settings.world_size = run.world_size > 0 ? run.world_size : 0;
    settings.has_baseline = baseline != nullptr;
    settings.options = choice.options;
    settings.warn = warn;
    settings.info = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    PluginHost host(std::move(settings));
    if (!choice.off) host.load(choice.plugins, choice.dir.empty() ? cli_plugin_dir() : choice.dir);
    if (baseline) replay_file(host, baseline->path, ALLOCSCOPE_SOURCE_BASELINE);
    replay_file(host, run.path, ALLOCSCOPE_SOURCE_RUN);
    host.finish();
    return host.findings_file(file_name(run.path));
}

Recovered recover_findings(const std::string& dir, const PluginChoice& choice,
                           const std::function<void(const std::string&)>& warn) {
    Recovered out;
    if (choice.off) return out;
    for (const std::string& path : trace_files_in(dir)) {
        const std::string name = file_name(path);
        // Beside its trace: in `dir`, or in a host's directory of it.
        const fs::path findings =
            fs::path(path).parent_path() / ("findings." + std::string(trace_stem(name)) + ".json");
        std::string why;
        std::error_code ec;
        if (!ends_with_footer(path)) {
            why = "the trace ends without a footer (the process did not reach its exit)";
        } else if (!fs::exists(findings, ec)) {
            why = "its process wrote no findings (its plugins did not finish)";
        } else {
            continue;
        }
        FindingsFile file;
        std::string who;
        try {
            const std::vector<TraceRef> ref = trace_refs(path);
            who = process_label(ref.at(0).rank, ref[0].pid);
            file = replay_trace(ref[0], nullptr, choice, warn);
        } catch (const std::exception& e) {
            warn(std::string("allocscope: could not replay ") + path + ": " + e.what());
            ++out.failed;
            continue;
        }
        try {
            write_findings_file(findings.string(), file);
        } catch (const std::exception& e) {
            warn(std::string("allocscope: ") + e.what() +
                 " (the replayed findings are used as they are)");
        }
        out.replayed[findings.string()] = std::move(file);
        out.lines.push_back(who + " (" + name + "): " + why);
    }
    return out;
}

FindingsFile merge_run_findings(const std::string& dir, const Recovered& recovered) {
    std::vector<FindingsFile> files;
    for (const auto& [path, file] : recovered.replayed)
        files.push_back(file);
    for (const std::string& d : trace_dirs_in(dir)) {
        for (const std::string& path : rank_findings_files_in(d)) {
            if (recovered.replayed.count(path) == 0) files.push_back(read_findings_file(path));
        }
    }
    return merge_findings(std::move(files));
}

}  // namespace allocscope::cli
