// Building a report: the traces of a run (or of some of its ranks) read
// and analysed side by side, one per core, with the run's findings merged,
// cross-rank findings made anew, a baseline's steps paired by rank and the
// stacks the report shows symbolized. What `allocscope report` and the end
// of `allocscope run` render (analyze/report.h).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "report.h"

namespace allocscope {

// The report of `paths` (output directories or trace files), with their
// findings and symbolized stacks; rank -1: every rank. Throws on unreadable
// input (TraceError, runtime_error), naming it.
// `baseline`: an output directory or trace whose per-layer forward samples
// (analyze/diff.h) the HTML report overlays, traces paired by rank; "" none.
// `progress` is called as each trace's analysis ends (from the worker
// threads, one call at a time): the trace, how many are done, of how many.
// `timeline_allocations`: whether the timeline's samples name each layer's
// largest live allocations (the HTML and JSON reports show them; the text
// report does not, and leaving them out saves their tracking in the
// accounting pass, about a fifth of its time).
using ReportProgress = std::function<void(const std::string&, size_t, size_t)>;
Report build_report(const std::vector<std::string>& paths, long rank, size_t top,
                    const std::string& baseline = {}, const ReportProgress& progress = {},
                    bool timeline_allocations = true);

}  // namespace allocscope
