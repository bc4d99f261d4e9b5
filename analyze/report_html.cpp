// The HTML rendering of a Report: one self-contained file (inline CSS and
// script, no external resource). Tables are HTML; the timeline, the
// per-layer forward chart, stacks and tooltips are drawn by the script from
// one JSON object (interned strings and stacks, bytes in KiB, time in
// 1/10000 of the span). Every string that comes from a trace or a findings
// file goes through html_escape, or into that JSON with '<', '>' and '&'
// escaped, and reaches the page through textContent.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "frames.h"
#include "report.h"
#include "report_assets.h"
#include "report_internal.h"

// The page's style sheet and script are report_assets/report.css and
// report.js, embedded at build time (tools/embed_assets.py). The script draws
// the timelines and the per-layer forward chart from the page's data
// (page_data), shows tooltips, fills stacks in when opened and selects a
// layer group on a click (Escape clears). Only textContent and attributes
// carry the data's strings into the page.

namespace allocscope {

namespace {

const char* const kLayerColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
                                    "#d37295", "#8cd17d", "#bab0ac"};

// By base phase: a sub-phase ("backward/recompute") shares its base's colour.
const char* phase_color(const std::string& phase) {
    const std::string_view base = base_phase(phase);
    if (base == "forward") return "#dbe9f6";
    if (base == "backward") return "#fbe3cf";
    if (base == "optimizer") return "#dcefd8";
    return "#eeeeee";
}

std::string u(uint64_t v) {
    return std::to_string(v);
}

std::string h(std::string_view s) {
    return html_escape(s);
}

// A row about a layer: a click on its layer cell (tag_cell) selects the
// row's layer group, the group marks the row.
std::string layer_row(const std::string& layer) {
    return "<tr data-g=\"" + h(layer_group(layer)) + "\">";
}

// A layer and phase as two cells of a layer_row.
std::string tag_cell(const std::string& layer, const std::string& phase) {
    return "<td class=pick>" +
           (layer.empty() ? std::string("<span class=muted>(untagged)</span>") : h(layer)) +
           "</td><td>" + (phase.empty() ? std::string("-") : h(phase)) + "</td>";
}

std::string rank_title(const TraceAnalysis& a) {
    return a.header.rank >= 0 ? "rank " + std::to_string(a.header.rank)
                              : "pid " + std::to_string(a.header.pid);
}

// A stack, folded, labelled by the frame its text starts at (the
// program's, report.h stack_start): the script fills in its frames (from
// the data's interned stacks) when it is opened.
std::string frames_block(const RankReport& r, size_t rank_index, uint32_t stack) {
    if (stack == 0) return "<span class=muted>no stack captured</span>";
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end() || it->second.empty())
        return "<span class=muted>stack " + u(stack) + "</span>";
    return "<details class=stack data-r=" + u(rank_index) + " data-s=" + u(stack) +
           "><summary>stack " + u(stack) + ": " + h(stack_start(r, stack)) + "</summary></details>";
}

// Where the script draws a rank's timeline (stacked areas per layer group,
// phase bands behind, step markers, the segment total dashed), with its
// legend: a layer's entry selects that layer.
std::string timeline_panel(const TraceAnalysis& a, size_t rank_index) {
    const Timeline& tl = a.timeline;
    if (tl.points.empty()) return "<p class=muted>no events</p>";
    std::string out = "<div class=timeline data-r=" + u(rank_index) + "></div><div class=legend>";
    for (size_t l = 0; l < tl.layers.size(); ++l) {
        out += "<span class=pick data-g=\"" + h(tl.layers[l]) + "\"><i style=\"background:" +
               std::string(kLayerColors[l % std::size(kLayerColors)]) + "\"></i>" +
               h(tl.layers[l]) + "</span>";
    }
    for (const char* p : {"forward", "backward", "optimizer"}) {
        out += "<span><i style=\"background:" + std::string(phase_color(p)) + "\"></i>" + p +
               " (band)</span>";
    }
    return out + "<span>- - - device segments (reserved)</span></div>";
}

