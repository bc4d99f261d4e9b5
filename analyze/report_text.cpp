// The text report: concise (the default: ranks merged, what differs shown)
// and full (every rank, row, finding and frame).
// Longer than 600 lines: the concise and full layouts share their section
// writers.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "report.h"
#include "report_internal.h"

namespace allocscope {

using namespace report_detail;

namespace {

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

// Info findings (who owns memory) listed under a moment; problems are all listed.
constexpr size_t kOomInfoShares = 3;

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

}  // namespace

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
        if (const std::string line = graph_pool_line(a); !line.empty()) out += line + "\n";
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
    if (const std::string line = graph_pool_line(a); !line.empty()) out += "  " + line + "\n";
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

}  // namespace allocscope
