// allocscope report: attribution reports (text, JSON, HTML) of one or more
// traces, with the run's findings and symbolized stacks.
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "build_report.h"
#include "cli.h"
#include "output_file.h"
#include "progress.h"
#include "report.h"

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

// build_report with a progress bar while the traces are analysed (on a
// terminal only: progress.h).
Report build_report_in_view(const std::vector<std::string>& paths, long rank, size_t top,
                            const std::string& baseline = {}, bool timeline_allocations = true) {
    Progress progress;
    Report report = build_report(
        paths, rank, top, baseline,
        [&progress](const std::string& trace, size_t done, size_t total) {
            progress.show("analysed " + trace, done, total);
        },
        timeline_allocations);
    progress.done();
    return report;
}

}  // namespace

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
    const Report report = build_report_in_view(paths, rank, top, baseline, format != "text");
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
        Report report = build_report_in_view({out_dir}, -1, 10);
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
