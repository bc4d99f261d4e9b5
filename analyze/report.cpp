// Text and JSON renderings of a Report, and what all renderings share.
#include "report.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
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
void text_timeline(std::string& out, const TraceAnalysis& a, const std::string& whose = {}) {
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
    out += "\nlive " + std::string(to_string(a.owner)) + " bytes over the trace" +
           (whose.empty() ? "" : " of " + whose) + " (peak " + human_bytes(top) + "; " +
           std::to_string(a.timeline.steps.size()) + " steps, " +
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

// Sites of one rank; concise: the first `limit` with stacks from the
// program's code, full: all with every frame.
void text_sites(std::string& out, const RankReport& r, const std::vector<Site>& sites,
                const char* title, bool full, size_t limit = SIZE_MAX) {
    if (sites.empty()) return;
    out += std::string("\n") + title + ":\n";
    for (size_t k = 0; k < sites.size() && k < limit; ++k) {
        const Site& s = sites[k];
        out += "  #" + std::to_string(k + 1) + " " + human_bytes(s.bytes) + " in " +
               std::to_string(s.count) + " allocation(s), mostly " + tag_text(s.layer, s.phase) +
               (s.stack ? ", stack " + std::to_string(s.stack) : std::string(", no stack")) + "\n";
        for (const std::string& line :
             full ? all_stack_lines(r, s.stack) : stack_lines(r, s.stack, 3, 3))
            out += "      " + line + "\n";
    }
    if (sites.size() > limit)
        out += "  ... " + std::to_string(sites.size() - limit) + " more sites (--full)\n";
}

std::string tag_header() {
    return "  " + pad("layer", 30) + pad("phase", 26) + rpad("allocated", 11) + rpad("allocs", 8) +
           rpad("kept@end", 11) + rpad("@peak", 11) + rpad("@exit", 11) + "\n";
}

std::string tag_row(const TagStats& t) {
    return "  " + pad(t.layer.empty() ? "(untagged)" : printable(t.layer), 29) + " " +
           pad(t.phase.empty() ? "-" : printable(t.phase), 25) + " " +
           rpad(human_bytes(t.allocated_bytes), 10) + rpad(std::to_string(t.allocations), 8) +
           rpad(t.retained_max ? human_bytes(t.retained_max) : "-", 11) +
           rpad(t.at_peak ? human_bytes(t.at_peak) : "-", 11) +
           rpad(t.at_exit ? human_bytes(t.at_exit) : "-", 11) + "\n";
}

void text_tags(std::string& out, const std::vector<TagStats>& tags, size_t limit) {
    out += tag_header();
    size_t shown = 0;
    for (const TagStats& t : tags) {
        if (t.allocations == 0 && t.at_peak == 0) continue;
        if (shown++ == limit) {
            out += "  ... more tags in the JSON report\n";
            break;
        }
        out += tag_row(t);
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

// Live bytes after each numbered layer's forward, per step (the last ones,
// shown_forward_ends): [{"step", "layers": [...], "live": [...]}].
void json_forward_ends(std::string& out, const std::vector<StepMemory>& steps) {
    out += "[";
    bool first = true;
    for (const StepMemory* shown : shown_forward_ends(steps)) {
        const StepMemory& s = *shown;
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
           " of the " +
           (m.allocated_known ? human_bytes(m.allocated) + " allocated"
                              : human_bytes(m.reserved) + " reserved") +
           ", in " + u(s.count) + " allocation(s)";
}

// Rows of the per-moment (layer, phase) list shown in the concise report.
constexpr size_t kOomConciseTags = 6;

void text_oom(std::string& out, const Report& report, const RankReport& r, const OomMoment& m,
              bool full) {
    const TraceAnalysis& a = r.analysis;
    out += oom_headline(a, m) + "\n  " + oom_held(m) + "\n";
    if (m.stack) {
        out += "  requested at:\n";
        for (const std::string& line :
             full ? all_stack_lines(r, m.stack) : stack_lines(r, m.stack, 4, 4))
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
        const size_t rows = full ? m.by_tag.size() : std::min(m.by_tag.size(), kOomConciseTags);
        for (size_t k = 0; k < rows; ++k) {
            const TagLive& t = m.by_tag[k];
            out += "      " + pad(tag_text(t.layer, t.phase), 48) + rpad(human_bytes(t.bytes), 11) +
                   rpad(u(t.count), 8) + "\n";
        }
        if (rows < m.by_tag.size())
            out += "      ... " + u(m.by_tag.size() - rows) + " more rows (--full)\n";
    }
    text_sites(out, r, m.sites, "  live at that moment by site", full, full ? SIZE_MAX : 2);
}

void json_oom(std::string& out, const Report& report, const RankReport& r, const OomMoment& m) {
    const TraceAnalysis& a = r.analysis;
    out += "{\"rank\": " + std::to_string(a.header.rank) + ", \"pid\": " + u(a.header.pid) +
           ", \"trace\": " + json_quote(a.path) + ", \"seq\": " + u(m.seq) +
           ", \"t_ns\": " + u(m.t_ns) + ", \"step\": " + u(m.step) + ", \"tid\": " + u(m.tid) +
           ", \"layer\": " + json_quote(m.layer) + ", \"phase\": " + json_quote(m.phase) +
           ", \"last_layer\": " + json_quote(m.last_layer) +
           ", \"last_phase\": " + json_quote(m.last_phase) + ", \"requested\": " + u(m.requested) +
           ", \"device\": " + std::to_string(m.device) + ", \"device_free\": " + u(m.device_free) +
           ", \"api\": " + json_quote(m.api) +
           ", \"by_allocator\": " + (m.by_allocator ? "true" : "false") +
           ", \"continued\": " + (m.continued ? "true" : "false") +
           ", \"failed_calls\": " + u(m.failed_calls) +
           ",\n     \"allocated\": " + (m.allocated_known ? u(m.allocated) : std::string("null")) +
           ", \"allocated_count\": " + u(m.allocated_count) +
           ", \"reserved\": " + (m.reserved_known ? u(m.reserved) : std::string("null")) +
           ", \"outside_allocator\": " + u(m.outside_allocator) +
           ", \"segment_asked\": " + (m.segment_asked ? u(m.segment_asked) : std::string("null")) +
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

std::string json_counter_check(const std::optional<CounterCheck>& c) {
    if (!c) return "null";
    return "{\"step\": " + u(c->step) + ", \"seq\": " + u(c->seq) +
           ", \"device\": " + std::to_string(c->device) + ", \"allocated\": " + u(c->allocated) +
           ", \"reserved\": " + u(c->reserved) + ", \"device_used\": " + u(c->device_used) +
           ", \"seen_allocated\": " + (c->allocated_compared ? u(c->seen_allocated) : "null") +
           ", \"seen_reserved\": " + (c->reserved_compared ? u(c->seen_reserved) : "null") +
           ", \"seen_outside\": " + u(c->seen_outside) + "}";
}

std::string json_counters(const CounterSummary& cs) {
    return "{\"checks\": " + u(cs.checks) + ", \"agree\": " + u(cs.agree) +
           ", \"uncompared\": " + u(cs.uncompared) +
           ", \"first_difference\": " + json_counter_check(cs.first_difference) +
           ", \"last\": " + json_counter_check(cs.last) + "}";
}

std::string signed_bytes(uint64_t ours, uint64_t theirs) {
    return ours >= theirs ? "+" + human_bytes(ours - theirs) : "-" + human_bytes(theirs - ours);
}

}  // namespace

// What a bounded trace dropped, in one line; "" for a whole trace.
std::string bounded_line(const TraceAnalysis& a) {
    const BoundedSummary& b = a.bounded;
    if (b.gaps == 0) return {};
    return "bounded trace (--max-trace-size): " + u(b.events_dropped) + " events (" +
           human_bytes(b.bytes_dropped) + ") dropped after step " + u(b.last_step_before) +
           "; kept from step " + u(b.first_step_after) + " on, with the " +
           u(b.carried_allocations) + " allocations (" + human_bytes(b.carried_bytes) + ") and " +
           u(b.carried_scopes) + " scopes live there carried over";
}

// The self-check against the allocator's own counters (ALLOCSCOPE_COUNTERS_MARK
// marks): whether allocscope's live bytes agreed with them at each, and
// where the device memory the driver counts in use went.
std::vector<std::string> counter_lines(const TraceAnalysis& a) {
    std::vector<std::string> out;
    const CounterSummary& cs = a.counters;
    if (cs.uncompared)
        out.push_back("self-check: " + u(cs.uncompared) +
                      " allocator count(s) not compared (the process allocated on several "
                      "devices; allocscope's totals are the process's)");
    if (cs.checks == 0) return out;
    if (const std::optional<CounterCheck>& d = cs.first_difference) {
        std::string line = "self-check: differs from the allocator at " + u(cs.checks - cs.agree) +
                           " of " + u(cs.checks) + " steps; first at step " + u(d->step) + ": ";
        if (d->allocated_compared)
            line += "allocated " + human_bytes(d->allocated) + " by its count, " +
                    human_bytes(d->seen_allocated) + " by allocscope's (" +
                    signed_bytes(d->seen_allocated, d->allocated) + ")";
        if (d->reserved_compared)
            line += std::string(d->allocated_compared ? "; " : "") + "reserved " +
                    human_bytes(d->reserved) + " by its count, " + human_bytes(d->seen_reserved) +
                    " by allocscope's (" + signed_bytes(d->seen_reserved, d->reserved) + ")";
        out.push_back(line);
    } else {
        const CounterCheck& c = *cs.last;
        out.push_back("self-check: agrees with the allocator at " + u(cs.agree) + " of " +
                      u(cs.checks) + " steps (" +
                      (c.allocated_compared && c.reserved_compared ? "allocated and reserved"
                       : c.allocated_compared
                           ? "allocated"
                           : "reserved; allocated is not seen without per-tensor blocks") +
                      ")");
    }
    const CounterCheck& last = *cs.last;
    if (last.device_used) {
        const uint64_t outside =
            last.device_used > last.reserved ? last.device_used - last.reserved : 0;
        const uint64_t rest = outside > last.seen_outside ? outside - last.seen_outside : 0;
        out.push_back("device memory in use at step " + u(last.step) + " (the driver's count): " +
                      human_bytes(last.device_used) + "; the allocator's segments " +
                      human_bytes(last.reserved) + "; outside the allocator " +
                      human_bytes(outside) + ": " + human_bytes(last.seen_outside) +
                      " in libraries' own allocations allocscope saw (NCCL buffers, cuBLAS "
                      "workspaces), " +
                      human_bytes(rest) +
                      " it did not see (the CUDA context, libraries' code and static buffers)");
    }
    return out;
}

// The first line of a moment: who ran out, where, how much was asked.
std::string oom_headline(const TraceAnalysis& a, const OomMoment& m) {
    std::string line =
        rank_name(a) + ": out of memory at step " + u(m.step) + ", " + tag_text(m.layer, m.phase);
    if (!m.last_layer.empty())
        line += " (after " + tag_text(m.last_layer, m.last_phase) + ", the last layer tagged)";
    line += ", " + seconds(m.t_ns) + ": " + human_bytes(m.requested) + " requested";
    if (m.device >= 0) line += " on device " + std::to_string(m.device);
    if (m.segment_asked)
        line += ", for which the allocator asked for a " + human_bytes(m.segment_asked) +
                " segment (PyTorch's \"Tried to allocate\")";
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
    std::string line;
    if (m.allocated_known) {
        line = "allocated " + human_bytes(m.allocated) + " in " + u(m.allocated_count) +
               " allocation(s)";
    } else {
        line = "reserved " + human_bytes(m.reserved) + " in " + u(m.allocated_count) +
               " segment(s) (allocated is not seen without per-tensor blocks)";
    }
    if (m.reserved_known && m.allocated_known) {
        line += "; reserved " + human_bytes(m.reserved);
        if (m.reserved > m.allocated)
            line += " (" + human_bytes(m.reserved - m.allocated) + " cached, not allocated)";
    }
    if (m.outside_allocator)
        line += "; outside the allocator " + human_bytes(m.outside_allocator) +
                " (libraries' own: cuBLAS workspaces, NCCL buffers, ...)";
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

uint64_t TimelineX::operator()(uint64_t t_ns) const {
    return by_time() ? uint64_t(10000.0 * double(t_ns - std::min(t_ns, t0)) / double(t1 - t0) + 0.5)
                     : 0;
}

TimelineX timeline_x(const TraceAnalysis& a) {
    const std::vector<TimelinePoint>& points = a.timeline.points;
    if (points.empty()) return {};
    return {points.front().t_ns, std::max<uint64_t>(a.span_ns, points.back().t_ns)};
}

std::vector<PhaseBand> shown_bands(const TraceAnalysis& a) {
    const TimelineX x = timeline_x(a);
    if (!x.by_time()) return a.timeline.bands;
    std::vector<PhaseBand> out;
    uint64_t open_x1 = 0;
    for (const PhaseBand& b : a.timeline.bands) {
        const uint64_t x0 = x(b.t_start_ns), x1 = x(b.t_end_ns);
        if (!out.empty()) {
            PhaseBand& open = out.back();
            if (b.phase == open.phase ? x0 < open_x1 + 10 : x1 < x0 + 5) {
                if (b.phase == open.phase && x1 >= open_x1) {
                    open_x1 = x1;
                    open.seq_end = b.seq_end;
                    open.t_end_ns = b.t_end_ns;
                }
                continue;
            }
        }
        out.push_back(b);
        open_x1 = x1;
    }
    return out;
}

std::vector<StepMark> shown_steps(const TraceAnalysis& a) {
    const TimelineX x = timeline_x(a);
    if (!x.by_time()) return a.timeline.steps;
    std::vector<StepMark> out;
    uint64_t last_x = 0;
    for (const StepMark& m : a.timeline.steps) {
        const uint64_t at = x(m.t_ns);
        if (!out.empty() && at < last_x + 10) continue;  // one mark a pixel
        out.push_back(m);
        last_x = at;
    }
    return out;
}

std::vector<const StepMemory*> shown_forward_ends(const std::vector<StepMemory>& steps) {
    std::vector<const StepMemory*> used;
    for (const StepMemory& s : steps) {
        if (!s.forward_ends.empty()) used.push_back(&s);
    }
    if (used.size() > kShownForwardSteps)
        used.erase(used.begin(), used.end() - std::ptrdiff_t(kShownForwardSteps));
    return used;
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

namespace {

// A summary with its numbers masked: "1.50 MiB ... (step 5)" and
// "1.48 MiB ... (step 4)" say the same thing.
std::string masked(std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
            out += text[i];
            continue;
        }
        while (i + 1 < text.size() && (std::isdigit(static_cast<unsigned char>(text[i + 1])) ||
                                       (text[i + 1] == '.' && i + 2 < text.size() &&
                                        std::isdigit(static_cast<unsigned char>(text[i + 2])))))
            ++i;
        out += '#';
    }
    return out;
}

bool same_kind(const Finding& a, const Finding& b) {
    return a.plugin == b.plugin && a.severity == b.severity && a.layer == b.layer &&
           a.phase == b.phase && a.basis == b.basis;
}

// Whether `g` has a finding of `rank` (a finding without a rank is never
// grouped with another).
bool holds_rank(const FindingGroup& g, int32_t rank) {
    return rank < 0 || std::any_of(g.members.begin(), g.members.end(),
                                   [rank](const Finding* f) { return f->rank == rank; });
}

// How a finding's evidence reads on one line: count, bytes, steps.
std::string evidence_digest(const Finding& f) {
    uint64_t bytes = 0, first = UINT64_MAX, last = 0;
    for (const Evidence& e : f.evidence) {
        bytes += e.size;
        first = std::min(first, e.step);
        last = std::max(last, e.step);
    }
    std::string text = std::to_string(f.evidence.size()) + " allocation(s), " + human_bytes(bytes);
    if (!f.evidence.empty()) {
        text += first == last ? ", step " + std::to_string(first)
                              : ", steps " + std::to_string(first) + "–" + std::to_string(last);
    }
    return text;
}

bool same_evidence(const Finding& a, const Finding& b) {
    return std::equal(a.evidence.begin(), a.evidence.end(), b.evidence.begin(), b.evidence.end(),
                      [](const Evidence& x, const Evidence& y) {
                          return x.size == y.size && x.step == y.step && x.layer == y.layer &&
                                 x.phase == y.phase;
                      });
}

}  // namespace

std::string unproven_weights_line(const FindingsFile& file) {
    static constexpr std::string_view kDetectors[] = {"weight-copy-accumulation",
                                                      "transpose-cache-retention"};
    static constexpr const char* kPatterns[] = {"the FP8 weight-copy pattern",
                                                "the transpose-cache pattern"};
    auto is_detector = [](std::string_view plugin) {
        return std::find(std::begin(kDetectors), std::end(kDetectors), plugin) !=
               std::end(kDetectors);
    };
    // Streams whose weight detectors ran without provenance, by rank.
    std::vector<int32_t> ranks;
    std::string why;  // the first stream's reason
    bool said_off = false;
    for (const RankRun& r : file.ranks) {
        if (r.provenance == "on" || r.provenance.rfind("on ", 0) == 0) continue;
        if (std::none_of(r.plugins.begin(), r.plugins.end(), is_detector)) continue;
        if (std::find(ranks.begin(), ranks.end(), r.rank) == ranks.end()) ranks.push_back(r.rank);
        constexpr std::string_view kOff = "off: ";
        if (r.provenance.substr(0, kOff.size()) == kOff) {
            if (!said_off) why = r.provenance.substr(kOff.size());
            said_off = true;
        }
    }
    if (ranks.empty()) return {};
    // The layers each detector matched by size alone on those streams; a
    // layer that holds another matched one (a total's common prefix) is not
    // counted again.
    std::set<std::string> layers[2];
    for (const Finding& f : file.findings) {
        if (f.basis != "size-only" || f.layer.empty()) continue;
        if (std::find(ranks.begin(), ranks.end(), f.rank) == ranks.end()) continue;
        for (size_t d = 0; d < 2; ++d)
            if (f.plugin == kDetectors[d]) layers[d].insert(f.layer);
    }
    std::string matched;
    for (size_t d = 0; d < 2; ++d) {
        size_t n = 0;
        for (const std::string& l : layers[d]) {
            const bool holds =
                std::any_of(layers[d].begin(), layers[d].end(), [&l](const std::string& o) {
                    return o.size() > l.size() && o[l.size()] == '.' &&
                           o.compare(0, l.size(), l) == 0;
                });
            n += holds ? 0 : 1;
        }
        if (n == 0) continue;
        matched += std::string(matched.empty() ? "" : ", ") + std::to_string(n) +
                   (n == 1 ? " layer matches " : " layers match ") + kPatterns[d];
    }
    if (matched.empty() && !said_off) return {};
    const std::string where = ranks.size() == 1 && ranks[0] < 0 ? "" : " on " + ranks_text(ranks);
    const std::string cause = said_off ? "provenance was off" + where + ": " + printable(why)
                                       : "no provenance was declared" + where;
    const std::string how =
        "to prove them, run with provenance (on by default under allocscope run when the "
        "PyTorch bridge loads; C/C++ programs declare allocscope_derived()) or compare "
        "against a baseline (allocscope diff BASE CAND)";
    if (matched.empty())
        return cause +
               "; the weight-copy and transpose detectors had sizes only, and no layer matched "
               "their patterns";
    return "weight-copy / transpose detectors had sizes only (" + cause + "): " + matched +
           ", not proven, so not errors; " + how;
}

std::string distinct_findings_text(const FindingsFile& file, const std::string& where) {
    size_t distinct[3] = {0, 0, 0};
    size_t all[3] = {0, 0, 0};
    const std::vector<FindingGroup> groups = collapse_findings(file);
    for (const FindingGroup& g : groups)
        ++distinct[static_cast<int>(g.members[0]->severity)];
    for (const Finding& f : file.findings)
        ++all[static_cast<int>(f.severity)];
    auto counted = [](size_t n, const char* what) {
        return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
    };
    std::string out = counted(distinct[2], "error") + ", " + counted(distinct[1], "warning") +
                      ", " + counted(distinct[0], "info") + where;
    if (groups.size() != file.findings.size())
        out += " (" + std::to_string(all[2]) + ", " + std::to_string(all[1]) + " and " +
               std::to_string(all[0]) + " counting each rank's)";
    return out;
}

std::string findings_count_line(const FindingsFile& file) {
    std::vector<int32_t> ranks;
    for (const Finding& f : file.findings) {
        if (std::find(ranks.begin(), ranks.end(), f.rank) == ranks.end()) ranks.push_back(f.rank);
    }
    return distinct_findings_text(file, ranks.empty() ? "" : " on " + ranks_text(ranks)) +
           "; what several ranks found alike is one finding, shown once";
}

std::string provenance_steps_line(const FindingsFile& file) {
    constexpr std::string_view kIn = "on in steps ";
    // The texts of the streams whose provenance paused, each once, with
    // their ranks.
    std::vector<std::pair<std::string, std::vector<int32_t>>> texts;
    for (const RankRun& r : file.ranks) {
        if (r.provenance.rfind(kIn, 0) != 0) continue;
        const std::string steps = r.provenance.substr(kIn.size());
        auto it = std::find_if(texts.begin(), texts.end(),
                               [&steps](const auto& t) { return t.first == steps; });
        if (it == texts.end()) it = texts.insert(texts.end(), {steps, {}});
        if (r.rank >= 0) it->second.push_back(r.rank);
    }
    if (texts.empty()) return {};
    constexpr size_t kShown = 3;
    std::string out = "provenance observed steps ";
    for (size_t i = 0; i < texts.size() && i < kShown; ++i) {
        if (i) out += "; ";
        out += printable(texts[i].first);
        if (texts.size() > 1 && !texts[i].second.empty())
            out += " on " + ranks_text(texts[i].second);
    }
    if (texts.size() > kShown) out += "; and " + std::to_string(texts.size() - kShown) + " more";
    return out +
           " (ALLOCSCOPE_PROVENANCE_STEPS, by default the first 4 steps, then 2 in every 100): "
           "the weight detectors judged those steps; --provenance-steps all observes every step";
}

std::vector<FindingGroup> collapse_findings(const FindingsFile& file) {
    std::vector<FindingGroup> groups;
    // The same summary first, so that a rank's finding joins its exact twin.
    for (const Finding& f : file.findings) {
        auto g = std::find_if(groups.begin(), groups.end(), [&f](const FindingGroup& c) {
            return same_kind(*c.members[0], f) && c.members[0]->summary == f.summary &&
                   !holds_rank(c, f.rank);
        });
        if (g == groups.end()) {
            groups.push_back({{&f}});
        } else {
            g->members.push_back(&f);
        }
    }
    // Then the same but for numbers, between groups of other ranks.
    std::vector<std::string> keys;
    for (const FindingGroup& g : groups)
        keys.push_back(masked(g.members[0]->summary));
    for (size_t i = 0; i < groups.size(); ++i) {
        for (size_t j = i + 1; j < groups.size();) {
            const bool disjoint =
                std::none_of(groups[j].members.begin(), groups[j].members.end(),
                             [&](const Finding* f) { return holds_rank(groups[i], f->rank); });
            if (disjoint && keys[i] == keys[j] &&
                same_kind(*groups[i].members[0], *groups[j].members[0])) {
                groups[i].members.insert(groups[i].members.end(), groups[j].members.begin(),
                                         groups[j].members.end());
                groups.erase(groups.begin() + long(j));
                keys.erase(keys.begin() + long(j));
            } else {
                ++j;
            }
        }
    }
    for (FindingGroup& g : groups) {
        std::stable_sort(g.members.begin(), g.members.end(),
                         [](const Finding* a, const Finding* b) { return a->rank < b->rank; });
    }
    return groups;
}

std::string ranks_text(std::vector<int32_t> ranks) {
    std::sort(ranks.begin(), ranks.end());
    const bool rankless = !ranks.empty() && ranks.front() < 0;
    std::erase_if(ranks, [](int32_t r) { return r < 0; });
    std::string text;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] <= ranks[j] + 1)
            ++j;
        text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
        if (ranks[j] != ranks[i]) text += "–" + std::to_string(ranks[j]);
        i = j + 1;
    }
    if (!text.empty()) {
        const bool one = ranks.front() == ranks.back();
        text = (one ? "rank " : "ranks ") + text;
    }
    if (rankless) text += text.empty() ? "no rank" : ", no rank";
    return text;
}

std::string group_ranks(const FindingGroup& group) {
    const Finding& first = *group.members.at(0);
    // A process without a rank is named by its pid (it is never merged).
    if (group.members.size() == 1 && first.rank < 0) return process_label(first.rank, first.pid);
    std::vector<int32_t> ranks;
    for (const Finding* f : group.members)
        ranks.push_back(f->rank);
    return ranks_text(ranks);
}

std::vector<std::string> group_differences(const FindingGroup& group) {
    std::vector<std::string> lines;
    if (group.members.empty()) return lines;
    const Finding& first = *group.members[0];
    for (size_t k = 1; k < group.members.size(); ++k) {
        const Finding& f = *group.members[k];
        const std::string who = ranks_text({f.rank});
        if (f.bytes != first.bytes || f.count != first.count || f.summary != first.summary) {
            lines.push_back(who + ": " + human_bytes(f.bytes) + "  " + printable(f.summary));
        } else if (!same_evidence(f, first)) {
            lines.push_back(who + ": evidence " + evidence_digest(f) + " (" +
                            ranks_text({first.rank}) + ": " + evidence_digest(first) + ")");
        }
    }
    return lines;
}

std::vector<std::string> group_lines(const FindingGroup& group) {
    std::vector<std::string> lines;
    if (group.members.empty()) return lines;
    lines.push_back(summary_line(*group.members[0], group_ranks(group)));
    for (const std::string& line : group_differences(group))
        lines.push_back("  " + line);
    return lines;
}

namespace {

// What ended the run, first: each rank's out-of-memory moments. In full
// every moment is shown in detail; concise gives the earlier ones a line
// each and the last in detail.
void text_oom_section(std::string& out, const Report& report, TextDetail detail) {
    bool any_oom = false;
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        if (a.ooms.empty()) continue;
        if (!any_oom) out += "\n== out of memory ==\n";
        any_oom = true;
        if (a.oom_moments_total > a.ooms.size())
            out += rank_name(a) + ": " + u(a.oom_moments_total) +
                   " out-of-memory moments, the last " + u(a.ooms.size()) + " shown\n";
        const bool full = detail == TextDetail::full;
        for (size_t k = 0; k + 1 < a.ooms.size(); ++k) {
            if (full)
                text_oom(out, report, r, a.ooms[k], true);
            else
                out += oom_headline(a, a.ooms[k]) + "\n";
        }
        text_oom(out, report, r, a.ooms.back(), full);
    }
}

// Every rank's sections, every finding with its first evidence and every frame.
std::string hosts_text(const std::vector<const TraceAnalysis*>& traces);

std::string full_text(const Report& report) {
    std::string out = "allocscope report: " + std::to_string(report.ranks.size()) + " trace(s)\n";
    {
        std::vector<const TraceAnalysis*> traces;
        for (const RankReport& r : report.ranks)
            traces.push_back(&r.analysis);
        if (const std::string hosts = hosts_text(traces); !hosts.empty()) out += hosts + "\n";
    }
    for (const std::string& note : report.notes)
        out += "note: " + printable(note) + "\n";
    text_oom_section(out, report, TextDetail::full);
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        out += "\n== " + rank_name(a) + ": " + printable(a.path) + " (pid " +
               std::to_string(a.header.pid) +
               (a.header.host.empty() ? "" : ", host " + printable(a.header.host)) +
               ", allocscope " + printable(a.header.tool_version) + ") ==\n";
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
        for (const std::string& line : counter_lines(a))
            out += line + "\n";
        if (const std::string line = bounded_line(a); !line.empty()) out += line + "\n";
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
        text_sites(out, r, a.sites_at_peak, "top allocation sites at the peak", true);
        text_sites(out, r, a.sites_at_exit, "top allocation sites at exit", true);
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
            for (const std::string& line : all_stack_lines(report.ranks[size_t(ri)], ev.stack_id))
                out += "        " + line + "\n";
        }
        if (f.evidence.size() > 3)
            out += "      ... " + std::to_string(f.evidence.size() - 3) + " more\n";
    }
    return out;
}

