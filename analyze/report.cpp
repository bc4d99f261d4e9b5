// Text and JSON renderings of a Report, and what all renderings share.
#include "report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

namespace allocscope {

namespace {

std::string seconds(uint64_t ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", double(ns) / 1e9);
    return buf;
}

std::string tag_text(const std::string& layer, const std::string& phase) {
    return (layer.empty() ? std::string("(untagged)") : printable(layer)) +
           (phase.empty() ? std::string() : " " + printable(phase));
}

std::string rank_name(const TraceAnalysis& a) {
    return a.header.rank >= 0 ? "rank " + std::to_string(a.header.rank)
                              : "pid " + std::to_string(a.header.pid);
}

std::string pad(std::string s, size_t width) {
    if (s.size() < width) s.resize(width, ' ');
    return s;
}

std::string rpad(const std::string& s, size_t width) {
    return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}

// An ASCII chart of the owner pool's live bytes over the timeline.
void text_timeline(std::string& out, const TraceAnalysis& a) {
    const auto& pts = a.timeline.points;
    if (pts.empty()) return;
    constexpr size_t kWidth = 72, kHeight = 8;
    uint64_t top = 1;
    auto owner_bytes = [&](const TimelinePoint& p) {
        return a.owner == Pool::device_block ? p.block_bytes : p.segment_bytes;
    };
    for (const TimelinePoint& p : pts)
        top = std::max(top, owner_bytes(p));
    std::vector<uint64_t> col(kWidth, 0);
    for (size_t i = 0; i < pts.size(); ++i) {
        const size_t c = i * kWidth / pts.size();
        col[c] = std::max(col[c], owner_bytes(pts[i]));
    }
    out += "\nlive " + std::string(to_string(a.owner)) + " bytes over the trace (peak " +
           human_bytes(top) + "; " + std::to_string(a.timeline.steps.size()) + " steps, " +
           std::to_string(a.timeline.bands.size()) + " phase bands):\n";
    for (size_t row = kHeight; row-- > 0;) {
        out += "  |";
        for (size_t c = 0; c < kWidth; ++c)
            out += col[c] * kHeight > row * top ? '#' : ' ';
        out += "\n";
    }
    out += "  +" + std::string(kWidth, '-') + "\n";
    out += "   0 s" + std::string(kWidth - 10, ' ') + rpad(seconds(a.span_ns), 8) + "\n";
}

void text_sites(std::string& out, const RankReport& r, const std::vector<Site>& sites,
                const char* title) {
    if (sites.empty()) return;
    out += std::string("\n") + title + ":\n";
    for (size_t k = 0; k < sites.size(); ++k) {
        const Site& s = sites[k];
        out += "  #" + std::to_string(k + 1) + " " + human_bytes(s.bytes) + " in " +
               std::to_string(s.count) + " allocation(s), mostly " + tag_text(s.layer, s.phase) +
               (s.stack ? ", stack " + std::to_string(s.stack) : std::string(", no stack")) + "\n";
        auto it = r.stacks.find(s.stack);
        if (it == r.stacks.end()) continue;
        for (const std::string& line : stack_lines(r, s.stack, 10, 8))
            out += "      " + line + "\n";
    }
}

void text_tags(std::string& out, const std::vector<TagStats>& tags, size_t limit) {
    out += "  " + pad("layer", 30) + pad("phase", 26) + rpad("allocated", 11) + rpad("allocs", 8) +
           rpad("kept@end", 11) + rpad("@peak", 11) + rpad("@exit", 11) + "\n";
    size_t shown = 0;
    for (const TagStats& t : tags) {
        if (t.allocations == 0 && t.at_peak == 0) continue;
        if (shown++ == limit) {
            out += "  ... more tags in the JSON report\n";
            break;
        }
        out += "  " + pad(t.layer.empty() ? "(untagged)" : printable(t.layer), 29) + " " +
               pad(t.phase.empty() ? "-" : printable(t.phase), 25) + " " +
               rpad(human_bytes(t.allocated_bytes), 10) + rpad(std::to_string(t.allocations), 8) +
               rpad(t.retained_max ? human_bytes(t.retained_max) : "-", 11) +
               rpad(t.at_peak ? human_bytes(t.at_peak) : "-", 11) +
               rpad(t.at_exit ? human_bytes(t.at_exit) : "-", 11) + "\n";
    }
}

void json_string_list(std::string& out, const std::vector<std::string>& items) {
    out += "[";
    for (size_t i = 0; i < items.size(); ++i)
        out += (i ? ", " : "") + json_quote(items[i]);
    out += "]";
}

std::string u(uint64_t v) {
    return std::to_string(v);
}

// Live bytes after each numbered layer's forward, per step: [{"step",
// "layers": [...], "live": [...]}].
void json_forward_ends(std::string& out, const std::vector<StepMemory>& steps) {
    out += "[";
    bool first = true;
    for (const StepMemory& s : steps) {
        if (s.forward_ends.empty()) continue;
        out += (first ? "" : ", ") + std::string("{\"step\": ") + u(s.step) + ", \"layers\": [";
        first = false;
        for (size_t k = 0; k < s.forward_ends.size(); ++k)
            out += (k ? ", " : "") + json_quote(s.forward_ends[k].first);
        out += "], \"live\": [";
        for (size_t k = 0; k < s.forward_ends.size(); ++k)
            out += (k ? ", " : "") + u(s.forward_ends[k].second);
        out += "]}";
    }
    out += "]";
}

void json_tags(std::string& out, const std::vector<TagStats>& tags) {
    out += "[";
    bool first = true;
    for (const TagStats& t : tags) {
        out += first ? "\n" : ",\n";
        first = false;
        out += "      {\"layer\": " + json_quote(t.layer) + ", \"phase\": " + json_quote(t.phase) +
               ", \"allocated_bytes\": " + u(t.allocated_bytes) +
               ", \"allocations\": " + u(t.allocations) + ", \"scopes\": " + u(t.scopes) +
               ", \"retained_max\": " + u(t.retained_max) +
               ", \"retained_scopes\": " + u(t.retained_scopes) + ", \"at_peak\": " + u(t.at_peak) +
               ", \"count_at_peak\": " + u(t.count_at_peak) + ", \"at_exit\": " + u(t.at_exit) +
               "}";
    }
    out += "]";
}

void json_sites(std::string& out, const RankReport& r, const std::vector<Site>& sites) {
    out += "[";
    for (size_t k = 0; k < sites.size(); ++k) {
        const Site& s = sites[k];
        out += k ? ",\n" : "\n";
        out += "      {\"stack\": " + u(s.stack) + ", \"bytes\": " + u(s.bytes) +
               ", \"count\": " + u(s.count) + ", \"layer\": " + json_quote(s.layer) +
               ", \"phase\": " + json_quote(s.phase) + ", \"frames\": ";
        auto it = r.stacks.find(s.stack);
        json_string_list(out, it == r.stacks.end() ? std::vector<std::string>{} : it->second);
        out += "}";
    }
    out += "]";
}

// Info findings (who owns memory) listed under a moment; problems are all listed.
constexpr size_t kOomInfoShares = 3;

std::string share_line(const OomShare& s, const OomMoment& m) {
    return std::string(to_string(s.finding->severity)) + " " + printable(s.finding->plugin) + " (" +
           tag_text(s.finding->layer, s.finding->phase) + ") held " + human_bytes(s.bytes) +
           " of the " + human_bytes(m.allocated) + " allocated, in " + u(s.count) +
           " allocation(s)";
}

void text_oom(std::string& out, const Report& report, const RankReport& r, const OomMoment& m) {
    const TraceAnalysis& a = r.analysis;
    out += oom_headline(a, m) + "\n  " + oom_held(m) + "\n";
    if (m.stack) {
        out += "  requested at:\n";
        for (const std::string& line : stack_lines(r, m.stack, 8, 8))
            out += "      " + line + "\n";
    }
    const std::vector<OomShare> shares = oom_shares(report, r, m);
    if (!shares.empty()) {
        out += "  findings holding part of it:\n";
        size_t infos = 0;
        for (const OomShare& s : shares) {
            if (s.finding->severity == Severity::info && infos++ >= kOomInfoShares) continue;
            out += "      " + share_line(s, m) + "\n";
        }
        if (infos > kOomInfoShares)
            out +=
                "      ... " + u(infos - kOomInfoShares) + " more info finding(s) (JSON report)\n";
    }
    if (!m.by_tag.empty()) {
        out += "  live at that moment by (layer, phase):\n";
        for (const TagLive& t : m.by_tag) {
            out += "      " + pad(tag_text(t.layer, t.phase), 48) + rpad(human_bytes(t.bytes), 11) +
                   rpad(u(t.count), 8) + "\n";
        }
    }
    text_sites(out, r, m.sites, "  live at that moment by site");
}

void json_oom(std::string& out, const Report& report, const RankReport& r, const OomMoment& m) {
    const TraceAnalysis& a = r.analysis;
    out += "{\"rank\": " + std::to_string(a.header.rank) + ", \"pid\": " + u(a.header.pid) +
           ", \"trace\": " + json_quote(a.path) + ", \"seq\": " + u(m.seq) +
           ", \"t_ns\": " + u(m.t_ns) + ", \"step\": " + u(m.step) + ", \"tid\": " + u(m.tid) +
           ", \"layer\": " + json_quote(m.layer) + ", \"phase\": " + json_quote(m.phase) +
           ", \"requested\": " + u(m.requested) + ", \"device\": " + std::to_string(m.device) +
           ", \"device_free\": " + u(m.device_free) + ", \"api\": " + json_quote(m.api) +
           ", \"by_allocator\": " + (m.by_allocator ? "true" : "false") +
           ", \"continued\": " + (m.continued ? "true" : "false") +
           ", \"failed_calls\": " + u(m.failed_calls) + ",\n     \"allocated\": " + u(m.allocated) +
           ", \"allocated_count\": " + u(m.allocated_count) +
           ", \"reserved\": " + (m.reserved_known ? u(m.reserved) : std::string("null")) +
           ", \"stack\": " + u(m.stack) + ", \"frames\": ";
    auto it = r.stacks.find(m.stack);
    json_string_list(out, it == r.stacks.end() ? std::vector<std::string>{} : it->second);
    out += ",\n     \"findings\": [";
    const std::vector<OomShare> shares = oom_shares(report, r, m);
    for (size_t k = 0; k < shares.size(); ++k) {
        const Finding& f = *shares[k].finding;
        out += (k ? ", " : "") + std::string("{\"plugin\": ") + json_quote(f.plugin) +
               ", \"severity\": " + json_quote(to_string(f.severity)) +
               ", \"layer\": " + json_quote(f.layer) + ", \"phase\": " + json_quote(f.phase) +
               ", \"bytes\": " + u(shares[k].bytes) + ", \"count\": " + u(shares[k].count) + "}";
    }
    out += "],\n     \"by_tag\": [";
    for (size_t k = 0; k < m.by_tag.size(); ++k) {
        const TagLive& t = m.by_tag[k];
        out += (k ? ", " : "") + std::string("{\"layer\": ") + json_quote(t.layer) +
               ", \"phase\": " + json_quote(t.phase) + ", \"bytes\": " + u(t.bytes) +
               ", \"count\": " + u(t.count) + "}";
    }
    out += "],\n     \"sites\": ";
    json_sites(out, r, m.sites);
    out += "}";
}

}  // namespace

// The first line of a moment: who ran out, where, how much was asked.
std::string oom_headline(const TraceAnalysis& a, const OomMoment& m) {
    std::string line = rank_name(a) + ": out of memory at step " + u(m.step) + ", " +
                       tag_text(m.layer, m.phase) + ", " + seconds(m.t_ns) + ": " +
                       human_bytes(m.requested) + " requested";
    if (m.device >= 0) line += " on device " + std::to_string(m.device);
    if (m.by_allocator) {
        line += " (the caching allocator gave up";
        if (m.failed_calls) line += " after " + u(m.failed_calls) + " failed device allocation(s)";
        line += ")";
    } else {
        line += " (" + printable(m.api) + " failed";
        if (m.failed_calls > 1) line += ", " + u(m.failed_calls) + " attempts";
        line += ")";
    }
    if (m.device_free) line += "; device free " + human_bytes(m.device_free);
    if (m.continued) line += "; the program went on allocating after it";
    return line;
}

std::string oom_held(const OomMoment& m) {
    std::string line =
        "allocated " + human_bytes(m.allocated) + " in " + u(m.allocated_count) + " allocation(s)";
    if (m.reserved_known) {
        line += "; reserved " + human_bytes(m.reserved);
        if (m.reserved > m.allocated)
            line += " (" + human_bytes(m.reserved - m.allocated) + " cached, not allocated)";
    }
    return line;
}

std::vector<OomShare> oom_shares(const Report& report, const RankReport& r, const OomMoment& m) {
    std::vector<OomShare> out;
    if (!report.findings_found) return out;
    const int mine = int(&r - report.ranks.data());
    for (const Finding& f : report.findings.findings) {
        if (rank_index(report, f.rank) != mine) continue;
        OomShare s{&f, 0, 0};
        for (const Evidence& ev : f.evidence) {
            if (!std::binary_search(m.live_seqs.begin(), m.live_seqs.end(), ev.alloc_seq)) continue;
            s.bytes += ev.size;
            ++s.count;
        }
        if (s.count) out.push_back(s);
    }
    // Problems first, then by bytes.
    std::stable_sort(out.begin(), out.end(), [](const OomShare& x, const OomShare& y) {
        return std::tie(x.finding->severity, x.bytes) > std::tie(y.finding->severity, y.bytes);
    });
    return out;
}

std::string oom_summary(const Report& report, const RankReport& r, const OomMoment& m) {
    std::string out = oom_headline(r.analysis, m) + "\n  " + oom_held(m) + "\n";
    for (const std::string& line : stack_lines(r, m.stack, 3, 2))
        out += "    " + line + "\n";
    size_t infos = 0;
    for (const OomShare& s : oom_shares(report, r, m)) {
        if (s.finding->severity == Severity::info)
            ++infos;
        else
            out += "  " + share_line(s, m) + "\n";
    }
    if (infos) out += "  " + u(infos) + " info finding(s) hold parts of it (report.txt)\n";
    return out;
}

std::vector<TagStats> merged_tags(const Report& report) {
    std::map<std::pair<std::string, std::string>, TagStats> by_tag;
    for (const RankReport& r : report.ranks) {
        for (const TagStats& t : r.analysis.tags) {
            TagStats& m = by_tag[{t.layer, t.phase}];
            m.layer = t.layer;
            m.phase = t.phase;
            m.allocated_bytes += t.allocated_bytes;
            m.allocations += t.allocations;
            m.scopes += t.scopes;
            m.retained_max = std::max(m.retained_max, t.retained_max);
            m.retained_scopes += t.retained_scopes;
            m.at_peak += t.at_peak;
            m.count_at_peak += t.count_at_peak;
            m.at_exit += t.at_exit;
        }
    }
    std::vector<TagStats> out;
    for (auto& [key, t] : by_tag)
        out.push_back(std::move(t));
    std::stable_sort(out.begin(), out.end(), [](const TagStats& x, const TagStats& y) {
        return x.allocated_bytes > y.allocated_bytes;
    });
    return out;
}

int rank_index(const Report& report, int32_t rank) {
    if (report.ranks.size() == 1) return 0;
    for (size_t i = 0; i < report.ranks.size(); ++i) {
        if (report.ranks[i].analysis.header.rank == rank) return int(i);
    }
    return -1;
}

std::string render_text(const Report& report) {
    std::string out = "allocscope report: " + std::to_string(report.ranks.size()) + " trace(s)\n";
    for (const std::string& note : report.notes)
        out += "note: " + printable(note) + "\n";
    // What ended the run comes first.
    bool any_oom = false;
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        if (a.ooms.empty()) continue;
        if (!any_oom) out += "\n== out of memory ==\n";
        any_oom = true;
        if (a.oom_moments_total > a.ooms.size())
            out += rank_name(a) + ": " + u(a.oom_moments_total) +
                   " out-of-memory moments, the last " + u(a.ooms.size()) + " shown\n";
        for (const OomMoment& m : a.ooms)
            text_oom(out, report, r, m);
    }
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        out += "\n== " + rank_name(a) + ": " + printable(a.path) + " (pid " +
               std::to_string(a.header.pid) + ", allocscope " + printable(a.header.tool_version) +
               ") ==\n";
        if (a.truncated)
            out += "warning: " + printable(a.truncation_message) + "; reporting what precedes it\n";
        out += std::to_string(a.events) + " events over " + seconds(a.span_ns) + ", " +
               std::to_string(a.steps) + " steps; tensors are " +
               (a.owner == Pool::device_block ? "caching-allocator blocks"
                                              : "device segments (no block events)") +
               "\n";
        out += "\nevents by kind and level:\n";
        for (const TraceAnalysis::Count& c : a.events_by_kind)
            out += "  " + pad(c.what, 24) + rpad(u(c.n), 10) + "\n";
        if (!a.calls_by_api.empty()) {
            out += "allocation calls by api:\n";
            for (const TraceAnalysis::Count& c : a.calls_by_api)
                out += "  " + pad(c.what, 32) + rpad(u(c.n), 10) + "\n";
        }
        out += "frees of unknown addresses: " + u(a.unknown_frees) +
               ", double frees: " + u(a.double_frees) + ", failed frees: " + u(a.failed_frees) +
               "\n";
        for (const TraceAnalysis::Count& c : a.odd_frees)
            out += "  " + pad(c.what, 32) + rpad(u(c.n), 10) + "\n";
        if (a.oom_events) {
            out += "failed allocations (oom): " + u(a.oom_events) + ", largest request " +
                   human_bytes(a.largest_failed_request) + "; " + u(a.oom_moments_total) +
                   " out-of-memory moment(s), " + u(a.recovered_failures) +
                   " failed call(s) recovered from (the allocator retried)\n";
        }
        out += "\n  " + pad("pool", 16) + rpad("allocations", 12) + rpad("allocated", 12) +
               rpad("peak", 12) + "  at\n";
        for (const PoolSummary& p : a.pools) {
            out += "  " + pad(to_string(p.pool), 16) + rpad(u(p.allocations), 12) +
                   rpad(human_bytes(p.allocated_bytes), 12) + rpad(human_bytes(p.peak_bytes), 12) +
                   "  step " + u(p.peak_step) + ", " + seconds(p.peak_t_ns) + ", " +
                   tag_text(p.peak_layer, p.peak_phase) + "; at exit " +
                   human_bytes(p.live_bytes_at_exit) + " in " + u(p.live_count_at_exit) +
                   " allocation(s)\n";
        }
        text_timeline(out, a);
        out += "\nby (layer, phase), " + std::string(to_string(a.owner)) +
               " bytes: allocated; kept@end = the most one scope of it left alive at its end;"
               " live at the peak and at exit:\n";
        text_tags(out, a.tags, 40);
        text_sites(out, r, a.sites_at_peak, "top allocation sites at the peak");
        text_sites(out, r, a.sites_at_exit, "top allocation sites at exit");
    }
    if (report.ranks.size() > 1) {
        out += "\n== all ranks ==\n";
        text_tags(out, merged_tags(report), 40);
    }
    out += "\nfindings: ";
    if (!report.findings_found) {
        out += "none recorded (no findings file next to the traces)\n";
        return out;
    }
    out += std::to_string(report.findings.findings.size()) + " (errors first)\n";
    std::vector<const Finding*> order;
    for (const Finding& f : report.findings.findings)
        order.push_back(&f);
    std::stable_sort(order.begin(), order.end(),
                     [](const Finding* a, const Finding* b) { return a->severity > b->severity; });
    for (const Finding* fp : order) {
        const Finding& f = *fp;
        out += "  " + summary_line(f) + "\n";
        const int ri = rank_index(report, f.rank);
        for (size_t k = 0; k < f.evidence.size() && k < 3; ++k) {
            const Evidence& ev = f.evidence[k];
            out += "      evidence: " + human_bytes(ev.size) + " " + tag_text(ev.layer, ev.phase) +
                   " step " + u(ev.step) + " seq " + u(ev.alloc_seq) +
                   (ev.free_seq ? " freed at seq " + u(ev.free_seq) : std::string(" alive")) + "\n";
            if (!ev.note.empty()) out += "        " + printable(ev.note) + "\n";
            if (ri < 0) continue;
            for (const std::string& line : stack_lines(report.ranks[size_t(ri)], ev.stack_id, 6, 4))
                out += "        " + line + "\n";
        }
        if (f.evidence.size() > 3)
            out += "      ... " + std::to_string(f.evidence.size() - 3) + " more\n";
    }
    return out;
}