// Layers (rows) × base phases (columns): bytes allocated, shaded. A cell
// names the rank's tags it adds up (indices into a.tags) for the script's
// tooltip; a row's layer group selects that layer.
std::string heat_map(const TraceAnalysis& a, size_t rank_index) {
    struct Cell {
        uint64_t bytes = 0;
        std::string tags;  // indices into a.tags, space-separated
    };
    std::map<std::string, std::map<std::string, Cell>> cells;
    std::map<std::string, uint64_t> row_total;
    std::set<std::string> phases;
    uint64_t top = 1;
    for (size_t k = 0; k < a.tags.size(); ++k) {
        const TagStats& t = a.tags[k];
        if (t.allocated_bytes == 0) continue;
        const std::string layer = t.layer.empty() ? "(untagged)" : t.layer;
        const std::string phase = t.phase.empty() ? "-" : std::string(base_phase(t.phase));
        Cell& c = cells[layer][phase];
        c.bytes += t.allocated_bytes;
        c.tags += (c.tags.empty() ? "" : " ") + u(k);
        top = std::max(top, c.bytes);
        row_total[layer] += t.allocated_bytes;
        phases.insert(phase);
    }
    if (cells.empty()) return "<p class=muted>no allocations</p>";
    std::vector<std::string> rows;
    for (const auto& [layer, total] : row_total)
        rows.push_back(layer);
    std::stable_sort(rows.begin(), rows.end(), [&](const std::string& x, const std::string& y) {
        return row_total[x] > row_total[y];
    });
    const size_t limit = 40;
    std::string out = "<table class=heat data-r=" + u(rank_index) + "><tr><th>layer \\ phase</th>";
    for (const std::string& p : phases)
        out += "<th>" + h(p) + "</th>";
    out += "</tr>";
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
        out += layer_row(rows[i] == "(untagged)" ? "" : rows[i]) + "<td class=pick>" + h(rows[i]) +
               "</td>";
        for (const std::string& p : phases) {
            auto it = cells[rows[i]].find(p);
            if (it == cells[rows[i]].end()) {
                out += "<td class=c></td>";
                continue;
            }
            const double share = double(it->second.bytes) / double(top);
            const int alpha = int(15 + 85 * share);
            out += "<td class=c data-t=\"" + it->second.tags +
                   "\" style=\"background:rgba(225,87,89," + std::to_string(alpha / 100) + "." +
                   (alpha % 100 < 10 ? "0" : "") + std::to_string(alpha % 100) + ")\">" +
                   h(human_bytes(it->second.bytes)) + "</td>";
        }
        out += "</tr>";
    }
    out += "</table>";
    if (rows.size() > limit)
        out += "<p class=muted>" + u(rows.size() - limit) + " more layers in the JSON report</p>";
    return out;
}

std::string tag_table(const std::vector<TagStats>& tags, size_t limit) {
    std::string out =
        "<table class=tags><tr><th>layer</th><th>phase</th><th>allocated</th><th>allocations</th>"
        "<th title=\"the most one scope of the tag left alive at its end\">kept at end</th>"
        "<th>live at peak</th><th>live at exit</th></tr>";
    size_t shown = 0;
    for (const TagStats& t : tags) {
        if (t.allocations == 0 && t.at_peak == 0) continue;
        if (shown++ == limit) break;
        out += layer_row(t.layer) + tag_cell(t.layer, t.phase) + "<td class=n>" +
               h(human_bytes(t.allocated_bytes)) + "</td><td class=n>" + u(t.allocations) +
               "</td><td class=n>" + (t.retained_max ? h(human_bytes(t.retained_max)) : "-") +
               "</td><td class=n>" + (t.at_peak ? h(human_bytes(t.at_peak)) : "-") +
               "</td><td class=n>" + (t.at_exit ? h(human_bytes(t.at_exit)) : "-") + "</td></tr>";
    }
    return out + "</table>";
}