// The concise report's sizes: (layer, phase) rows in the top of any column,
// sites, problem findings shown with evidence, info findings listed.
constexpr size_t kTopAllocatedRows = 8, kTopColumnRows = 4;
constexpr size_t kPeakSites = 5, kExitSites = 3;
constexpr size_t kDetailedProblems = 8, kListedInfos = 3;

// "ranks 0–1" for traces with ranks, else their names ("pid 42").
std::string traces_text(const std::vector<const TraceAnalysis*>& traces) {
    std::vector<int32_t> ranks;
    std::string names;
    bool rankless = false;
    for (const TraceAnalysis* a : traces) {
        ranks.push_back(a->header.rank);
        rankless |= a->header.rank < 0;
        names += (names.empty() ? "" : ", ") + rank_name(*a);
    }
    return rankless ? names : ranks_text(ranks);
}

// "hosts: 2 (a: ranks 0–3; b: ranks 4–7)" where the traces come from
// several machines (their host records), else "". Many hosts are summed up:
// the first two, the last, and how many ranks each has where all have as many.
std::string hosts_text(const std::vector<const TraceAnalysis*>& traces) {
    std::map<std::string, std::vector<const TraceAnalysis*>> by_host;
    for (const TraceAnalysis* a : traces)
        by_host[a->header.host].push_back(a);
    if (by_host.size() < 2) return {};
    std::vector<std::pair<std::string, std::string>> rows;  // host, its ranks
    std::set<size_t> sizes;
    for (const auto& [host, members] : by_host) {
        rows.push_back(
            {host.empty() ? "(no host recorded)" : printable(host), traces_text(members)});
        sizes.insert(members.size());
    }
    // Hosts in the order of their first rank.
    std::vector<size_t> order(rows.size());
    std::vector<int32_t> first;
    for (const auto& [host, members] : by_host) {
        int32_t low = INT32_MAX;
        for (const TraceAnalysis* a : members)
            low = std::min(low, a->header.rank < 0 ? INT32_MAX : a->header.rank);
        first.push_back(low);
    }
    for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&first](size_t x, size_t y) { return first[x] < first[y]; });
    std::string out = "hosts: " + u(rows.size());
    if (sizes.size() == 1 && *sizes.begin() > 1) out += ", " + u(*sizes.begin()) + " traces each";
    auto row = [&rows](size_t i) { return rows[i].first + ": " + rows[i].second; };
    out += " (";
    if (order.size() <= 4) {
        for (size_t k = 0; k < order.size(); ++k)
            out += (k ? "; " : "") + row(order[k]);
    } else {
        out += row(order[0]) + "; " + row(order[1]) + "; …; " + row(order.back());
    }
    return out + ")";
}

