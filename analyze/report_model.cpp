// What every rendering of a Report shares (analyze/report.h): the
// out-of-memory moment's lines and shares, the self-check's lines, the
// timeline's shown bands and steps, merged tags, findings grouped across
// ranks, and stacks folded to the program's frames.
// Longer than 600 lines: what the text, JSON and HTML reports must say alike
// is kept in one place.
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

namespace report_detail {

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

std::string u(uint64_t v) {
    return std::to_string(v);
}

std::string share_line(const OomShare& s, const OomMoment& m) {
    return std::string(to_string(s.finding->severity)) + " " + printable(s.finding->plugin) + " (" +
           tag_text(s.finding->layer, s.finding->phase) + ") held " + human_bytes(s.bytes) +
           " of the " +
           (m.allocated_known ? human_bytes(m.allocated) + " allocated"
                              : human_bytes(m.reserved) + " reserved") +
           ", in " + u(s.count) + " allocation(s)";
}

std::string signed_bytes(uint64_t ours, uint64_t theirs) {
    return ours >= theirs ? "+" + human_bytes(ours - theirs) : "-" + human_bytes(theirs - ours);
}

}  // namespace report_detail

using namespace report_detail;

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

// The blocks of CUDA graphs' private pools, in one line; "" when none.
std::string graph_pool_line(const TraceAnalysis& a) {
    const Replay::GraphPoolTotals& g = a.graph_pools;
    if (g.allocations == 0) return {};
    return "CUDA graph pools: " + u(g.allocations) + " blocks (" + human_bytes(g.allocated_bytes) +
           "), at most " + human_bytes(g.peak_bytes) + " live at once, " +
           human_bytes(g.live_bytes) + " in " + u(g.live_count) +
           " at exit; held by the graphs for replay, part of the blocks above, never judged by "
           "the detectors";
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
    std::vector<std::string> where;
    if (!m.parameter.empty())
        where.push_back(m.parameter_count > 1
                            ? "processing " + u(m.parameter_count) +
                                  " parameters together, the first " + printable(m.parameter)
                            : "processing parameter " + printable(m.parameter));
    if (!m.last_layer.empty())
        where.push_back("after " + tag_text(m.last_layer, m.last_phase) +
                        ", the last layer tagged");
    for (size_t i = 0; i < where.size(); ++i)
        line += (i == 0 ? " (" : "; ") + where[i] + (i + 1 == where.size() ? ")" : "");
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
