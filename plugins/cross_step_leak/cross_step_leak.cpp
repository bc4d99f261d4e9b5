// cross-step-leak: live memory at the same point of consecutive steps keeps
// growing.
//
// Live bytes are kept per group (level, layer, phase, stack) incrementally:
// an ALLOC adds to its own tag and stack, a FREE subtracts from the freed
// allocation's (the host's alloc_* fields), so frees on other threads, in
// any order, and reused addresses are all accounted to the right group;
// frees of unknown addresses are ignored. At every step change (on_step, or
// a STEP event of a step not sampled yet: a host does not call on_step for
// the step a stream begins with) each group's live bytes are sampled: the
// same point of every step.
//
// A group is reported when its live bytes rose at each of `steps`
// consecutive step changes (default 3), by at least `min_growth` bytes in
// all (default 0: any growth). State created lazily by the first step (the
// optimizer's moments) rises once and then stays: not a leak. Attribution is
// by (layer, phase, stack); a (layer, phase) whose stack groups do not grow
// one by one (a leak from several call sites in turn, or with stacks off) is
// reported once for the tag when the tag's total grows and none of its
// stack groups was reported. Level: blocks when the stream has block
// events, otherwise segments. The baseline stream of baseline mode is not
// used. Findings are emitted at finish: one per group, its longest growing
// run (the latest among equals), with the group's allocations that were
// alive at the run's last step change and allocated during the run.
#include <allocscope/sdk/adapter.h>
#include <allocscope/sdk/evidence_watch.h>
#include <allocscope/sdk/finding.h>
#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/format.h>
#include <allocscope/sdk/interner.h>
#include <allocscope/sdk/options.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {
namespace {

constexpr std::size_t kEvidence = 8;

struct GroupKey {
    uint32_t level = 0;
    uint32_t layer = 0;
    uint32_t phase = 0;
    uint32_t stack = 0;
    bool whole_tag = false;  // the (layer, phase) total over its stacks
    auto operator<=>(const GroupKey&) const = default;
};

struct GroupKeyHash {
    uint64_t operator()(const GroupKey& k) const noexcept {
        const uint64_t rest = uint64_t(k.stack) << 3 | uint64_t(k.level) << 1 | k.whole_tag;
        return (uint64_t(k.layer) << 32 | k.phase) ^ (rest * 0xff51afd7ed558ccdull);
    }
};

struct Run {
    uint64_t boundaries = 0;  // consecutive step changes with growth
    uint64_t from_bytes = 0, to_bytes = 0;
    uint64_t from_count = 0, to_count = 0;
    uint64_t from_step = 0, to_step = 0;  // steps whose start was sampled
};

struct Group {
    uint64_t bytes = 0;
    uint64_t count = 0;
    bool sampled = false;
    uint64_t last_bytes = 0;
    uint64_t last_count = 0;
    uint64_t last_step = 0;
    Run current;
    Run reported;  // the longest run that qualified; boundaries 0: none
    std::vector<Evidence> evidence;
};

class CrossStepLeak {
  public:
    explicit CrossStepLeak(const allocscope_host_v2& host)
        : host_(host),
          steps_(option_count(host, "steps", 3, 1, 1000000)),
          min_growth_(option_bytes(host, "min_growth", 0)) {}

    void on_event(const allocscope_event_v2& e) {
        if (e.source != ALLOCSCOPE_SOURCE_RUN) return;
        if (e.kind == ALLOCSCOPE_EVENT_STEP) {
            sample(e.step);
            return;
        }
        if (e.level != ALLOCSCOPE_LEVEL_BLOCK && e.level != ALLOCSCOPE_LEVEL_SEGMENT) return;
        if (e.kind == ALLOCSCOPE_EVENT_ALLOC) {
            if (e.level == ALLOCSCOPE_LEVEL_BLOCK) saw_block_ = true;
            const uint32_t layer = strings_.tag(e.layer), phase = strings_.tag(e.phase);
            add(group({e.level, layer, phase, e.stack_id, false}), e.size, 1);
            add(group({e.level, layer, phase, 0, true}), e.size, 1);
        } else if (e.kind == ALLOCSCOPE_EVENT_FREE && e.alloc_seq != 0) {
            watch_.on_free(e.alloc_seq, e.seq);
            const uint32_t layer = strings_.tag(e.alloc_layer);
            const uint32_t phase = strings_.tag(e.alloc_phase);
            sub(group({e.level, layer, phase, e.alloc_stack_id, false}), e.size);
            sub(group({e.level, layer, phase, 0, true}), e.size);
        }
    }

    void on_step(uint64_t step, uint32_t source) {
        if (source == ALLOCSCOPE_SOURCE_RUN) sample(step);
    }

    void sample(uint64_t step) {
        if (any_step_ && step == previous_step_) return;  // sampled already
        std::vector<std::pair<const GroupKey*, Group*>> grown;
        for (auto& [key, g] : groups_) {
            if (!g.sampled) {
                g.sampled = true;
                if (any_step_) {
                    // Born during the last step: it grew from nothing.
                    g.last_bytes = 0;
                    g.last_count = 0;
                    g.last_step = previous_step_;
                } else {
                    // Allocated before the first step (initialization): the
                    // first sample is where it starts.
                    g.last_bytes = g.bytes;
                    g.last_count = g.count;
                    g.last_step = step;
                }
            }
            if (g.bytes > g.last_bytes) {
                if (g.current.boundaries == 0) {
                    g.current.from_bytes = g.last_bytes;
                    g.current.from_count = g.last_count;
                    g.current.from_step = g.last_step;
                }
                ++g.current.boundaries;
                g.current.to_bytes = g.bytes;
                g.current.to_count = g.count;
                g.current.to_step = step;
                if (g.current.boundaries >= steps_ &&
                    g.current.to_bytes - g.current.from_bytes >= min_growth_ &&
                    g.current.boundaries >= g.reported.boundaries) {
                    g.reported = g.current;
                    grown.emplace_back(&key, &g);
                }
            } else {
                g.current = {};
            }
            g.last_bytes = g.bytes;
            g.last_count = g.count;
            g.last_step = step;
        }
        if (!grown.empty()) collect_evidence(grown);
        previous_step_ = step;
        any_step_ = true;
    }