// The (layer, phase) rows worth a line: the top of each column.
void concise_tags(std::string& out, const std::vector<TagStats>& all) {
    std::vector<const TagStats*> tags;
    for (const TagStats& t : all) {
        if (t.allocations || t.at_peak) tags.push_back(&t);
    }
    std::set<const TagStats*> chosen;
    auto top = [&](size_t n, uint64_t TagStats::*column) {
        std::vector<const TagStats*> by = tags;
        std::stable_sort(by.begin(), by.end(), [column](const TagStats* x, const TagStats* y) {
            return x->*column > y->*column;
        });
        for (size_t k = 0; k < by.size() && k < n && by[k]->*column; ++k)
            chosen.insert(by[k]);
    };
    top(kTopAllocatedRows, &TagStats::allocated_bytes);
    top(kTopColumnRows, &TagStats::retained_max);
    top(kTopColumnRows, &TagStats::at_peak);
    top(kTopColumnRows, &TagStats::at_exit);
    out += tag_header();
    for (const TagStats* t : tags) {
        if (chosen.contains(t)) out += tag_row(*t);
    }
    if (tags.size() > chosen.size())
        out += "  ... " + u(tags.size() - chosen.size()) + " more rows (--full)\n";
}

// One site of several ranks: the same frames and tag.
struct SiteRow {
    const RankReport* first = nullptr;
    const Site* site = nullptr;
    std::vector<std::pair<const TraceAnalysis*, const Site*>> ranks;
    uint64_t bytes = 0;  // the most of any rank
};