std::string sites_table(const RankReport& r, size_t rank_index, const std::vector<Site>& sites) {
    if (sites.empty()) return "<p class=muted>none</p>";
    std::string out =
        "<table class=sites><tr><th>#</th><th>bytes</th><th>allocations</th>"
        "<th>mostly</th><th></th><th>stack</th></tr>";
    for (size_t k = 0; k < sites.size(); ++k) {
        const Site& s = sites[k];
        out += layer_row(s.layer) + "<td class=n>" + u(k + 1) + "</td><td class=n>" +
               h(human_bytes(s.bytes)) + "</td><td class=n>" + u(s.count) + "</td>" +
               tag_cell(s.layer, s.phase) + "<td>" + frames_block(r, rank_index, s.stack) +
               "</td></tr>";
    }
    return out + "</table>";
}

// A finding as one or several ranks made it (collapse_findings): the line
// naming its ranks, a line for each rank whose finding differs, and each
// rank's evidence, expandable.
std::string finding_details(const Report& report, const FindingGroup& g) {
    const Finding& f = *g.members[0];
    const std::string sev(to_string(f.severity));
    std::string out = "<details class=finding><summary><span class=\"sev-" + sev + "\">" + h(sev) +
                      "</span> <b>" + h(f.plugin) + "</b> " + h(group_ranks(g)) + " " +
                      h(f.layer.empty() ? "-" : f.layer) + " " + h(f.phase) + " &mdash; " +
                      h(human_bytes(f.bytes)) + ": " + h(f.summary) +
                      (f.basis.empty() ? std::string() : " <i>(" + h(f.basis) + ")</i>");
    for (const std::string& line : group_differences(g))
        out += "<span class=differs>" + h(line) + "</span>";
    out += "</summary>";
    const bool several = g.members.size() > 1;
    out += std::string("<table><tr>") + (several ? "<th>rank</th>" : "") +
           "<th>size</th><th>layer</th><th>phase</th><th>step</th>"
           "<th>alloc seq</th><th>freed at</th><th>stack</th></tr>";
    for (const Finding* m : g.members) {
        const int ri = rank_index(report, m->rank);
        for (const Evidence& e : m->evidence) {
            out += layer_row(e.layer) +
                   (several ? "<td class=n>" + std::to_string(m->rank) + "</td>" : "") +
                   "<td class=n>" + h(human_bytes(e.size)) + "</td>" + tag_cell(e.layer, e.phase) +
                   "<td class=n>" + u(e.step) + "</td><td class=n>" + u(e.alloc_seq) +
                   "</td><td class=n>" + (e.free_seq ? u(e.free_seq) : std::string("alive")) +
                   "</td><td>" + (e.note.empty() ? std::string() : "<div>" + h(e.note) + "</div>") +
                   (ri >= 0 ? frames_block(report.ranks[size_t(ri)], size_t(ri), e.stack_id)
                            : "stack " + u(e.stack_id)) +
                   "</td></tr>";
        }
    }
    return out + "</table></details>";
}

// The findings merged over ranks as the text report merges them, counted
// as it counts them: problems (errors, then warnings) first, each
// expandable to its evidence; info findings (reports such as peak-owner's)
// folded under one line.
std::string findings_panel(const Report& report) {
    if (!report.findings_found)
        return "<p class=muted>No findings file next to the traces (run with plugins, or "
               "<code>allocscope replay</code>).</p>";
    std::string out = "<p>" + h(findings_count_line(report.findings)) + "</p>";
    for (const std::string& line :
         {unproven_weights_line(report.findings), provenance_steps_line(report.findings)}) {
        if (!line.empty()) out += "<div class=note>" + h(line) + "</div>";
    }
    const std::vector<FindingGroup> groups = collapse_findings(report.findings);
    out += "<div class=findings>";
    for (Severity level : {Severity::error, Severity::warning}) {
        for (const FindingGroup& g : groups) {
            if (g.members[0]->severity == level) out += finding_details(report, g);
        }
    }
    const size_t infos =
        size_t(std::count_if(groups.begin(), groups.end(), [](const FindingGroup& g) {
            return g.members[0]->severity == Severity::info;
        }));
    if (infos > 0) {
        out += "<details class=infos><summary>" + u(infos) +
               " info finding(s): who owns memory at the peak and other reports</summary>";
        for (const FindingGroup& g : groups) {
            if (g.members[0]->severity == Severity::info) out += finding_details(report, g);
        }
        out += "</details>";
    }
    return out + "</div>";
}

