#include "imbalance.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace allocscope {

namespace {

uint64_t median(std::vector<uint64_t> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t mid = v.size() / 2;
    return v.size() % 2 ? v[mid] : v[mid - 1] + (v[mid] - v[mid - 1]) / 2;
}

// One rank's figure and what it is made of, by name.
struct Measure {
    uint64_t bytes = 0;
    std::map<std::string, uint64_t> parts;
};

// Each rank's measure (none where it has no figure), the finding's words.
struct Comparison {
    std::string what;  // "live when step 9 began", "at its peak"
    Severity severity;
    std::vector<std::optional<Measure>> ranks;
};

std::string tag_name(const std::string& layer, const std::string& phase) {
    return (layer.empty() ? std::string("(untagged)") : layer) +
           (phase.empty() ? std::string() : " " + phase);
}

// The owner pool's live bytes when step S began, S the last step every
// rank began: ranks that run in lockstep compared at the same point of
// their work (at exit a rank may have been stopped mid-step). By layer
// group, where its last step is S.
Comparison at_last_common_step(const std::vector<const TraceAnalysis*>& ranks) {
    Comparison c{"", Severity::warning, {}};
    uint64_t step = UINT64_MAX;
    for (const TraceAnalysis* a : ranks) {
        if (a->step_starts.empty()) return c;
        step = std::min(step, a->step_starts.back().first);
    }
    c.what = "live when step " + std::to_string(step) + " began";
    for (const TraceAnalysis* a : ranks) {
        const auto it = std::find_if(a->step_starts.begin(), a->step_starts.end(),
                                     [step](const auto& s) { return s.first == step; });
        if (it == a->step_starts.end()) {
            c.ranks.emplace_back();
            continue;
        }
        Measure m;
        m.bytes = it->second;
        if (a->step_starts.back().first == step) {
            for (const auto& [group, bytes] : a->groups_at_last_step)
                m.parts[group] += bytes;
        }
        c.ranks.push_back(std::move(m));
    }
    return c;
}

Comparison at_peak(const std::vector<const TraceAnalysis*>& ranks) {
    Comparison c{"at its peak", Severity::info, {}};
    for (const TraceAnalysis* a : ranks) {
        const PoolSummary* p = a->pool(a->owner);
        if (!p) {
            c.ranks.emplace_back();
            continue;
        }
        Measure m;
        m.bytes = p->peak_bytes;
        for (const TagStats& t : a->tags)
            if (t.at_peak) m.parts[tag_name(t.layer, t.phase)] += t.at_peak;
        c.ranks.push_back(std::move(m));
    }
    return c;
}

void compare(const Comparison& c, const std::vector<const TraceAnalysis*>& ranks,
             std::vector<Finding>& out) {
    for (size_t r = 0; r < c.ranks.size(); ++r) {
        if (!c.ranks[r]) continue;
        std::vector<uint64_t> others;
        for (size_t o = 0; o < c.ranks.size(); ++o)
            if (o != r && c.ranks[o]) others.push_back(c.ranks[o]->bytes);
        if (others.empty()) continue;
        const uint64_t mine = c.ranks[r]->bytes;
        const uint64_t typical = median(others);
        const auto [lo, hi] = std::minmax_element(others.begin(), others.end());
        if (mine <= typical) continue;
        const uint64_t excess = mine - typical;
        if (excess < kImbalanceMinBytes || double(excess) < kImbalanceShare * double(typical) ||
            excess <= 2 * (*hi - *lo))
            continue;
        // What it holds extra: each part against the other ranks' median.
        std::vector<std::pair<uint64_t, std::string>> extra;
        for (const auto& [name, bytes] : c.ranks[r]->parts) {
            std::vector<uint64_t> theirs;
            for (size_t o = 0; o < c.ranks.size(); ++o) {
                if (o == r || !c.ranks[o]) continue;
                const auto it = c.ranks[o]->parts.find(name);
                theirs.push_back(it == c.ranks[o]->parts.end() ? 0 : it->second);
            }
            const uint64_t usual = median(theirs);
            if (bytes > usual) extra.push_back({bytes - usual, name});
        }
        std::stable_sort(extra.begin(), extra.end(),
                         [](const auto& x, const auto& y) { return x.first > y.first; });
        Finding f;
        f.plugin = kImbalancePlugin;
        f.severity = c.severity;
        f.rank = ranks[r]->header.rank;
        f.bytes = excess;
        f.count = others.size();
        f.summary = "rank " + std::to_string(f.rank) + " holds " + human_bytes(mine) + " " +
                    c.what + ", " + human_bytes(excess) + " more than the median of the " +
                    std::to_string(others.size()) + " other rank(s) (" + human_bytes(typical) + ")";
        if (!extra.empty()) {
            f.layer = extra[0].second;
            f.summary += "; the extra: ";
            for (size_t k = 0; k < extra.size() && k < 3; ++k)
                f.summary += (k ? ", " : "") + extra[k].second + " +" + human_bytes(extra[k].first);
        }
        out.push_back(std::move(f));
    }
}

}  // namespace

std::vector<Finding> imbalance_findings(const std::vector<const TraceAnalysis*>& ranks) {
    std::vector<Finding> out;
    std::vector<const TraceAnalysis*> ranked;
    for (const TraceAnalysis* a : ranks)
        if (a->header.rank >= 0) ranked.push_back(a);
    if (ranked.size() < 2) return out;
    compare(at_last_common_step(ranked), ranked, out);
    compare(at_peak(ranked), ranked, out);
    return out;
}

}  // namespace allocscope