void concise_sites(std::string& out, const Report& report, std::vector<Site> TraceAnalysis::*sites,
                   const char* title, size_t limit) {
    std::map<std::tuple<std::vector<std::string>, std::string, std::string>, size_t> index;
    std::vector<SiteRow> rows;
    for (const RankReport& r : report.ranks) {
        for (const Site& s : r.analysis.*sites) {
            if (s.bytes == 0) continue;
            auto frames = r.stacks.find(s.stack);
            auto key = std::make_tuple(
                frames == r.stacks.end() ? std::vector<std::string>{} : frames->second, s.layer,
                s.phase);
            auto [it, added] = index.try_emplace(key, rows.size());
            if (added) rows.push_back({&r, &s, {}, 0});
            SiteRow& row = rows[it->second];
            row.ranks.emplace_back(&r.analysis, &s);
            row.bytes = std::max(row.bytes, s.bytes);
        }
    }
    if (rows.empty()) return;
    std::stable_sort(rows.begin(), rows.end(),
                     [](const SiteRow& x, const SiteRow& y) { return x.bytes > y.bytes; });
    out += std::string("\n") + title + ":\n";
    for (size_t k = 0; k < rows.size() && k < limit; ++k) {
        const SiteRow& row = rows[k];
        std::vector<const TraceAnalysis*> traces;
        std::string differ;
        for (const auto& [a, s] : row.ranks) {
            traces.push_back(a);
            if (s->bytes != row.site->bytes || s->count != row.site->count)
                differ += (differ.empty() ? " (" : "; ") + rank_name(*a) + ": " +
                          human_bytes(s->bytes) + " in " + u(s->count);
        }
        if (!differ.empty()) differ += ")";
        out += "  #" + u(k + 1) + " " + human_bytes(row.site->bytes) + " in " + u(row.site->count) +
               " allocation(s) on " + traces_text(traces) + differ + ", mostly " +
               tag_text(row.site->layer, row.site->phase) + "\n";
        for (const std::string& line : stack_lines(*row.first, row.site->stack, 4, 4))
            out += "      " + line + "\n";
    }
    if (rows.size() > limit) out += "  ... " + u(rows.size() - limit) + " more sites (--full)\n";
}