// The out-of-memory moments of every rank: what was asked, what was live,
// and the findings' share of it.
std::string oom_panel(const Report& report) {
    std::string out;
    for (size_t ri = 0; ri < report.ranks.size(); ++ri) {
        const RankReport& r = report.ranks[ri];
        const TraceAnalysis& a = r.analysis;
        for (const OomMoment& m : a.ooms) {
            out += "<div class=oom><h3>" + h(oom_headline(a, m)) + "</h3><p>" + h(oom_held(m)) +
                   "</p>" + frames_block(r, ri, m.stack);
            const std::vector<OomShare> shares = oom_shares(report, r, m);
            if (!shares.empty()) {
                out +=
                    "<table><tr><th>finding</th><th>layer</th><th>phase</th>"
                    "<th>held at this moment</th><th>allocations</th></tr>";
                size_t infos = 0;
                for (const OomShare& s : shares) {
                    const Finding& f = *s.finding;
                    if (f.severity == Severity::info && infos++ >= 5) continue;
                    out += layer_row(f.layer) + "<td><span class=sev-" + h(to_string(f.severity)) +
                           ">" + h(to_string(f.severity)) + "</span> " + h(f.plugin) + "</td>" +
                           tag_cell(f.layer, f.phase) + "<td class=n>" + h(human_bytes(s.bytes)) +
                           " of " + h(human_bytes(m.allocated_known ? m.allocated : m.reserved)) +
                           "</td><td class=n>" + u(s.count) + "</td></tr>";
                }
                out += "</table>";
            }
            out += "<table><tr><th>layer</th><th>phase</th><th>live</th><th>allocations</th></tr>";
            for (const TagLive& t2 : m.by_tag) {
                out += layer_row(t2.layer) + tag_cell(t2.layer, t2.phase) + "<td class=n>" +
                       h(human_bytes(t2.bytes)) + "</td><td class=n>" + u(t2.count) + "</td></tr>";
            }
            out += "</table><h3>Live at that moment by site</h3>" + sites_table(r, ri, m.sites) +
                   "</div>";
        }
    }
    return out;
}

// Strings of the page's data, each once: frames, layer and phase names.
class StringTable {
  public:
    std::string id(const std::string& text) {
        auto [it, added] = ids_.try_emplace(text, list_.size());
        if (added) list_.push_back(text);
        return u(it->second);
    }
    std::string json() const {
        std::string out = "[";
        for (size_t k = 0; k < list_.size(); ++k)
            out += (k ? "," : "") + json_quote(list_[k]);
        return out + "]";
    }

  private:
    std::unordered_map<std::string, size_t> ids_;
    std::vector<std::string> list_;
};

std::string kib(uint64_t bytes) {
    return u((bytes + 512) / 1024);
}

// Frames a tooltip leaves out at the top of a stack: the allocator's and
// allocscope's own, the same in every stack of their kind (frames.h).
bool internal_frame(std::string_view f) {
    return above_the_request(native_frame_kind(f));
}

// ... and at the bottom of its native part: the C library's start-up.
bool startup_frame(std::string_view f) {
    return f.starts_with("__libc_start") || f == "_start" || f.starts_with("_start ");
}

// A rank's stacks: {"id": [first, end, python, frame...]}: the tooltip shows
// native frames [first, end) and Python frames from `python` (the first of
// the program's own).
std::string stacks_json(const RankReport& r, StringTable& strings) {
    std::string out = "{";
    bool first_stack = true;
    for (const auto& [id, frames] : r.stacks) {
        auto py = r.python_from.find(id);
        const size_t python = py == r.python_from.end() ? frames.size() : py->second;
        size_t first = 0;
        while (first + 1 < python && internal_frame(frames[first]))
            ++first;
        // Python frames from the program's own code (the framework's and
        // the interpreter's above it left out), when it has any.
        size_t python_first = python;
        while (python_first < frames.size() &&
               python_frame_kind(frames[python_first]) != FrameKind::user)
            ++python_first;
        if (python_first == frames.size()) python_first = python;
        size_t end = python;
        while (end > first + 1 && startup_frame(frames[end - 1]))
            --end;
        out += (first_stack ? "\"" : ",\"") + u(id) + "\":[" + u(first) + "," + u(end) + "," +
               u(python_first);
        first_stack = false;
        for (const std::string& f : frames)
            out += "," + strings.id(f);
        out += "]";
    }
    return out + "}";
}

