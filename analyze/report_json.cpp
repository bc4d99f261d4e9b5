// The JSON report (docs/REPORT.md, "JSON"): every rank's analysis, the
// findings and the stacks they show, for tools.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>

#include "report.h"
#include "report_internal.h"

namespace allocscope {

using namespace report_detail;

namespace {

void json_string_list(std::string& out, const std::vector<std::string>& items) {
    out += "[";
    for (size_t i = 0; i < items.size(); ++i)
        out += (i ? ", " : "") + json_quote(items[i]);
    out += "]";
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

void json_oom(std::string& out, const Report& report, const RankReport& r, const OomMoment& m) {
    const TraceAnalysis& a = r.analysis;
    out += "{\"rank\": " + std::to_string(a.header.rank) + ", \"pid\": " + u(a.header.pid) +
           ", \"trace\": " + json_quote(a.path) + ", \"seq\": " + u(m.seq) +
           ", \"t_ns\": " + u(m.t_ns) + ", \"step\": " + u(m.step) + ", \"tid\": " + u(m.tid) +
           ", \"layer\": " + json_quote(m.layer) + ", \"phase\": " + json_quote(m.phase) +
           ", \"last_layer\": " + json_quote(m.last_layer) +
           ", \"last_phase\": " + json_quote(m.last_phase) +
           ", \"parameter\": " + json_quote(m.parameter) +
           ", \"parameter_count\": " + u(m.parameter_count) + ", \"requested\": " + u(m.requested) +
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

}  // namespace

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
        out += "],\n     \"graph_pools\": {\"allocations\": " + u(a.graph_pools.allocations) +
               ", \"allocated_bytes\": " + u(a.graph_pools.allocated_bytes) +
               ", \"peak_bytes\": " + u(a.graph_pools.peak_bytes) +
               ", \"live_bytes_at_exit\": " + u(a.graph_pools.live_bytes) +
               ", \"live_count_at_exit\": " + u(a.graph_pools.live_count) + "}";
        out += ",\n     \"tags\": ";
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

}  // namespace allocscope