std::string render_json(const Report& report) {
    std::string out = "{\n  \"allocscope_report\": 1,\n  \"notes\": ";
    json_string_list(out, report.notes);
    out += ",\n  \"out_of_memory\": [";
    bool first_oom = true;
    for (const RankReport& r : report.ranks) {
        for (const OomMoment& m : r.analysis.ooms) {
            out += first_oom ? "\n    " : ",\n    ";
            first_oom = false;
            json_oom(out, report, r, m);
        }
    }
    out += "],\n  \"ranks\": [";
    for (size_t i = 0; i < report.ranks.size(); ++i) {
        const RankReport& r = report.ranks[i];
        const TraceAnalysis& a = r.analysis;
        out += i ? ",\n" : "\n";
        out +=
            "    {\"trace\": " + json_quote(a.path) +
            ", \"rank\": " + std::to_string(a.header.rank) + ", \"pid\": " + u(a.header.pid) +
            ", \"events\": " + u(a.events) + ", \"span_ns\": " + u(a.span_ns) +
            ", \"steps\": " + u(a.steps) + ", \"truncated\": " + (a.truncated ? "true" : "false") +
            ", \"oom_events\": " + u(a.oom_events) +
            ", \"oom_moments\": " + u(a.oom_moments_total) +
            ", \"recovered_failures\": " + u(a.recovered_failures) +
            ", \"owner_pool\": " + json_quote(to_string(a.owner)) + ",\n     \"events_by_kind\": {";
        for (size_t k = 0; k < a.events_by_kind.size(); ++k) {
            out += (k ? ", " : "") + json_quote(a.events_by_kind[k].what) + ": " +
                   u(a.events_by_kind[k].n);
        }
        out += "}, \"calls_by_api\": {";
        for (size_t k = 0; k < a.calls_by_api.size(); ++k) {
            out += (k ? ", " : "") + json_quote(a.calls_by_api[k].what) + ": " +
                   u(a.calls_by_api[k].n);
        }
        out += "}, \"odd_frees\": {";
        for (size_t k = 0; k < a.odd_frees.size(); ++k) {
            out += (k ? ", " : "") + json_quote(a.odd_frees[k].what) + ": " + u(a.odd_frees[k].n);
        }
        out += "},\n     \"pools\": [";
        for (size_t p = 0; p < a.pools.size(); ++p) {
            const PoolSummary& s = a.pools[p];
            out += (p ? ", " : "") + std::string("{\"pool\": ") + json_quote(to_string(s.pool)) +
                   ", \"allocations\": " + u(s.allocations) +
                   ", \"allocated_bytes\": " + u(s.allocated_bytes) +
                   ", \"peak_bytes\": " + u(s.peak_bytes) + ", \"peak_seq\": " + u(s.peak_seq) +
                   ", \"peak_t_ns\": " + u(s.peak_t_ns) + ", \"peak_step\": " + u(s.peak_step) +
                   ", \"peak_layer\": " + json_quote(s.peak_layer) +
                   ", \"peak_phase\": " + json_quote(s.peak_phase) +
                   ", \"live_bytes_at_exit\": " + u(s.live_bytes_at_exit) +
                   ", \"live_count_at_exit\": " + u(s.live_count_at_exit) + "}";
        }
        out += "],\n     \"tags\": ";
        json_tags(out, a.tags);
        out += ",\n     \"timeline\": {\"layers\": ";
        json_string_list(out, a.timeline.layers);
        out += ",\n       \"points\": [";
        for (size_t k = 0; k < a.timeline.points.size(); ++k) {
            const TimelinePoint& p = a.timeline.points[k];
            out += (k ? ",\n         " : "\n         ") + std::string("[") + u(p.seq) + ", " +
                   u(p.t_ns) + ", " + u(p.segment_bytes) + ", " + u(p.block_bytes) + ", [";
            for (size_t l = 0; l < p.layer_bytes.size(); ++l)
                out += (l ? ", " : "") + u(p.layer_bytes[l]);
            out += "]]";
        }
        out += "],\n       \"bands\": [";
        for (size_t k = 0; k < a.timeline.bands.size(); ++k) {
            const PhaseBand& b = a.timeline.bands[k];
            out += (k ? ", " : "") + std::string("{\"phase\": ") + json_quote(b.phase) +
                   ", \"seq_start\": " + u(b.seq_start) + ", \"seq_end\": " + u(b.seq_end) +
                   ", \"t_start_ns\": " + u(b.t_start_ns) + ", \"t_end_ns\": " + u(b.t_end_ns) +
                   "}";
        }
        out += "],\n       \"steps\": [";
        for (size_t k = 0; k < a.timeline.steps.size(); ++k) {
            const StepMark& s = a.timeline.steps[k];
            out += (k ? ", " : "") + std::string("{\"step\": ") + u(s.step) +
                   ", \"seq\": " + u(s.seq) + ", \"t_ns\": " + u(s.t_ns) + "}";
        }
        out += "]},\n     \"sites_at_peak\": ";
        json_sites(out, r, a.sites_at_peak);
        out += ",\n     \"sites_at_exit\": ";
        json_sites(out, r, a.sites_at_exit);
        out += ",\n     \"stacks\": {";
        bool first = true;
        for (const auto& [id, frames] : r.stacks) {
            out += (first ? "\n       " : ",\n       ") + json_quote(u(id)) + ": ";
            first = false;
            json_string_list(out, frames);
        }
        out += "},\n     \"forward_ends\": ";
        json_forward_ends(out, r.steps);
        out += ",\n     \"baseline_forward_ends\": ";
        if (r.has_baseline)
            json_forward_ends(out, r.baseline_steps);
        else
            out += "null";
        out += "}";
    }
    out += "],\n  \"merged_tags\": ";
    json_tags(out, merged_tags(report));
    out += ",\n  \"findings\": ";
    if (report.findings_found) {
        std::string f = to_json(report.findings);
        while (!f.empty() && (f.back() == '\n' || f.back() == ' '))
            f.pop_back();
        out += f;
    } else {
        out += "null";
    }
    out += "\n}\n";
    return out;
}