// Per step (the last 100 with any): [step, [[layer, KiB live after its forward]...]].
std::string forward_json(const std::vector<StepMemory>& steps, StringTable& strings) {
    const std::vector<const StepMemory*> used = shown_forward_ends(steps);
    std::string out = "[";
    for (size_t k = 0; k < used.size(); ++k) {
        out += (k ? ",[" : "[") + u(used[k]->step) + ",[";
        for (size_t i = 0; i < used[k]->forward_ends.size(); ++i) {
            const auto& [layer, bytes] = used[k]->forward_ends[i];
            out += (i ? ",[" : "[") + strings.id(layer) + "," + kib(bytes) + "]";
        }
        out += "]]";
    }
    return out + "]";
}

// One rank's timeline for the script: sample positions (x, 0..10000 of the
// span), totals and per-layer bytes in KiB, phase bands merged where
// narrower than a pixel, step marks, and each layer's largest live
// allocations as runs: [sample, allocation...] from that sample on.
std::string timeline_json(const TraceAnalysis& a, StringTable& strings) {
    const Timeline& tl = a.timeline;
    const size_t n = tl.points.size();
    const TimelineX x_of_t = timeline_x(a);
    const bool by_time = x_of_t.by_time();
    std::string out = "\"span\":" + u(by_time ? x_of_t.t1 - x_of_t.t0 : 0) + ",\"x\":[";
    for (size_t i = 0; i < n; ++i) {
        out += (i ? "," : "") +
               u(by_time ? x_of_t(tl.points[i].t_ns)
                         : uint64_t(10000.0 * double(i) / double(std::max<size_t>(1, n - 1))));
    }
    out += "],\"seg\":[";
    for (size_t i = 0; i < n; ++i)
        out += (i ? "," : "") + kib(tl.points[i].segment_bytes);
    out += "],\"layers\":[";
    for (size_t l = 0; l < tl.layers.size(); ++l)
        out += (l ? "," : "") + strings.id(tl.layers[l]);
    out += "],\"lb\":[";
    for (size_t l = 0; l < tl.layers.size(); ++l) {
        out += l ? ",[" : "[";
        for (size_t i = 0; i < n; ++i) {
            const auto& lb = tl.points[i].layer_bytes;
            out += (i ? "," : "") + kib(l < lb.size() ? lb[l] : 0);
        }
        out += "]";
    }
    // Each layer's largest live allocations per sample: 3, or fewer when a
    // rank's would name more than kAllocationBudget allocations (a run that
    // churns through big short-lived ones), renumbered in order of use.
    constexpr size_t kAllocationBudget = 4000;
    size_t keep = 3;
    for (; keep > 1; --keep) {
        std::vector<bool> named(tl.allocations.size());
        size_t count = 0;
        for (const TimelinePoint& p : tl.points) {
            for (const std::vector<uint32_t>& ids : p.largest) {
                for (size_t k = 0; k < std::min(keep, ids.size()); ++k) {
                    if (named[ids[k]]) continue;
                    named[ids[k]] = true;
                    ++count;
                }
            }
        }
        if (count <= kAllocationBudget) break;
    }
    std::vector<uint32_t> renumbered(tl.allocations.size(), UINT32_MAX);
    std::vector<uint32_t> used;  // allocation indices, by new number
    out += "],\"top\":[";
    std::vector<uint32_t> previous, now;  // a layer's at the last sample written, and now
    for (size_t l = 0; l < tl.layers.size(); ++l) {
        out += l ? ",[" : "[";
        for (size_t i = 0; i < n; ++i) {
            const auto& largest = tl.points[i].largest;
            now.clear();
            if (l < largest.size())
                now.assign(largest[l].begin(),
                           largest[l].begin() + std::ptrdiff_t(std::min(keep, largest[l].size())));
            if (i > 0 && now == previous) continue;
            out += (i ? ",[" : "[") + u(i);
            for (uint32_t id : now) {
                if (renumbered[id] == UINT32_MAX) {
                    renumbered[id] = uint32_t(used.size());
                    used.push_back(id);
                }
                out += "," + u(renumbered[id]);
            }
            out += "]";
            std::swap(previous, now);
        }
        out += "]";
    }
    out += "],\"allocs\":[";
    for (size_t k = 0; k < used.size(); ++k) {
        const TimelineAllocation& l = tl.allocations[used[k]];
        out += (k ? ",[" : "[") + u(l.size) + "," + u(l.step) + "," + u(l.stack) + "," +
               strings.id(l.layer) + "," + strings.id(l.phase) + "," + u(l.seq) + "]";
    }
    // Bands and step marks at a pixel's detail (shown_bands, shown_steps).
    out += "],\"bands\":[";
    bool first = true;
    for (const PhaseBand& b : by_time ? shown_bands(a) : std::vector<PhaseBand>{}) {
        out += (first ? "[" : ",[") + u(x_of_t(b.t_start_ns)) + "," + u(x_of_t(b.t_end_ns)) + "," +
               strings.id(b.phase) + "]";
        first = false;
    }
    out += "],\"steps\":[";
    first = true;
    for (const StepMark& m : by_time ? shown_steps(a) : std::vector<StepMark>{}) {
        out += (first ? "[" : ",[") + u(x_of_t(m.t_ns)) + "," + u(m.step) + "]";
        first = false;
    }
    return out + "]";
}

