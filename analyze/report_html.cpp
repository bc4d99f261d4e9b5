// The HTML rendering of a Report: one self-contained file (inline CSS and
// SVG, no script, no external resource). Every string that comes from a
// trace or a findings file goes through html_escape.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "report.h"

namespace allocscope {

namespace {

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2329;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde3e8;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px} .muted{color:#66707a} .note{background:#fff6da;padding:6px 10px;border-radius:4px;margin:4px 0}
table{border-collapse:collapse;margin:6px 0} th,td{padding:3px 8px;border-bottom:1px solid #edf0f3;text-align:left;vertical-align:top}
th{background:#f5f7f9;font-weight:600} td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.sev-error{color:#b3261e;font-weight:600} .sev-warning{color:#9a6700;font-weight:600} .sev-info{color:#3b6ea8}
details{margin:2px 0} summary{cursor:pointer} pre{margin:4px 0 8px 16px;font-size:12px;background:#f7f8fa;padding:6px;overflow-x:auto}
.legend span{display:inline-block;margin:2px 10px 2px 0;font-size:12px} .legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
.heat td.c{text-align:right;font-size:12px;min-width:70px} svg{max-width:100%;height:auto}
.oom{border-left:4px solid #b3261e;padding:2px 12px;margin:8px 0;background:#fdf3f2}
)";

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

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return buf;
}

std::string h(std::string_view s) {
    return html_escape(s);
}

std::string tag_cell(const std::string& layer, const std::string& phase) {
    return "<td>" +
           (layer.empty() ? std::string("<span class=muted>(untagged)</span>") : h(layer)) +
           "</td><td>" + (phase.empty() ? std::string("-") : h(phase)) + "</td>";
}

std::string rank_title(const TraceAnalysis& a) {
    return a.header.rank >= 0 ? "rank " + std::to_string(a.header.rank)
                              : "pid " + std::to_string(a.header.pid);
}

std::string frames_block(const RankReport& r, uint32_t stack) {
    if (stack == 0) return "<span class=muted>no stack captured</span>";
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end() || it->second.empty())
        return "<span class=muted>stack " + u(stack) + "</span>";
    std::string out =
        "<details><summary>stack " + u(stack) + ": " + h(it->second.front()) + "</summary><pre>";
    for (const std::string& f : it->second)
        out += h(f) + "\n";
    return out + "</pre></details>";
}

// Stacked areas of the owner pool's live bytes per layer over time, with
// the phase bands behind and step markers on top.
std::string timeline_svg(const TraceAnalysis& a) {
    const Timeline& tl = a.timeline;
    if (tl.points.empty()) return "<p class=muted>no events</p>";
    constexpr double W = 1000, H = 300, L = 70, R = 10, T = 10, B = 30;
    const double pw = W - L - R, ph = H - T - B;
    const uint64_t t0 = tl.points.front().t_ns;
    const uint64_t t1 = std::max<uint64_t>(a.span_ns, tl.points.back().t_ns);
    const bool by_time = t1 > t0;
    const size_t n = tl.points.size();
    auto x_of_t = [&](uint64_t t) {
        return L + (by_time ? pw * double(t - std::min(t, t0)) / double(t1 - t0) : 0.0);
    };
    auto x_of = [&](size_t i) {
        return by_time ? x_of_t(tl.points[i].t_ns)
                       : L + pw * double(i) / double(std::max<size_t>(1, n - 1));
    };
    uint64_t top = 1;
    for (const TimelinePoint& p : tl.points) {
        uint64_t sum = 0;
        for (uint64_t b : p.layer_bytes)
            sum += b;
        top = std::max({top, sum, p.segment_bytes, p.block_bytes});
    }
    auto y_of = [&](uint64_t b) { return T + ph - ph * double(b) / double(top); };

    std::string svg =
        "<svg viewBox=\"0 0 1000 300\" width=1000 height=300 role=img "
        "aria-label=\"memory timeline\" class=timeline>";
    // Phase bands, merged where a run of them is narrower than a pixel (a
    // long run has tens of thousands).
    auto band_rect = [&](const std::string& phase, double x0, double x1) {
        svg += "<rect x=\"" + num(x0) + "\" y=\"" + num(T) + "\" width=\"" +
               num(std::max(x1 - x0, 0.5)) + "\" height=\"" + num(ph) + "\" fill=\"" +
               phase_color(phase) + "\"><title>" + h(phase) + "</title></rect>";
    };
    std::string open_phase;
    double open_x0 = 0, open_x1 = 0;
    for (const PhaseBand& b : tl.bands) {
        if (!by_time) break;
        const double x0 = x_of_t(b.t_start_ns), x1 = x_of_t(b.t_end_ns);
        if (!open_phase.empty() && (b.phase == open_phase ? x0 - open_x1 < 1.0 : x1 - x0 < 0.5)) {
            if (b.phase == open_phase) open_x1 = std::max(open_x1, x1);
            continue;
        }
        if (!open_phase.empty()) band_rect(open_phase, open_x0, open_x1);
        open_phase = b.phase;
        open_x0 = x0;
        open_x1 = x1;
    }
    if (!open_phase.empty()) band_rect(open_phase, open_x0, open_x1);
    // Stacked layer areas.
    std::vector<uint64_t> below(n, 0);
    for (size_t l = 0; l < tl.layers.size(); ++l) {
        std::string top_edge, bottom_edge;
        for (size_t i = 0; i < n; ++i) {
            const uint64_t v =
                l < tl.points[i].layer_bytes.size() ? tl.points[i].layer_bytes[l] : 0;
            top_edge += num(x_of(i)) + "," + num(y_of(below[i] + v)) + " ";
            below[i] += v;
        }
        for (size_t i = n; i-- > 0;) {
            const uint64_t v =
                l < tl.points[i].layer_bytes.size() ? tl.points[i].layer_bytes[l] : 0;
            bottom_edge += num(x_of(i)) + "," + num(y_of(below[i] - v)) + " ";
        }
        svg += "<polygon class=layer points=\"" + top_edge + bottom_edge + "\" fill=\"" +
               kLayerColors[l % std::size(kLayerColors)] + "\"><title>" + h(tl.layers[l]) +
               "</title></polygon>";
    }
    // Segment total (reserved) as a line.
    std::string line;
    for (size_t i = 0; i < n; ++i)
        line += num(x_of(i)) + "," + num(y_of(tl.points[i].segment_bytes)) + " ";
    svg += "<polyline points=\"" + line +
           "\" fill=none stroke=\"#333\" stroke-width=1 stroke-dasharray=\"4 3\"><title>device "
           "segments (reserved)</title></polyline>";
    // Step markers (at most about 100 of them).
    const size_t every = std::max<size_t>(1, (tl.steps.size() + 99) / 100);
    for (size_t k = 0; k < tl.steps.size(); k += every) {
        const StepMark& s = tl.steps[k];
        if (!by_time) break;
        const double x = x_of_t(s.t_ns);
        svg += "<line x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(T) + "\" y2=\"" +
               num(T + ph) + "\" stroke=\"#7a8691\" stroke-width=0.6><title>step " + u(s.step) +
               "</title></line>";
    }
    // Axes.
    svg += "<line x1=\"" + num(L) + "\" x2=\"" + num(L + pw) + "\" y1=\"" + num(T + ph) +
           "\" y2=\"" + num(T + ph) + "\" stroke=\"#333\"/>";
    svg += "<line x1=\"" + num(L) + "\" x2=\"" + num(L) + "\" y1=\"" + num(T) + "\" y2=\"" +
           num(T + ph) + "\" stroke=\"#333\"/>";
    for (int k = 0; k <= 4; ++k) {
        const uint64_t b = top * uint64_t(k) / 4;
        svg += "<text x=\"" + num(L - 6) + "\" y=\"" + num(y_of(b) + 4) +
               "\" text-anchor=end font-size=11>" + h(human_bytes(b)) + "</text>";
    }
    char span[32];
    std::snprintf(span, sizeof span, "%.3f s", double(t1 - t0) / 1e9);
    svg += "<text x=\"" + num(L) + "\" y=\"" + num(H - 8) + "\" font-size=11>0 s</text>";
    svg += "<text x=\"" + num(L + pw) + "\" y=\"" + num(H - 8) +
           "\" text-anchor=end font-size=11>" + std::string(by_time ? span : "events") + "</text>";
    svg += "</svg>";

    std::string legend = "<div class=legend>";
    for (size_t l = 0; l < tl.layers.size(); ++l) {
        legend += "<span><i style=\"background:" +
                  std::string(kLayerColors[l % std::size(kLayerColors)]) + "\"></i>" +
                  h(tl.layers[l]) + "</span>";
    }
    for (const char* p : {"forward", "backward", "optimizer"}) {
        legend += "<span><i style=\"background:" + std::string(phase_color(p)) + "\"></i>" + p +
                  " (band)</span>";
    }
    legend += "<span>- - - device segments (reserved)</span></div>";
    return svg + legend;
}

// Layers (rows) × base phases (columns): bytes allocated, shaded.
std::string heat_map(const std::vector<TagStats>& tags) {
    std::map<std::string, std::map<std::string, uint64_t>> cells;
    std::map<std::string, uint64_t> row_total;
    std::set<std::string> phases;
    uint64_t top = 1;
    for (const TagStats& t : tags) {
        if (t.allocated_bytes == 0) continue;
        const std::string layer = t.layer.empty() ? "(untagged)" : t.layer;
        const std::string phase = t.phase.empty() ? "-" : std::string(base_phase(t.phase));
        uint64_t& c = cells[layer][phase];
        c += t.allocated_bytes;
        top = std::max(top, c);
        row_total[layer] += t.allocated_bytes;
        phases.insert(phase);
    }
    if (cells.empty()) return "<p class=muted>no allocations</p>";
    std::vector<std::string> rows;
    for (const auto& [layer, total] : row_total)
        rows.push_back(layer);
    std::stable_sort(rows.begin(), rows.end(), [&](const std::string& a, const std::string& b) {
        return row_total[a] > row_total[b];
    });
    const size_t limit = 40;
    std::string out = "<table class=heat><tr><th>layer \\ phase</th>";
    for (const std::string& p : phases)
        out += "<th>" + h(p) + "</th>";
    out += "</tr>";
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
        out += "<tr><td>" + h(rows[i]) + "</td>";
        for (const std::string& p : phases) {
            auto it = cells[rows[i]].find(p);
            if (it == cells[rows[i]].end()) {
                out += "<td class=c></td>";
                continue;
            }
            const double share = double(it->second) / double(top);
            const int alpha = int(15 + 85 * share);
            out += "<td class=c style=\"background:rgba(225,87,89," + std::to_string(alpha / 100) +
                   "." + (alpha % 100 < 10 ? "0" : "") + std::to_string(alpha % 100) +
                   ")\" title=\"" + h(rows[i]) + " " + h(p) + ": " + h(human_bytes(it->second)) +
                   " allocated\">" + h(human_bytes(it->second)) + "</td>";
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
        "<table><tr><th>layer</th><th>phase</th><th>allocated</th><th>allocations</th>"
        "<th title=\"the most one scope of the tag left alive at its end\">kept at end</th>"
        "<th>live at peak</th><th>live at exit</th></tr>";
    size_t shown = 0;
    for (const TagStats& t : tags) {
        if (t.allocations == 0 && t.at_peak == 0) continue;
        if (shown++ == limit) break;
        out += "<tr>" + tag_cell(t.layer, t.phase) + "<td class=n>" +
               h(human_bytes(t.allocated_bytes)) + "</td><td class=n>" + u(t.allocations) +
               "</td><td class=n>" + (t.retained_max ? h(human_bytes(t.retained_max)) : "-") +
               "</td><td class=n>" + (t.at_peak ? h(human_bytes(t.at_peak)) : "-") +
               "</td><td class=n>" + (t.at_exit ? h(human_bytes(t.at_exit)) : "-") + "</td></tr>";
    }
    return out + "</table>";
}

std::string sites_table(const RankReport& r, const std::vector<Site>& sites) {
    if (sites.empty()) return "<p class=muted>none</p>";
    std::string out =
        "<table class=sites><tr><th>#</th><th>bytes</th><th>allocations</th>"
        "<th>mostly</th><th></th><th>stack</th></tr>";
    for (size_t k = 0; k < sites.size(); ++k) {
        const Site& s = sites[k];
        out += "<tr><td class=n>" + u(k + 1) + "</td><td class=n>" + h(human_bytes(s.bytes)) +
               "</td><td class=n>" + u(s.count) + "</td>" + tag_cell(s.layer, s.phase) + "<td>" +
               frames_block(r, s.stack) + "</td></tr>";
    }
    return out + "</table>";
}

std::string finding_details(const Report& report, const Finding& f) {
    const std::string sev(to_string(f.severity));
    std::string out = "<details class=finding><summary><span class=\"sev-" + sev + "\">" + h(sev) +
                      "</span> <b>" + h(f.plugin) + "</b> " + process_label(f.rank, f.pid) + " " +
                      h(f.layer.empty() ? "-" : f.layer) + " " + h(f.phase) + " &mdash; " +
                      h(human_bytes(f.bytes)) + ": " + h(f.summary) +
                      (f.basis.empty() ? std::string() : " <i>(" + h(f.basis) + ")</i>") +
                      "</summary>";
    const int ri = rank_index(report, f.rank);
    out +=
        "<table><tr><th>size</th><th>layer</th><th>phase</th><th>step</th>"
        "<th>alloc seq</th><th>freed at</th><th>stack</th></tr>";
    for (const Evidence& e : f.evidence) {
        out += "<tr><td class=n>" + h(human_bytes(e.size)) + "</td>" + tag_cell(e.layer, e.phase) +
               "<td class=n>" + u(e.step) + "</td><td class=n>" + u(e.alloc_seq) +
               "</td><td class=n>" + (e.free_seq ? u(e.free_seq) : std::string("alive")) +
               "</td><td>" + (e.note.empty() ? std::string() : "<div>" + h(e.note) + "</div>") +
               (ri >= 0 ? frames_block(report.ranks[size_t(ri)], e.stack_id)
                        : "stack " + u(e.stack_id)) +
               "</td></tr>";
    }
    return out + "</table></details>";
}

// Problems (errors, then warnings) first, each expandable to its evidence;
// info findings (reports such as peak-owner's) folded under one line.
std::string findings_panel(const Report& report) {
    if (!report.findings_found)
        return "<p class=muted>No findings file next to the traces (run with plugins, or "
               "<code>allocscope replay</code>).</p>";
    const auto& all = report.findings.findings;
    size_t errors = 0, warnings = 0, infos = 0;
    for (const Finding& f : all) {
        errors += f.severity == Severity::error;
        warnings += f.severity == Severity::warning;
        infos += f.severity == Severity::info;
    }
    std::string out = "<p>" + std::string(errors ? "<span class=sev-error>" : "<span>") +
                      u(errors) + " error(s)</span>, " +
                      (warnings ? "<span class=sev-warning>" : "<span>") + u(warnings) +
                      " warning(s)</span>, " + u(infos) + " info.</p><div class=findings>";
    for (Severity level : {Severity::error, Severity::warning}) {
        for (const Finding& f : all) {
            if (f.severity == level) out += finding_details(report, f);
        }
    }
    if (infos > 0) {
        out += "<details class=infos><summary>" + u(infos) +
               " info finding(s): who owns memory at the peak and other reports</summary>";
        for (const Finding& f : all) {
            if (f.severity == Severity::info) out += finding_details(report, f);
        }
        out += "</details>";
    }
    return out + "</div>";
}

// The out-of-memory moments of every rank: what was asked, what was live,
// and the findings' share of it.
std::string oom_panel(const Report& report) {
    std::string out;
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        for (const OomMoment& m : a.ooms) {
            out += "<div class=oom><h3>" + h(oom_headline(a, m)) + "</h3><p>" + h(oom_held(m)) +
                   "</p>" + frames_block(r, m.stack);
            const std::vector<OomShare> shares = oom_shares(report, r, m);
            if (!shares.empty()) {
                out +=
                    "<table><tr><th>finding</th><th>layer</th><th>phase</th>"
                    "<th>held at this moment</th><th>allocations</th></tr>";
                size_t infos = 0;
                for (const OomShare& s : shares) {
                    const Finding& f = *s.finding;
                    if (f.severity == Severity::info && infos++ >= 5) continue;
                    out += "<tr><td><span class=sev-" + h(to_string(f.severity)) + ">" +
                           h(to_string(f.severity)) + "</span> " + h(f.plugin) + "</td>" +
                           tag_cell(f.layer, f.phase) + "<td class=n>" + h(human_bytes(s.bytes)) +
                           " of " + h(human_bytes(m.allocated)) + "</td><td class=n>" + u(s.count) +
                           "</td></tr>";
                }
                out += "</table>";
            }
            out += "<table><tr><th>layer</th><th>phase</th><th>live</th><th>allocations</th></tr>";
            for (const TagLive& t2 : m.by_tag) {
                out += "<tr>" + tag_cell(t2.layer, t2.phase) + "<td class=n>" +
                       h(human_bytes(t2.bytes)) + "</td><td class=n>" + u(t2.count) + "</td></tr>";
            }
            out +=
                "</table><h3>Live at that moment by site</h3>" + sites_table(r, m.sites) + "</div>";
        }
    }
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
    out += kStyle;
    out += "</style></head><body>\n<h1>allocscope report</h1><p class=muted>" +
           u(report.ranks.size()) + " trace(s)";
    if (report.findings_found) out += ", " + u(report.findings.findings.size()) + " finding(s)";
    out += "</p>\n";
    for (const std::string& note : report.notes)
        out += "<div class=note>" + h(note) + "</div>";

    if (const std::string oom = oom_panel(report); !oom.empty())
        out += "<h2 id=oom>Out of memory</h2>" + oom + "\n";
    out += "<h2 id=findings>Findings</h2>" + findings_panel(report) + "\n";
    for (const RankReport& r : report.ranks) {
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
        out += "<h3>Timeline: live " + h(to_string(a.owner)) + " bytes per layer</h3>" +
               timeline_svg(a);
        out += "<h3>Layer &times; phase: bytes allocated</h3>" + heat_map(a.tags);
        out += "<h3>By (layer, phase)</h3>" + tag_table(a.tags, 60);
        out += "<h3>Top allocation sites at the peak</h3>" + sites_table(r, a.sites_at_peak);
        out += "<h3>Top allocation sites at exit</h3>" + sites_table(r, a.sites_at_exit);
        out += "\n";
    }
    if (report.ranks.size() > 1) out += "<h2>All ranks</h2>" + tag_table(merged_tags(report), 60);
    out += "</body></html>\n";
    return out;
}

}  // namespace allocscope