bool caching_allocator_frame(std::string_view frame) noexcept {
    return frame.starts_with("c10::cuda::CUDACachingAllocator::") ||
           frame.starts_with("c10::CachingDeviceAllocator::") ||
           frame.find("on_entry<c10::") != std::string_view::npos ||  // tools/torch_bridge
           frame.find("allocscope_torch_bridge_attach") != std::string_view::npos;
}

std::vector<std::string> stack_lines(const RankReport& r, uint32_t stack, size_t native,
                                     size_t python) {
    std::vector<std::string> lines;
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end()) return lines;
    const std::vector<std::string>& frames = it->second;
    auto py = r.python_from.find(stack);
    const size_t first_python = py == r.python_from.end() ? frames.size() : py->second;
    // The allocator's own frames lead every block's stack: one line for
    // them, and the native frames shown start with its caller.
    size_t first = 0;
    while (first + 1 < first_python && caching_allocator_frame(frames[first]))
        ++first;
    if (first > 0)
        lines.push_back("[" + std::to_string(first) + " frames of PyTorch's caching allocator]");
    const size_t last = std::min(first_python, first + native);
    for (size_t f = first; f < last; ++f)
        lines.push_back(printable(frames[f]));
    if (first_python > last)
        lines.push_back("... " + std::to_string(first_python - last) + " more native frames");
    for (size_t f = first_python; f < frames.size() && f < first_python + python; ++f)
        lines.push_back(printable(frames[f]));
    if (frames.size() > first_python + python)
        lines.push_back("... " + std::to_string(frames.size() - first_python - python) +
                        " more Python frames");
    return lines;
}

}  // namespace allocscope
