// The CLI's replay of traces through detection plugins, shared by
// `allocscope replay`, by `allocscope run` (the traces of processes that
// died before writing their findings) and by `allocscope check`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "findings.h"

namespace allocscope::cli {

// A trace file and the rank its header names.
struct TraceRef {
    std::string path;
    int32_t rank = -1;
    int32_t world_size = -1;
    uint32_t pid = 0;
};

// The traces of `path` (a trace file, or every *.trace of a directory), with
// their headers' ranks. Throws runtime_error / TraceError naming the path.
std::vector<TraceRef> trace_refs(const std::string& path);

// Which plugins a replay runs: as ALLOCSCOPE_PLUGINS, ALLOCSCOPE_PLUGIN_DIR
// and ALLOCSCOPE_PLUGIN_OPTIONS (or --plugins, --plugin-dir,
// --plugin-option) say; `dir` "" is the plugins built or installed with
// this allocscope.
struct PluginChoice {
    std::vector<std::string> plugins;  // empty: every plugin in `dir`
    bool off = false;
    std::string dir;
    PluginOptions options;
};

// The choice a traced process makes from its environment (core/config.h).
PluginChoice plugin_choice_from_environment();

// Runs the plugins on `run` (after `baseline`'s stream when given), one
// plugin instance per trace as inside the traced process, and returns the
// findings as that process would have written them. A trace cut short is
// replayed up to where it ends, with one warning. `warn` gets each problem
// line (a plugin disabled, a bad option). Throws TraceError.
FindingsFile replay_trace(const TraceRef& run, const TraceRef* baseline, const PluginChoice& choice,
                          const std::function<void(const std::string&)>& warn);

// What recover_findings did: the traces it replayed, each with why, and
// their findings (kept here too, so a findings file that could not be
// written loses nothing).
struct Recovered {
    std::vector<std::string> lines;  // "rank 1 (rank1.trace): the trace ends without a footer"
    std::map<std::string, FindingsFile> replayed;  // findings.<stem>.json's path -> its findings
    size_t failed = 0;                             // traces that could not be replayed
};

// The traces in `dir` whose process left no final findings: the trace ends
// without a footer (the process was killed or crashed before its exit), or
// no findings.<stem>.json is next to it (the plugins' finish never ran).
// Each is replayed through `choice` and its findings.<stem>.json written
// (replacing a checkpoint left by the process). Problems go to `warn`; a
// trace that cannot be replayed is counted in `failed` and skipped.
Recovered recover_findings(const std::string& dir, const PluginChoice& choice,
                           const std::function<void(const std::string&)>& warn);

// The findings of every process in `dir`: its findings.<stem>.json files,
// with `recovered`'s findings in place of the files it replayed, merged in
// merge_findings' order. Throws FindingsError naming an unreadable file.
FindingsFile merge_run_findings(const std::string& dir, const Recovered& recovered);

}  // namespace allocscope::cli