    void finish() {
        const uint32_t level = saw_block_ ? ALLOCSCOPE_LEVEL_BLOCK : ALLOCSCOPE_LEVEL_SEGMENT;
        // Tags with a reported stack group: their tag total is not reported.
        std::map<std::pair<uint32_t, uint32_t>, bool> tag_reported;
        for (const auto& [key, g] : groups_) {
            if (key.level == level && !key.whole_tag && g.reported.boundaries > 0) {
                tag_reported[{key.layer, key.phase}] = true;
            }
        }
        for (const auto& [key, g] : groups_) {
            if (key.level != level || g.reported.boundaries == 0) continue;
            if (key.whole_tag && tag_reported.count({key.layer, key.phase})) continue;
            const Run& r = g.reported;
            const std::string& layer = strings_.text(key.layer);
            const std::string& phase = strings_.text(key.phase);
            Finding f;
            f.layer = layer;
            f.phase = phase;
            f.bytes = r.to_bytes - r.from_bytes;
            f.count = r.to_count > r.from_count ? r.to_count - r.from_count : 0;
            const std::string who =
                (layer.empty() ? std::string("(untagged)") : layer + " " + phase) +
                (key.whole_tag ? std::string(" (all stacks)")
                               : " (stack " + std::to_string(key.stack) + ")");
            f.summary = who + ": live " +
                        std::string(level == ALLOCSCOPE_LEVEL_BLOCK ? "block" : "segment") +
                        " bytes grew at " + std::to_string(r.boundaries) +
                        " consecutive step changes, " + format_bytes(r.from_bytes) +
                        " at the start of step " + std::to_string(r.from_step) + " to " +
                        format_bytes(r.to_bytes) + " at the start of step " +
                        std::to_string(r.to_step) + " (+" + format_bytes(f.bytes) + ")";
            f.evidence = g.evidence;
            watch_.fill(f.evidence);
            emit(host_, f);
        }
    }

  private:
    // Groups live in an ordered map (findings come out in key order); the
    // per-event lookup goes through a hash index of it.
    Group& group(const GroupKey& key) {
        Group*& g = index_[key];
        if (!g) g = &groups_[key];
        return *g;
    }
    static void add(Group& g, uint64_t size, uint64_t n) {
        g.bytes += size;
        g.count += n;
    }
    static void sub(Group& g, uint64_t size) {
        g.bytes -= std::min(g.bytes, size);
        g.count -= std::min<uint64_t>(g.count, 1);
    }

    // The groups' live allocations made since their run began (newest
    // first), from the host's live table: one pass for all grown groups.
    void collect_evidence(const std::vector<std::pair<const GroupKey*, Group*>>& grown) {
        struct Visit {
            CrossStepLeak* self;
            const std::vector<std::pair<const GroupKey*, Group*>>* grown;
            std::map<Group*, std::vector<Evidence>> found;
        } visit{this, &grown, {}};
        host_.live_foreach(
            host_.ctx, 0,
            [](void* user, const allocscope_live_v2* l) {
                auto& v = *static_cast<Visit*>(user);
                const uint32_t layer = v.self->strings_.tag(l->layer);
                const uint32_t phase = v.self->strings_.tag(l->phase);
                for (const auto& [key, g] : *v.grown) {
                    if (key->level != l->level || key->layer != layer || key->phase != phase ||
                        (!key->whole_tag && key->stack != l->stack_id) ||
                        l->step < g->reported.from_step) {
                        continue;
                    }
                    v.found[g].push_back(
                        {l->size, l->layer, l->phase, l->step, l->alloc_seq, 0, l->stack_id, ""});
                }
                return 0;
            },
            &visit);
        for (const auto& [key, g] : grown) {
            std::vector<Evidence>& ev = visit.found[g];
            std::sort(ev.begin(), ev.end(), [](const Evidence& a, const Evidence& b) {
                return a.alloc_seq > b.alloc_seq;
            });
            if (ev.size() > kEvidence) ev.resize(kEvidence);
            watch_.hold(ev);
            watch_.release(g->evidence);
            g->evidence = std::move(ev);
        }
    }

    const allocscope_host_v2& host_;
    uint64_t steps_;
    uint64_t min_growth_;
    Interner strings_;
    std::map<GroupKey, Group> groups_;
    FlatMap<GroupKey, Group*, GroupKeyHash> index_;
    bool saw_block_ = false;
    bool any_step_ = false;
    uint64_t previous_step_ = 0;
    EvidenceWatch watch_;
};

}  // namespace
}  // namespace allocscope::plugins

ALLOCSCOPE_DEFINE_PLUGIN(
    allocscope::plugins::CrossStepLeak, "cross-step-leak",
    "live memory at the start of consecutive steps keeps growing, attributed by (layer, phase, "
    "stack)",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_STEP));