void concise_findings(std::string& out, const Report& report) {
    out += "\nfindings: ";
    if (!report.findings_found) {
        out += "none recorded (no findings file next to the traces)\n";
        return;
    }
    size_t infos_in_all = 0;
    for (const Finding& f : report.findings.findings)
        infos_in_all += f.severity == Severity::info;
    out += findings_count_line(report.findings) + "\n";
    if (const std::string line = unproven_weights_line(report.findings); !line.empty())
        out += "  " + line + "\n";
    if (const std::string line = provenance_steps_line(report.findings); !line.empty())
        out += "  " + line + "\n";
    std::vector<FindingGroup> groups = collapse_findings(report.findings);
    std::stable_sort(groups.begin(), groups.end(),
                     [](const FindingGroup& a, const FindingGroup& b) {
                         return a.members[0]->severity > b.members[0]->severity;
                     });
    // Which errors and warnings show their first evidence and its stack: at
    // most kDetailedProblems, first one of every plugin's (so no detector's
    // problems go without a site), then the others in order whose stack is
    // not one already shown.
    auto first_stack = [&report](const Finding& f) {
        std::string text;
        const int ri = rank_index(report, f.rank);
        if (ri < 0 || f.evidence.empty()) return text;
        for (const std::string& line :
             stack_lines(report.ranks[size_t(ri)], f.evidence[0].stack_id, 3, 3))
            text += line + "\n";
        return text;
    };
    std::set<const FindingGroup*> detailed;
    {
        std::set<std::string> plugins, stacks;
        for (int pass = 0; pass < 2; ++pass) {
            for (const FindingGroup& g : groups) {
                const Finding& f = *g.members[0];
                if (f.severity == Severity::info || f.evidence.empty() || detailed.contains(&g) ||
                    detailed.size() >= kDetailedProblems)
                    continue;
                const std::string stack = first_stack(f);
                if (pass == 0 ? plugins.contains(f.plugin) : stacks.contains(stack)) continue;
                detailed.insert(&g);
                plugins.insert(f.plugin);
                stacks.insert(stack);
            }
        }
    }
    std::vector<const FindingGroup*> infos;
    std::map<std::string, size_t> infos_by_plugin;
    for (const FindingGroup& g : groups) {
        const Finding& f = *g.members[0];
        if (f.severity == Severity::info) {
            infos.push_back(&g);
            for (const Finding* m : g.members)
                ++infos_by_plugin[m->plugin];
            continue;
        }
        const std::vector<std::string> lines = group_lines(g);
        out += "  " + lines[0] + "\n";
        for (size_t k = 1; k < lines.size(); ++k)
            out += "    " + lines[k] + "\n";
        if (!detailed.contains(&g)) continue;
        const Evidence& ev = f.evidence[0];
        out += "      evidence: " + human_bytes(ev.size) + " " + tag_text(ev.layer, ev.phase) +
               " step " + u(ev.step) + (ev.free_seq ? ", freed" : ", alive at exit") +
               (g.members.size() > 1 ? " (" + ranks_text({f.rank}) + ")" : "") + "\n";
        if (!ev.note.empty()) out += "        " + printable(ev.note) + "\n";
        const int ri = rank_index(report, f.rank);
        if (ri >= 0) {
            for (const std::string& line : stack_lines(report.ranks[size_t(ri)], ev.stack_id, 3, 3))
                out += "        " + line + "\n";
        }
        if (f.evidence.size() > 1)
            out +=
                "      ... " + u(f.evidence.size() - 1) + " more evidence allocation(s) (--full)\n";
    }
    if (infos.empty()) return;
    std::string plugins;
    for (const auto& [plugin, n] : infos_by_plugin)
        plugins += (plugins.empty() ? "" : ", ") + printable(plugin) + " " + u(n);
    out += "  info: " + u(infos_in_all) + " finding(s), " + u(infos.size()) +
           " distinct: " + plugins + "; the largest:\n";
    std::stable_sort(infos.begin(), infos.end(), [](const FindingGroup* a, const FindingGroup* b) {
        return a->members[0]->bytes > b->members[0]->bytes;
    });
    for (size_t k = 0; k < infos.size() && k < kListedInfos; ++k)
        out += "  " + group_lines(*infos[k])[0] + "\n";
    if (infos.size() > kListedInfos)
        out +=
            "  ... " + u(infos.size() - kListedInfos) + " more distinct info findings (--full)\n";
}

