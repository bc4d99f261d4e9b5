#include "build_report.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "analysis.h"
#include "imbalance.h"
#include "parallel.h"
#include "run_inputs.h"
#include "symbolize.h"
#include "trace_reader.h"

namespace allocscope {

namespace {

// Every stack the report shows for a rank: its sites' and its findings'.
std::set<uint32_t> stacks_shown(const TraceAnalysis& a, const FindingsFile& findings, bool only,
                                int32_t rank) {
    std::set<uint32_t> ids;
    for (const auto* sites : {&a.sites_at_peak, &a.sites_at_exit}) {
        for (const Site& s : *sites) {
            if (s.stack) ids.insert(s.stack);
        }
    }
    for (const TagStats& t : a.tags) {
        for (const StackBytes& s : t.sites) {
            if (s.stack) ids.insert(s.stack);
        }
    }
    for (const TimelineAllocation& l : a.timeline.allocations) {
        if (l.stack) ids.insert(l.stack);
    }
    for (const OomMoment& m : a.ooms) {
        if (m.stack) ids.insert(m.stack);
        for (const Site& s : m.sites) {
            if (s.stack) ids.insert(s.stack);
        }
    }
    for (const Finding& f : findings.findings) {
        if (!only && f.rank != rank) continue;
        for (const Evidence& e : f.evidence) {
            if (e.stack_id) ids.insert(e.stack_id);
        }
    }
    return ids;
}

// One trace's part of a report, computed on a worker thread: its rank's
// section, none when it is not reported, and the notes it gives, in order.
struct TraceReport {
    std::optional<RankReport> rank;
    std::vector<std::string> notes;
};

// What the traces of one report share, read-only while they are analysed.
struct ReportInputs {
    long rank = -1;     // only this rank's trace, -1: all
    bool only = false;  // a single trace: its problems are the report's
    AnalysisOptions options;
    const FindingsFile* findings = nullptr;
    std::string baseline;
    std::map<int32_t, std::vector<StepMemory>> baseline_steps;  // by rank
};

TraceReport report_trace(const std::string& path, const ReportInputs& in) {
    TraceReport out;
    // An unreadable trace (its header, or a corrupt record before its first
    // event) is one note among several traces (the others are reported);
    // alone, it is the error.
    auto unreadable = [&](const TraceError& e) {
        if (in.only) return false;
        out.notes.push_back(std::string(e.what()) + "; this trace is not reported");
        return true;
    };
    std::optional<TraceStream> stream;
    try {
        stream.emplace(path);
    } catch (const TraceError& e) {
        if (!unreadable(e)) throw;
        return out;
    }
    // --rank R: only R's trace is read, the others' headers.
    if (in.rank >= 0 && stream->header().rank != in.rank) return out;
    RankReport r;
    // A corrupt record ends the trace, with a warning. The first pass
    // throws where it comes before any event; a later pass, where the file
    // no longer holds what the first read (an error, as alone).
    try {
        r.analysis = analyze(*stream, in.options, &r.steps);
    } catch (const TraceError& e) {
        if (stream->counted() || !unreadable(e)) throw;
        return out;
    }
    const TraceTables& t = stream->tables();
    // One trace each: paired whatever their ranks (as diff pairs them).
    auto base = in.baseline_steps.size() == 1 && in.only ? in.baseline_steps.begin()
                                                         : in.baseline_steps.find(t.header.rank);
    if (base != in.baseline_steps.end()) {
        r.baseline_steps = base->second;
        r.has_baseline = true;
    } else if (!in.baseline.empty()) {
        out.notes.push_back("the baseline " + in.baseline + " has no trace of rank " +
                            std::to_string(t.header.rank));
    }
    // Symbolize what the report shows, each address once.
    Symbolizer symbolizer(t.modules, [&out](const std::string& w) { out.notes.push_back(w); });
    symbolizer.use_strings(t.strings);
    std::vector<uint64_t> addresses;
    const std::set<uint32_t> ids = stacks_shown(r.analysis, *in.findings, in.only, t.header.rank);
    for (uint32_t id : ids) {
        if (id < t.stacks.size())
            addresses.insert(addresses.end(), t.stacks[id].begin(), t.stacks[id].end());
    }
    symbolizer.resolve(addresses, [](size_t, size_t) {});
    for (uint32_t id : ids) {
        if (id >= t.stacks.size()) continue;
        std::vector<std::string>& frames = r.stacks[id];
        for (const SymbolizedFrame* f : symbolizer.stack(t.stacks[id])) {
            if (is_python_frame(f->address) && !r.python_from.contains(id))
                r.python_from[id] = frames.size();
            frames.push_back(f->text());
        }
    }
    out.rank = std::move(r);
    return out;
}

}  // namespace

Report build_report(const std::vector<std::string>& paths, long rank, size_t top,
                    const std::string& baseline, const ReportProgress& progress,
                    bool timeline_allocations) {
    const TraceInputs in = expand_trace_paths(paths);
    Report report;
    ReportInputs shared;
    shared.rank = rank;
    shared.only = in.traces.size() == 1;
    shared.options.top_sites = top;
    if (!timeline_allocations) shared.options.timeline_allocations = 0;
    shared.findings = &report.findings;
    shared.baseline = baseline;
    if (!baseline.empty()) {
        report.baseline = baseline;
        const std::vector<std::string> files = expand_trace_paths({baseline}).traces;
        auto steps = parallel_map(files.size(), [&](size_t i) {
            TraceStream t(files[i]);  // TraceError names the file and offset
            return std::pair{t.header().rank, step_memory(t)};
        });
        for (auto& [r, s] : steps)
            shared.baseline_steps[r] = std::move(s);
    }
    if (!in.findings.empty()) {
        try {
            report.findings = merge_findings_files(in.findings);
            report.findings_found = true;
        } catch (const std::exception& e) {
            report.notes.push_back(std::string("findings not shown: ") + e.what());
        }
    }
    if (rank >= 0 && report.findings_found) {
        std::erase_if(report.findings.findings,
                      [rank](const Finding& f) { return f.rank != rank; });
    }
    // The traces side by side, one per core; their sections and notes are
    // taken in the order of the traces, so the report is the same however
    // they were scheduled.
    std::mutex progress_mutex;
    size_t finished = 0;
    std::vector<TraceReport> parts = parallel_map(in.traces.size(), [&](size_t i) {
        TraceReport part = report_trace(in.traces[i], shared);
        const std::lock_guard lock(progress_mutex);
        if (progress) progress(in.traces[i], ++finished, in.traces.size());
        return part;
    });
    // A note once, however many traces give it (traces of one machine read
    // on another: the same module cannot be symbolized for each).
    for (TraceReport& part : parts) {
        for (const std::string& w : part.notes) {
            if (std::find(report.notes.begin(), report.notes.end(), w) == report.notes.end())
                report.notes.push_back(w);
        }
        if (part.rank) report.ranks.push_back(std::move(*part.rank));
    }
    if (report.ranks.empty()) throw std::runtime_error("no trace of rank " + std::to_string(rank));
    std::stable_sort(report.ranks.begin(), report.ranks.end(),
                     [](const RankReport& a, const RankReport& b) {
                         return a.analysis.header.rank < b.analysis.header.rank;
                     });
    // Cross-rank findings come from the ranks' analyses side by side: made
    // anew when several ranks are read (a findings file's, from the run's
    // end, stand for one rank read alone).
    if (report.ranks.size() >= 2) {
        std::vector<const TraceAnalysis*> analyses;
        for (const RankReport& r : report.ranks)
            analyses.push_back(&r.analysis);
        std::erase_if(report.findings.findings,
                      [](const Finding& f) { return f.plugin == kImbalancePlugin; });
        for (Finding& f : imbalance_findings(analyses)) {
            report.findings.findings.push_back(std::move(f));
            report.findings_found = true;
        }
    }
    return report;
}

}  // namespace allocscope
