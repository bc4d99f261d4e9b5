// Attribution reports: one or more ranks' analyses (analyze/analysis.h), the
// findings of the run, and the symbolized stacks both refer to, rendered as
// text, JSON (schema in docs/REPORT.md) or one self-contained HTML file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "analysis.h"
#include "diff.h"
#include "findings.h"
#include "frames.h"

namespace allocscope {

struct RankReport {
    TraceAnalysis analysis;
    // Symbolized frames (innermost first) of every stack the report shows:
    // the sites' and the evidence of this rank's findings.
    std::map<uint32_t, std::vector<std::string>> stacks;
    // Where a stack's Python frames begin (core/event.h, is_python_frame);
    // stacks without Python frames are not listed.
    std::map<uint32_t, size_t> python_from;
    // Live owner-pool bytes after each numbered layer's forward, per step
    // (analyze/diff.h, step_memory), and the same of the baseline run's
    // trace of this rank when the report was given a baseline.
    std::vector<StepMemory> steps;
    std::vector<StepMemory> baseline_steps;
    bool has_baseline = false;
};

// The lines the concise text report prints for a stack: it starts at the
// program's own code. Frames of allocscope, allocators, frameworks and the
// runtime (frames.h, FrameKind) are folded, each run of them into one line
// ("... 6 allocator frames, 18 framework frames"); up to `native` of the
// program's native frames are shown, then up to `python` of its Python
// frames, and a count of the rest ("... 5 more native frames"). A stack
// with none of the program's native frames but Python frames folds all its
// native frames; a stack with none of the program's frames at all folds only
// its leading allocscope and allocator frames and shows at least one frame.
std::vector<std::string> stack_lines(const RankReport& r, uint32_t stack, size_t native,
                                     size_t python);
// The frame stack_lines starts at (frames.h, program_start): the program's
// first, never allocscope's or the allocator's; the HTML labels a stack with
// it. "" for a stack not in r.stacks.
std::string stack_start(const RankReport& r, uint32_t stack);
// Every frame of a stack, innermost first (the full text report's).
std::vector<std::string> all_stack_lines(const RankReport& r, uint32_t stack);

struct Report {
    std::vector<RankReport> ranks;   // in rank order
    FindingsFile findings;           // empty when the run had none / none found
    bool findings_found = false;     // a findings file was read
    std::vector<std::string> notes;  // warnings to show (symbolization, findings)
    std::string baseline;            // the baseline run compared against, "" none
};

// The timeline as the HTML and JSON reports show it, at the detail of a
// drawing 1000 pixels across the span (timeline_x: 10 units a pixel):
// phase bands merged where narrower than a pixel (a band of the open one's
// phase within a pixel of its end extends it, any other narrower than half
// a pixel is left out), at most one step mark a pixel, and the forward ends
// of the last kShownForwardSteps steps that have any. Their size is bounded
// whatever the length of the trace.
struct TimelineX {
    uint64_t t0 = 0, t1 = 0;  // the span drawn: from the first sample to the trace's end
    bool by_time() const { return t1 > t0; }
    uint64_t operator()(uint64_t t_ns) const;  // 0..10000
};
TimelineX timeline_x(const TraceAnalysis& a);
// Without a span (every event at one instant) the bands and steps as they are.
std::vector<PhaseBand> shown_bands(const TraceAnalysis& a);
std::vector<StepMark> shown_steps(const TraceAnalysis& a);
inline constexpr size_t kShownForwardSteps = 100;
std::vector<const StepMemory*> shown_forward_ends(const std::vector<StepMemory>& steps);

// The (layer, phase) rows of all ranks added up: bytes summed, the
// retained maximum over ranks.
std::vector<TagStats> merged_tags(const Report& report);

// The rank a finding belongs to, as an index into report.ranks (the only
// rank when there is one); -1 when none matches.
int rank_index(const Report& report, int32_t rank);

// The part of an out-of-memory moment that a finding accounts for: the
// bytes and count of its evidence allocations among those the moment's
// allocated bytes are made of (OomMoment::live_seqs; evidence in another
// pool, such as segments of a block trace, is not part of it).
struct OomShare {
    const Finding* finding = nullptr;
    uint64_t bytes = 0;
    uint64_t count = 0;
};
// The findings of rank `r` (an element of report.ranks) that hold part of
// the memory live at `m`: errors, then warnings, then info, each by bytes.
std::vector<OomShare> oom_shares(const Report& report, const RankReport& r, const OomMoment& m);

// A moment's first line (who ran out, where, how much was asked) and the
// line on what was allocated and reserved then: plain text, for any
// rendering (HTML escapes it).
std::string oom_headline(const TraceAnalysis& a, const OomMoment& m);
std::string oom_held(const OomMoment& m);

// The self-check's lines (TraceAnalysis::counters): agreement with the
// allocator's own counters, and the device memory outside it. None when the
// trace has no counter marks.
std::vector<std::string> counter_lines(const TraceAnalysis& a);

// A few lines on a moment for a terminal: who asked for how much, where,
// what was allocated and reserved, and the findings' share.
std::string oom_summary(const Report& report, const RankReport& r, const OomMoment& m);

// Findings of several ranks that say the same thing, shown once: the same
// plugin, severity, layer, phase and basis, and the same summary (or the
// same but for its numbers: sizes, steps, counts). At most one finding per
// rank; members in rank order.
struct FindingGroup {
    std::vector<const Finding*> members;
};
// In the findings' order (the merged file's: by rank, then as written);
// a finding alone on its rank is a group of one.
std::vector<FindingGroup> collapse_findings(const FindingsFile& file);
// "rank 0", "ranks 0–1", "ranks 0–2, 5"; "no rank" for -1.
std::string ranks_text(std::vector<int32_t> ranks);
// One line (no newline, no "allocscope: ") for the run's summary when provenance did not run
// on some stream whose weight detectors ran (RankRun::provenance not "on"):
// what the detectors could only match by size there (layers per detector,
// never errors or warnings), why provenance did not run, and how to prove
// it; "" when every such stream had provenance, or when a stream that said
// nothing about it has no size-only match either.
std::string unproven_weights_line(const FindingsFile& file);
// Where provenance observed some steps only (RankRun::provenance "on in
// steps ..."): one line naming them, else "".
std::string provenance_steps_line(const FindingsFile& file);
// "9 errors, 0 warnings, 40 infos<where> (576, 0 and 2560 counting each
// rank's)": findings that several ranks found alike (collapse_findings)
// counted once; the count over the ranks follows where it differs.
std::string distinct_findings_text(const FindingsFile& file, const std::string& where = "");
// How many findings a report has, the line the text and HTML reports open
// their findings with: distinct_findings_text on the ranks that found any,
// and that what several ranks found alike is shown once.
std::string findings_count_line(const FindingsFile& file);
// Whose a group's finding is: "ranks 0–1", or the process ("pid 42") of a
// finding without a rank.
std::string group_ranks(const FindingGroup& group);
// For each rank whose finding differs from the group's first (bytes, count,
// summary or evidence: how many, their bytes and steps), a line
// "rank R: ..." saying how.
std::vector<std::string> group_differences(const FindingGroup& group);
// A group's summary line (summary_line with group_ranks), then its
// differences, each indented by two spaces.
std::vector<std::string> group_lines(const FindingGroup& group);

// The text report. Concise (the default): the run's summary, the
// out-of-memory moments, one timeline, the (layer, phase) rows that matter,
// the top sites and the findings merged over ranks, stacks from the
// program's code (stack_lines), info findings counted; docs/REPORT.md. Full:
// every rank's sections, every finding's evidence stacks, every frame.
enum class TextDetail { concise, full };
std::string render_text(const Report& report, TextDetail detail = TextDetail::concise);
std::string render_json(const Report& report);
std::string render_html(const Report& report);

// Text escaped for HTML element content and attribute values.
std::string html_escape(std::string_view text);

}  // namespace allocscope