// The directory of the traces, for the line on `--full`.
std::string traces_dir(const Report& report) {
    std::string dir;
    for (const RankReport& r : report.ranks) {
        const std::string& path = r.analysis.path;
        const size_t slash = path.rfind('/');
        const std::string mine = slash == std::string::npos ? "." : path.substr(0, slash);
        if (!dir.empty() && mine != dir) return "TRACES...";
        dir = mine;
    }
    return dir;
}

// One rank's lines of the run section, after its name ("NAME: " is put
// before the first by the caller).
std::string run_lines(const TraceAnalysis& a) {
    std::string out = u(a.events) + " events over " + seconds(a.span_ns) + ", " + u(a.steps) +
                      " steps; tensors are " +
                      (a.owner == Pool::device_block ? "caching-allocator blocks"
                                                     : "device segments (no block events)") +
                      "\n";
    if (a.truncated)
        out += "  warning: " + printable(a.truncation_message) + "; reporting what precedes it\n";
    std::string peak, exit;
    for (const PoolSummary& p : a.pools) {
        peak += std::string(peak.empty() ? "" : "; ") + to_string(p.pool) + " " +
                human_bytes(p.peak_bytes) + " at step " + u(p.peak_step) + ", " +
                tag_text(p.peak_layer, p.peak_phase);
        exit += (exit.empty() ? "" : ", ") + std::string(to_string(p.pool)) + " " +
                human_bytes(p.live_bytes_at_exit);
    }
    if (!peak.empty()) out += "  peak " + peak + "\n  live at exit: " + exit + "\n";
    if (a.unknown_frees || a.double_frees || a.failed_frees)
        out += "  frees of unknown addresses: " + u(a.unknown_frees) +
               ", double frees: " + u(a.double_frees) + ", failed frees: " + u(a.failed_frees) +
               "\n";
    if (a.oom_events) {
        out += "  failed allocations (oom): " + u(a.oom_events) + ", largest request " +
               human_bytes(a.largest_failed_request) + "; " + u(a.oom_moments_total) +
               " out-of-memory moment(s), " + u(a.recovered_failures) +
               " failed call(s) recovered from (the allocator retried)\n";
    }
    for (const std::string& line : counter_lines(a))
        out += "  " + line + "\n";
    if (const std::string line = bounded_line(a); !line.empty()) out += "  " + line + "\n";
    return out;
}

