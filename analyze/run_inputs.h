// Where a run's traces and findings are: the inputs every offline command
// (report, diff, export, replay, check) expands its paths into. An output
// directory is the directory `allocscope run` wrote (or `--per-host`'s
// host-<name> directories under it).
#pragma once

#include <string>
#include <vector>

#include "findings.h"

namespace allocscope {

// The trace files of `paths` and the findings files that go with them: an
// output directory gives every *.trace in it and its findings.json (else its
// findings.<stem>.json files); a trace file gives itself and the
// findings.<stem>.json next to it. Throws runtime_error naming a path that
// does not exist or a directory without traces.
struct TraceInputs {
    std::vector<std::string> traces;
    std::vector<std::string> findings;  // sorted, each once
};
TraceInputs expand_trace_paths(const std::vector<std::string>& paths);

// The per-process findings files (findings.<stem>.json, not findings.json)
// directly in `dir`.
std::vector<std::string> rank_findings_files_in(const std::string& dir);

// Reads `files` and merges them (merge_findings' order). Throws
// FindingsError.
FindingsFile merge_findings_files(const std::vector<std::string>& files);

// The directories of `dir` that hold its traces: `dir` itself when it has
// *.trace files, else its host-<name> subdirectories (allocscope run
// --per-host: one per host of a multi-node job), sorted.
std::vector<std::string> trace_dirs_in(const std::string& dir);

// The *.trace files of trace_dirs_in(dir), sorted; empty if it cannot be
// read.
std::vector<std::string> trace_files_in(const std::string& dir);

}  // namespace allocscope