// The (layer, phase) rows a heat-map cell refers to: [layer, phase,
// allocated, allocations, [[stack, bytes, count]...]].
std::string tags_json(const TraceAnalysis& a, StringTable& strings) {
    std::string out = "[";
    for (size_t k = 0; k < a.tags.size(); ++k) {
        const TagStats& t = a.tags[k];
        out += (k ? ",[" : "[") + strings.id(t.layer) + "," + strings.id(t.phase) + "," +
               u(t.allocated_bytes) + "," + u(t.allocations) + ",[";
        for (size_t i = 0; i < t.sites.size(); ++i) {
            out += (i ? ",[" : "[") + u(t.sites[i].stack) + "," + u(t.sites[i].bytes) + "," +
                   u(t.sites[i].count) + "]";
        }
        out += "]]";
    }
    return out + "]";
}

// Everything the script draws, as JSON fit for a <script> element: every
// string goes through json_quote, which writes '<', '>' and '&' as \u
// escapes (docs/FINDINGS.md), so no "</script>" or "<!--" can appear.
std::string page_data(const Report& report) {
    StringTable strings;
    std::string out = "{\"ranks\":[";
    for (size_t ri = 0; ri < report.ranks.size(); ++ri) {
        const RankReport& r = report.ranks[ri];
        const TraceAnalysis& a = r.analysis;
        out += (ri ? ",{" : "{") + std::string("\"title\":") + json_quote(rank_title(a)) + "," +
               timeline_json(a, strings) + ",\"tags\":" + tags_json(a, strings) +
               ",\"stacks\":" + stacks_json(r, strings) +
               ",\"fwd\":" + forward_json(r.steps, strings) +
               ",\"base\":" + (r.has_baseline ? forward_json(r.baseline_steps, strings) : "null") +
               "}";
    }
    out += "],\"baseline\":" + (report.baseline.empty() ? "null" : json_quote(report.baseline)) +
           ",\"colors\":[";
    for (size_t k = 0; k < std::size(kLayerColors); ++k)
        out += (k ? ",\"" : "\"") + std::string(kLayerColors[k]) + "\"";
    out += "],\"strings\":" + strings.json() + "}";
    return out;
}

}  // namespace

std::string html_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? '?' : c;
        }
    }
    return out;
}

