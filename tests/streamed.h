// A trace's analysis as the CLI computes it, streamed from its file
// (TraceStream), checked against the analysis of the loaded trace: the same
// numbers, field by field.
#pragma once

#include <doctest/doctest.h>

#include "analysis.h"
#include "diff.h"
#include "trace_reader.h"

namespace allocscope::test {

inline void check_same_analysis(const TraceAnalysis& streamed, const TraceAnalysis& loaded) {
    INFO("trace " << loaded.path);
    CHECK(streamed.path == loaded.path);
    CHECK(streamed.header == loaded.header);
    CHECK(streamed.truncated == loaded.truncated);
    CHECK(streamed.truncation_message == loaded.truncation_message);
    CHECK(streamed.events == loaded.events);
    CHECK(streamed.span_ns == loaded.span_ns);
    CHECK(streamed.unknown_frees == loaded.unknown_frees);
    CHECK(streamed.double_frees == loaded.double_frees);
    CHECK(streamed.failed_frees == loaded.failed_frees);
    CHECK(streamed.oom_events == loaded.oom_events);
    CHECK(streamed.largest_failed_request == loaded.largest_failed_request);
    CHECK(streamed.steps == loaded.steps);
    CHECK(streamed.events_by_kind == loaded.events_by_kind);
    CHECK(streamed.calls_by_api == loaded.calls_by_api);
    CHECK(streamed.odd_frees == loaded.odd_frees);
    CHECK(streamed.owner == loaded.owner);
    CHECK(streamed.main_tid == loaded.main_tid);
    CHECK(streamed.pools == loaded.pools);
    CHECK(streamed.tags == loaded.tags);
    CHECK(streamed.timeline.layers == loaded.timeline.layers);
    CHECK(streamed.timeline.points == loaded.timeline.points);
    CHECK(streamed.timeline.bands == loaded.timeline.bands);
    CHECK(streamed.timeline.steps == loaded.timeline.steps);
    CHECK(streamed.timeline.allocations == loaded.timeline.allocations);
    CHECK(streamed.sites_at_peak == loaded.sites_at_peak);
    CHECK(streamed.sites_at_exit == loaded.sites_at_exit);
    CHECK(streamed.ooms == loaded.ooms);
    CHECK(streamed.oom_moments_total == loaded.oom_moments_total);
    CHECK(streamed.recovered_failures == loaded.recovered_failures);
    CHECK(streamed.counters == loaded.counters);
    CHECK(streamed.step_starts == loaded.step_starts);
    CHECK(streamed.groups_at_last_step == loaded.groups_at_last_step);
    CHECK(streamed == loaded);  // and whatever field comes next
}

// analyze(trace, options), checked against the streamed analysis of the
// file it was loaded from.
inline TraceAnalysis analyzed(const Trace& trace, const AnalysisOptions& options = {}) {
    TraceAnalysis loaded = analyze(trace, options);
    TraceStream stream(trace.path);
    check_same_analysis(analyze(stream, options), loaded);
    CHECK(stream.size() == trace.events.size());
    return loaded;
}

// measure_run(trace), checked against the streamed measure of its file.
inline RunMeasure measured(const Trace& trace) {
    RunMeasure loaded = measure_run(trace);
    TraceStream stream(trace.path);
    CHECK(measure_run(stream) == loaded);
    return loaded;
}

}  // namespace allocscope::test
