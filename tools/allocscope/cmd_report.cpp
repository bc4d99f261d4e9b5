// allocscope report: attribution reports (text, JSON, HTML) of one or more
// traces, with the run's findings and symbolized stacks.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "analysis.h"
#include "args.h"
#include "cli.h"
#include "imbalance.h"
#include "output_file.h"
#include "parallel.h"
#include "progress.h"
#include "report.h"
#include "symbolize.h"
#include "trace_reader.h"

namespace allocscope::cli {

namespace {

constexpr const char* kReportHelp =
    R"(usage: allocscope report PATH... [--format text|json|html] [--full]
                         [-o FILE] [--rank R] [--top N] [--baseline RUN]

An attribution report of a run. PATH is an output directory (every *.trace
in it, and its findings.json) or trace files (with findings.<name>.json
next to each when there is one). A trace that ran out of memory opens with
that moment: the request (rank, step, layer/phase, size, stack), what was
live then by (layer, phase) and by site, the allocator's cached but
unallocated bytes, and the findings whose allocations were part of it.
Per rank, and merged over ranks:
  * peak and live bytes per pool (device segments, caching-allocator
    blocks, pinned host memory);
  * a per (layer, phase) table: bytes allocated, the most one scope of it
    left alive at its end, bytes live at the peak and at exit;
  * the memory timeline with phase bands and step markers;
  * the top allocation sites (symbolized stacks) at the peak and at exit;
  * the findings of the detection plugins with their evidence and stacks.
Stacks are symbolized from the module files the traced process had loaded
(a file that is missing or was rebuilt since gives one note, and raw
module+offset frames). A trace cut short is reported up to where it ends.

The text report is concise unless --full: the ranks merged (a finding or
site several ranks share is shown once, with what differs), the (layer,
phase) rows at the top of a column, the top sites, errors and warnings with
one evidence each, info findings counted; stacks start at the program's own
code, allocscope's, the allocator's and the framework's frames folded into
one line ("... 6 allocator frames, 18 framework frames").

options:
  --format F   text (default), json or html (one self-contained file)
  --full       the whole text report: every rank's sections, every finding,
               every frame of every stack shown
  -o FILE      write the report to FILE instead of standard output
  --rank R     only the traces of rank R
  --top N      allocation sites per list (default 10)
  --baseline RUN
               an earlier run (output directory or trace) to compare with:
               the HTML and JSON reports add its live bytes after each
               layer's forward, rank by rank

exit status: 0 when the report is written, 2 on bad input (no, unreadable
or corrupt trace, no trace of rank R, an -o FILE that cannot be written:
nothing is left half-written there).

examples:
  allocscope report allocscope-out
  allocscope report allocscope-out --full -o everything.txt
  allocscope report allocscope-out --format html -o report.html
  allocscope report new-out --baseline old-out --format html -o report.html
)";

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
        r.analysis = analyze(*stream, in.options);
    } catch (const TraceError& e) {
        if (stream->counted() || !unreadable(e)) throw;
        return out;
    }
    r.steps = step_memory(*stream, TraceShape{r.analysis.owner, r.analysis.main_tid});
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
                    const std::string& baseline) {
    const TraceInputs in = expand_trace_paths(paths);
    Report report;
    ReportInputs shared;
    shared.rank = rank;
    shared.only = in.traces.size() == 1;
    shared.options.top_sites = top;
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
    Progress progress;
    std::mutex progress_mutex;
    size_t finished = 0;
    std::vector<TraceReport> parts = parallel_map(in.traces.size(), [&](size_t i) {
        TraceReport part = report_trace(in.traces[i], shared);
        const std::lock_guard lock(progress_mutex);
        progress.show("analysed " + in.traces[i], ++finished, in.traces.size());
        return part;
    });
    progress.done();
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

// Through a fresh 0600 file renamed over `path`: a symlink or file planted
// at `path` (a shared output directory) is replaced, never written through.
void write_text_file(const std::string& path, const std::string& text) {
    write_file_atomically(path, text);
}

int report_command(const std::vector<std::string>& args) {
    long rank = -1;
    size_t top = 10;
    std::string format = "text", output, baseline;
    bool full = false;
    Args parser("report", kReportHelp);
    parser.value({"--rank"}, non_negative("--rank", rank, std::numeric_limits<int32_t>::max()))
        .value({"--top"}, non_negative("--top", top))
        .value({"--format"}, one_of("--format", {"text", "json", "html"}, format))
        .value({"--baseline"}, baseline)
        .value({"-o"}, output)
        .flag({"--full"}, full);
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& paths = parser.positionals();
    if (paths.empty())
        return fail("report needs a trace file or directory (" + parser.see_help() + ")");
    std::vector<std::string> inputs = paths;
    if (!baseline.empty()) inputs.push_back(baseline);
    if (const std::string problem = overwrite_problem(output, inputs); !problem.empty())
        return fail(problem);
    const Report report = build_report(paths, rank, top, baseline);
    const std::string text =
        format == "json"   ? render_json(report)
        : format == "html" ? render_html(report)
                           : render_text(report, full ? TextDetail::full : TextDetail::concise);
    if (output.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        return 0;
    }
    write_text_file(output, text);
    std::fprintf(stderr, "allocscope: wrote %s\n", output.c_str());
    return 0;
}

std::optional<Report> write_run_reports(const std::string& out_dir) {
    try {
        Report report = build_report({out_dir}, -1, 10);
        write_text_file(out_dir + "/report.txt", render_text(report));
        write_text_file(out_dir + "/report.html", render_html(report));
        return report;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "allocscope: no report written: %s\n", e.what());
        return std::nullopt;
    }
}

void print_oom_moments(const Report& report) {
    for (const RankReport& r : report.ranks) {
        if (r.analysis.ooms.empty()) continue;
        std::string text = oom_summary(report, r, r.analysis.ooms.back());
        if (r.analysis.oom_moments_total > 1)
            text += "  (" + std::to_string(r.analysis.oom_moments_total) +
                    " out-of-memory moments in this trace; report.txt has the last ones)\n";
        std::fprintf(stderr, "allocscope: %s", text.c_str());
    }
}

}  // namespace allocscope::cli