std::string render_html(const Report& report) {
    std::string out =
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content=\"width=device-width, initial-scale=1\">"
        "<title>allocscope report</title><style>";
    out += "\n";
    out += assets::kReportCss;
    out += "</style></head><body>\n<h1>allocscope report</h1><p class=muted>" +
           u(report.ranks.size()) + " trace(s)</p>\n";
    for (const std::string& note : report.notes)
        out += "<div class=note>" + h(note) + "</div>";

    if (const std::string oom = oom_panel(report); !oom.empty())
        out += "<h2 id=oom>Out of memory</h2>" + oom + "\n";
    out += "<h2 id=findings>Findings</h2>" + findings_panel(report) + "\n";
    bool any_forward = false;
    for (const RankReport& r : report.ranks) {
        for (const StepMemory& s : r.steps)
            any_forward |= !s.forward_ends.empty();
    }
    if (any_forward) {
        out +=
            "<h2 id=forward>Live bytes after each layer's forward</h2><p class=muted>The owner "
            "pool's live bytes when each numbered layer's forward scope ended, per rank";
        if (!report.baseline.empty())
            out += ", with the baseline <b>" + h(report.baseline) + "</b> dashed";
        out +=
            " (what the reference test measures: weight copies that stay alive accumulate "
            "from layer to layer).</p><div id=fwd></div>\n";
    }
    for (size_t ri = 0; ri < report.ranks.size(); ++ri) {
        const RankReport& r = report.ranks[ri];
        const TraceAnalysis& a = r.analysis;
        out += "<h2>" + h(rank_title(a)) + " <span class=muted>" + h(a.path) + "</span></h2>";
        if (a.truncated) out += "<div class=note>" + h(a.truncation_message) + "</div>";
        out += "<p>" + u(a.events) + " events, " + u(a.steps) + " steps; tensors are " +
               (a.owner == Pool::device_block ? "caching-allocator blocks"
                                              : "device segments (no block events)") +
               ".</p>";
        out +=
            "<table><tr><th>pool</th><th>allocations</th><th>allocated</th><th>peak</th>"
            "<th>peak reached</th><th>live at exit</th></tr>";
        for (const PoolSummary& p : a.pools) {
            char t[32];
            std::snprintf(t, sizeof t, "%.3f s", double(p.peak_t_ns) / 1e9);
            out += "<tr><td>" + h(to_string(p.pool)) + "</td><td class=n>" + u(p.allocations) +
                   "</td><td class=n>" + h(human_bytes(p.allocated_bytes)) + "</td><td class=n>" +
                   h(human_bytes(p.peak_bytes)) + "</td><td>step " + u(p.peak_step) + ", " + t +
                   ", " + h(p.peak_layer.empty() ? "(untagged)" : p.peak_layer) + " " +
                   h(p.peak_phase) + "</td><td class=n>" + h(human_bytes(p.live_bytes_at_exit)) +
                   "</td></tr>";
        }
        out += "</table>";
        if (const std::string line = graph_pool_line(a); !line.empty())
            out += "<p class=graph-pools>" + h(line) + ".</p>";
        out += "<h3>Timeline: live " + h(to_string(a.owner)) + " bytes per layer</h3>" +
               timeline_panel(a, ri);
        out += "<h3>Layer &times; phase: bytes allocated</h3>" + heat_map(a, ri);
        out += "<h3>By (layer, phase)</h3>" + tag_table(a.tags, 60);
        out += "<h3>Top allocation sites at the peak</h3>" + sites_table(r, ri, a.sites_at_peak);
        out += "<h3>Top allocation sites at exit</h3>" + sites_table(r, ri, a.sites_at_exit);
        out += "\n";
    }
    if (report.ranks.size() > 1) out += "<h2>All ranks</h2>" + tag_table(merged_tags(report), 60);
    out += "<script type=\"application/json\" id=allocscope-data>" + page_data(report) +
           "</script>\n<script>\n";
    out += assets::kReportJs;
    out += "</script>\n";
    out += "</body></html>\n";
    return out;
}

}  // namespace allocscope