struct RankLines {
    const TraceAnalysis* analysis;
    std::string text;  // run_lines
};

// A number standing alone in a line ("6721 events", "40.0 MiB", "step 0,"):
// after the line's start, a space or '(' and before a space, ',', ';', ')'
// or the end; not the digits of a name such as "layers.7".
struct NumberSpan {
    size_t begin, end;
};
std::vector<NumberSpan> standalone_numbers(std::string_view text) {
    std::vector<NumberSpan> spans;
    for (size_t i = 0; i < text.size(); ++i) {
        if (!std::isdigit(static_cast<unsigned char>(text[i]))) continue;
        if (i > 0 && text[i - 1] != ' ' && text[i - 1] != '(') {
            while (i + 1 < text.size() && !std::isspace(static_cast<unsigned char>(text[i + 1])))
                ++i;
            continue;
        }
        size_t j = i;
        while (j < text.size() &&
               (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.'))
            ++j;
        if (j == text.size() || text[j] == ' ' || text[j] == ',' || text[j] == ';' ||
            text[j] == ')' || text[j] == '\n')
            spans.push_back({i, j});
        i = j;
    }
    return spans;
}

// The run section with alike ranks together: ranks whose lines differ in
// their standalone numbers only are one group, printed once with each
// number that differs as its range ("110.350–110.854 s"); a rank unlike
// the others is printed on its own, so outliers stand out by name.
std::string grouped_run_section(const std::vector<RankLines>& ranks) {
    struct Group {
        std::string key;
        std::vector<size_t> members;
    };
    std::vector<Group> groups;
    std::vector<std::vector<NumberSpan>> spans;
    for (size_t i = 0; i < ranks.size(); ++i) {
        const std::string& text = ranks[i].text;
        spans.push_back(standalone_numbers(text));
        std::string key;
        size_t at = 0;
        for (const NumberSpan& n : spans.back()) {
            key.append(text, at, n.begin - at);
            key += '#';
            at = n.end;
        }
        key.append(text, at, std::string::npos);
        // A rank without a number (a trace's name) is grouped with nothing.
        const bool groupable = ranks[i].analysis->header.rank >= 0;
        auto g = groupable ? std::find_if(groups.begin(), groups.end(),
                                          [&](const Group& c) {
                                              return c.key == key &&
                                                     ranks[c.members[0]].analysis->header.rank >= 0;
                                          })
                           : groups.end();
        if (g == groups.end()) {
            groups.push_back({std::move(key), {i}});
        } else {
            g->members.push_back(i);
        }
    }
    std::string out;
    for (const Group& g : groups) {
        const RankLines& first = ranks[g.members[0]];
        if (g.members.size() == 1) {
            out += rank_name(*first.analysis) + ": " + first.text;
            continue;
        }
        std::vector<int32_t> ids;
        for (size_t m : g.members)
            ids.push_back(ranks[m].analysis->header.rank);
        // Each number as its range over the group.
        std::string text;
        size_t at = 0;
        const std::vector<NumberSpan>& own = spans[g.members[0]];
        for (size_t k = 0; k < own.size(); ++k) {
            text.append(first.text, at, own[k].begin - at);
            std::string lo, hi;
            double lo_v = 0, hi_v = 0;
            for (size_t m : g.members) {
                const NumberSpan n = spans[m][k];
                const std::string v = ranks[m].text.substr(n.begin, n.end - n.begin);
                const double x = std::strtod(v.c_str(), nullptr);
                if (lo.empty() || x < lo_v) lo = v, lo_v = x;
                if (hi.empty() || x > hi_v) hi = v, hi_v = x;
            }
            text += lo == hi ? lo : lo + "–" + hi;
            at = own[k].end;
        }
        text.append(first.text, at, std::string::npos);
        out += ranks_text(ids) + " (" + u(g.members.size()) + " alike): " + text;
    }
    return out;
}

std::string concise_text(const Report& report) {
    std::vector<const TraceAnalysis*> traces;
    for (const RankReport& r : report.ranks)
        traces.push_back(&r.analysis);
    std::string out =
        "allocscope report: " + u(report.ranks.size()) + " trace(s), " + traces_text(traces) + "\n";
    if (const std::string hosts = hosts_text(traces); !hosts.empty()) out += hosts + "\n";
    for (const std::string& note : report.notes)
        out += "note: " + printable(note) + "\n";
    text_oom_section(out, report, TextDetail::concise);
    out += "\n== run ==\n";
    const TraceAnalysis* tallest = nullptr;
    auto owner_peak = [](const TraceAnalysis& a) {
        const PoolSummary* p = a.pool(a.owner);
        return p ? p->peak_bytes : 0;
    };
    std::vector<RankLines> lines;
    for (const RankReport& r : report.ranks) {
        const TraceAnalysis& a = r.analysis;
        if (!tallest || owner_peak(a) > owner_peak(*tallest)) tallest = &a;
        lines.push_back({&a, run_lines(a)});
    }
    out += grouped_run_section(lines);
    if (tallest) text_timeline(out, *tallest, rank_name(*tallest));
    const std::string pool = tallest ? std::string(to_string(tallest->owner)) : "owner";
    out += "\nby (layer, phase), " + pool + " bytes" +
           (report.ranks.size() > 1 ? ", all ranks added up" : "") +
           ": allocated; kept@end = the most one scope of it left alive at its end;"
           " live at the peak and at exit:\n";
    concise_tags(out, report.ranks.size() > 1 ? merged_tags(report)
                      : report.ranks.empty()  ? std::vector<TagStats>{}
                                              : report.ranks[0].analysis.tags);
    concise_sites(out, report, &TraceAnalysis::sites_at_peak, "top allocation sites at the peak",
                  kPeakSites);
    concise_sites(out, report, &TraceAnalysis::sites_at_exit, "top allocation sites at exit",
                  kExitSites);
    concise_findings(out, report);
    out += "\nThis is the concise report: `allocscope report --full " + traces_dir(report) +
           "` shows every rank, row, finding and frame; --format json or html for the rest.\n";
    return out;
}

}  // namespace

std::string render_text(const Report& report, TextDetail detail) {
    return detail == TextDetail::full ? full_text(report) : concise_text(report);
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
        out += "    {\"trace\": " + json_quote(a.path) +
               ", \"rank\": " + std::to_string(a.header.rank) + ", \"pid\": " + u(a.header.pid) +
               ", \"host\": " + json_quote(a.header.host) + ", \"events\": " + u(a.events) +
               ", \"bounded\": {\"events_dropped\": " + u(a.bounded.events_dropped) +
               ", \"bytes_dropped\": " + u(a.bounded.bytes_dropped) +
               ", \"last_step_before\": " + u(a.bounded.last_step_before) +
               ", \"first_step_after\": " + u(a.bounded.first_step_after) +
               ", \"carried_allocations\": " + u(a.bounded.carried_allocations) + "}" +
               ", \"span_ns\": " + u(a.span_ns) + ", \"steps\": " + u(a.steps) +
               ", \"truncated\": " + (a.truncated ? "true" : "false") +
               ", \"oom_events\": " + u(a.oom_events) +
               ", \"oom_moments\": " + u(a.oom_moments_total) +
               ", \"recovered_failures\": " + u(a.recovered_failures) +
               ", \"owner_pool\": " + json_quote(to_string(a.owner)) +
               ",\n     \"allocator_check\": " + json_counters(a.counters) +
               ",\n     \"events_by_kind\": {";
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
        const std::vector<PhaseBand> bands = shown_bands(a);
        for (size_t k = 0; k < bands.size(); ++k) {
            const PhaseBand& b = bands[k];
            out += (k ? ", " : "") + std::string("{\"phase\": ") + json_quote(b.phase) +
                   ", \"seq_start\": " + u(b.seq_start) + ", \"seq_end\": " + u(b.seq_end) +
                   ", \"t_start_ns\": " + u(b.t_start_ns) + ", \"t_end_ns\": " + u(b.t_end_ns) +
                   "}";
        }
        out += "],\n       \"steps\": [";
        const std::vector<StepMark> steps = shown_steps(a);
        for (size_t k = 0; k < steps.size(); ++k) {
            const StepMark& s = steps[k];
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

std::vector<std::string> all_stack_lines(const RankReport& r, uint32_t stack) {
    std::vector<std::string> lines;
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end()) return lines;
    for (const std::string& frame : it->second)
        lines.push_back(printable(frame));
    return lines;
}

namespace {

// A run of frames that are not the program's, shown as one line.
struct Fold {
    size_t allocator = 0, framework = 0, runtime = 0;

    void add(FrameKind k) {
        if (k == FrameKind::framework) {
            ++framework;
        } else if (k == FrameKind::runtime) {
            ++runtime;
        } else {
            ++allocator;  // allocscope's own frames count with the allocator's
        }
    }
    void flush(std::vector<std::string>& lines) {
        std::string line = "...";
        const char* sep = " ";
        for (const auto& [n, what] :
             {std::pair{allocator, "allocator"}, std::pair{framework, "framework"},
              std::pair{runtime, "runtime"}}) {
            if (n == 0) continue;
            line += sep + std::to_string(n) + " " + what + (n == 1 ? " frame" : " frames");
            sep = ", ";
        }
        if (allocator + framework + runtime) lines.push_back(line);
        *this = {};
    }
};

// Where the Python frames of a stack of r.stacks begin: its size when it
// has none.
size_t python_frames_from(const RankReport& r, uint32_t stack) {
    const size_t size = r.stacks.at(stack).size();
    auto py = r.python_from.find(stack);
    return py == r.python_from.end() ? size : std::min(py->second, size);
}

// Frames [from, to) as they are: the first `cap`, then a count of the rest.
void plain_frames(std::vector<std::string>& lines, const std::vector<std::string>& frames,
                  size_t from, size_t to, size_t cap, const char* what) {
    const size_t last = std::min(to, from + cap);
    for (size_t f = from; f < last; ++f)
        lines.push_back(printable(frames[f]));
    if (to > last)
        lines.push_back("... " + std::to_string(to - last) + " more " + what + " frames");
}

}  // namespace

std::vector<std::string> stack_lines(const RankReport& r, uint32_t stack, size_t native,
                                     size_t python) {
    std::vector<std::string> lines;
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end()) return lines;
    const std::vector<std::string>& frames = it->second;
    const size_t first_python = python_frames_from(r, stack);
    const std::vector<FrameKind> kinds = frame_kinds(frames, first_python);
    auto has_user = [&](size_t from, size_t to) {
        return std::find(kinds.begin() + long(from), kinds.begin() + long(to), FrameKind::user) !=
               kinds.begin() + long(to);
    };
    const bool user_native = has_user(0, first_python);
    const bool user_python = has_user(first_python, frames.size());
    Fold fold;
    // The program's frames of [from, to), up to `cap`, each run of others
    // folded; frames after the last one shown are counted. A segment with
    // none of the program's frames leaves its fold to the next one.
    auto program_frames = [&](size_t from, size_t to, size_t cap, const char* what) {
        size_t shown = 0, end = from;
        for (size_t f = from; f < to; ++f) {
            if (kinds[f] != FrameKind::user) {
                fold.add(kinds[f]);
                continue;
            }
            if (shown == cap) break;
            fold.flush(lines);
            lines.push_back(printable(frames[f]));
            ++shown;
            end = f + 1;
        }
        if (shown == 0) return;
        fold = {};
        if (end < to)
            lines.push_back("... " + std::to_string(to - end) + " more " + what + " frames");
    };
    if (!user_native && !user_python) {
        // Nothing is the program's: fold what leads into the allocator, keep one frame.
        const size_t lead = program_start(kinds, first_python);
        for (size_t f = 0; f < lead; ++f)
            fold.add(kinds[f]);
        fold.flush(lines);
        plain_frames(lines, frames, lead, first_python, native, "native");
        plain_frames(lines, frames, first_python, frames.size(), python, "Python");
        return lines;
    }
    program_frames(0, first_python, user_native ? native : 0, "native");
    if (user_python) {
        program_frames(first_python, frames.size(), python, "Python");
    } else {
        fold.flush(lines);
        plain_frames(lines, frames, first_python, frames.size(), python, "Python");
    }
    return lines;
}

std::string stack_start(const RankReport& r, uint32_t stack) {
    auto it = r.stacks.find(stack);
    if (it == r.stacks.end() || it->second.empty()) return {};
    const size_t first_python = python_frames_from(r, stack);
    return printable(
        it->second[program_start(frame_kinds(it->second, first_python), first_python)]);
}

}  // namespace allocscope
