// peak-owner: who owns memory at the peak.
//
// Per level (blocks; segments when there are any), live bytes are kept per
// owner group incrementally: by tag (layer, phase), by phase (the base phase
// over every layer: "optimizer" owns the moments of all parameters, however
// finely they are tagged) and by stack. Every
// ALLOC that raises the level's live bytes above its peak makes a new peak;
// the groups' state at that moment is the state just before the next FREE
// (every ALLOC in between raises the peak again), so the snapshot is taken
// there, lazily, and copies only the groups touched since the previous
// snapshot, exact at the peak. A snapshot also picks each touched group's
// biggest live allocations as evidence (a scan of the group's; adding or
// removing an allocation is O(1), nothing is kept ordered per event). A
// free of an allocation made before the stream began changes nothing.
//
// At finish, per level, the `top` (default 10) groups by bytes at the peak
// of each kind (tag, phase, stack) become info findings: bytes and allocations at
// the peak, their share of it, and the biggest allocations (free_seq says
// when each was freed after the peak, 0 if alive at the end). The baseline
// stream of baseline mode is not used.
#include <allocscope/sdk/adapter.h>
#include <allocscope/sdk/evidence_watch.h>
#include <allocscope/sdk/finding.h>
#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/format.h>
#include <allocscope/sdk/interner.h>
#include <allocscope/sdk/options.h>
#include <allocscope/sdk/tag_rules.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {
namespace {

constexpr std::size_t kEvidence = 5;

struct Allocation {
    uint64_t size = 0;
    uint64_t seq = 0;
    uint64_t step = 0;
    uint32_t stack = 0;
    uint32_t layer = 0;
    uint32_t phase = 0;
    // Biggest first, then oldest.
    bool operator<(const Allocation& o) const {
        return size != o.size ? size > o.size : seq < o.seq;
    }
};

// A base phase's interned id (a type of its own: groups are keyed by it).
struct PhaseKey {
    uint32_t id = 0;
    auto operator<=>(const PhaseKey&) const = default;
};

// The three kinds of owner group an allocation belongs to.
enum Kind { kTag, kPhase, kStack, kKinds };

// A live allocation of a group: its size and seq (to rank it) and where the
// allocation's record is.
struct Member {
    uint64_t size = 0;
    uint64_t seq = 0;
    uint32_t slot = 0;
};

struct Group {
    uint64_t bytes = 0;
    std::vector<Member> live;  // unordered; each record knows its position
    bool dirty = false;
    // At the last snapshot.
    uint64_t peak_bytes = 0;
    uint64_t peak_count = 0;
    std::vector<Allocation> peak_top;
};

// A live allocation of the stream, in a slab (slots are reused).
struct Record {
    Allocation a;
    Group* groups[kKinds] = {};
    uint32_t position[kKinds] = {};  // in each group's `live`
};

struct Level {
    uint64_t live = 0;
    uint64_t peak = 0;
    uint64_t peak_seq = 0;
    uint64_t peak_step = 0;
    bool pending = false;  // a new peak not yet snapshotted
    bool seen = false;
    // Ordered, for the report; found per event through hash indexes.
    std::map<std::pair<uint32_t, uint32_t>, Group> tags;
    std::map<PhaseKey, Group> phases;
    std::map<uint32_t, Group> stacks;
    FlatMap<uint64_t, Group*> index[kKinds];
    std::vector<Group*> dirty;
    std::vector<Record> slab;
    std::vector<uint32_t> free_slots;
    FlatMap<uint64_t, uint32_t> by_seq;  // live allocation -> slab slot
};

class PeakOwner {
  public:
    explicit PeakOwner(const allocscope_host_v2& host)
        : host_(host), top_(option_count(host, "top", 10, 1, 100000)) {}

    void on_event(const allocscope_event_v2& e) {
        if (e.source != ALLOCSCOPE_SOURCE_RUN) return;
        Level* l = level(e.level);
        if (!l) return;
        if (e.kind == ALLOCSCOPE_EVENT_ALLOC) {
            l->seen = true;
            add(*l,
                {e.size, e.seq, e.step, e.stack_id, strings_.tag(e.layer), strings_.tag(e.phase)});
            l->live += e.size;
            if (l->live > l->peak) {
                l->peak = l->live;
                l->peak_seq = e.seq;
                l->peak_step = e.step;
                l->pending = true;
            }
        } else if (e.kind == ALLOCSCOPE_EVENT_FREE && e.alloc_seq != 0) {
            if (l->pending) snapshot(*l);
            watch_.on_free(e.alloc_seq, e.seq);
            const uint32_t* slot = l->by_seq.find(e.alloc_seq);
            if (!slot) return;  // allocated before the stream
            remove(*l, *slot);
            l->live -= std::min(l->live, e.size);
        }
    }

    void on_step(uint64_t, uint32_t) {}

    void finish() {
        report(blocks_, "block");
        report(segments_, "segment");
    }

  private:
    Level* level(uint32_t level) {
        return level == ALLOCSCOPE_LEVEL_BLOCK     ? &blocks_
               : level == ALLOCSCOPE_LEVEL_SEGMENT ? &segments_
                                                   : nullptr;
    }

    // The group of `kind` that `a` belongs to.
    Group& group(Level& l, Kind kind, const Allocation& a) {
        const uint32_t phase = kind == kPhase ? strings_.base_phase(a.phase) : a.phase;
        const uint64_t key = kind == kTag     ? uint64_t(a.layer) << 32 | phase
                             : kind == kPhase ? phase
                                              : a.stack;
        Group*& g = l.index[kind][key];
        if (!g) {
            g = kind == kTag     ? &l.tags[{a.layer, phase}]
                : kind == kPhase ? &l.phases[PhaseKey{phase}]
                                 : &l.stacks[a.stack];
        }
        return *g;
    }

    static void touch(Level& l, Group& g) {
        if (!g.dirty) {
            g.dirty = true;
            l.dirty.push_back(&g);
        }
    }

    void add(Level& l, const Allocation& a) {
        uint32_t slot;
        if (!l.free_slots.empty()) {
            slot = l.free_slots.back();
            l.free_slots.pop_back();
        } else {
            slot = uint32_t(l.slab.size());
            l.slab.emplace_back();
        }
        l.by_seq[a.seq] = slot;
        Record& r = l.slab[slot];
        r.a = a;
        for (int k = 0; k < kKinds; ++k) {
            Group& g = group(l, Kind(k), a);
            touch(l, g);
            g.bytes += a.size;
            r.groups[k] = &g;
            r.position[k] = uint32_t(g.live.size());
            g.live.push_back({a.size, a.seq, slot});
        }
    }

    void remove(Level& l, uint32_t slot) {
        Record& r = l.slab[slot];
        for (int k = 0; k < kKinds; ++k) {
            Group& g = *r.groups[k];
            touch(l, g);
            g.bytes -= r.a.size;
            const uint32_t at = r.position[k];
            if (at + 1 != g.live.size()) {
                g.live[at] = g.live.back();
                l.slab[g.live[at].slot].position[k] = at;
            }
            g.live.pop_back();
        }
        l.by_seq.erase(r.a.seq);
        l.free_slots.push_back(slot);
    }

    // The groups touched since the last snapshot take their current state:
    // with the untouched ones, the state at the peak.
    void snapshot(Level& l) {
        for (Group* g : l.dirty) {
            for (const Allocation& a : g->peak_top)
                watch_.release(a.seq);
            g->peak_bytes = g->bytes;
            g->peak_count = g->live.size();
            // Its biggest allocations, biggest first, then oldest.
            const auto bigger = [](const Member& a, const Member& b) {
                return a.size != b.size ? a.size > b.size : a.seq < b.seq;
            };
            top_members_.clear();
            for (const Member& m : g->live) {
                if (top_members_.size() == kEvidence && !bigger(m, top_members_.back())) continue;
                if (top_members_.size() == kEvidence) top_members_.pop_back();
                top_members_.insert(
                    std::upper_bound(top_members_.begin(), top_members_.end(), m, bigger), m);
            }
            g->peak_top.clear();
            for (const Member& m : top_members_) {
                g->peak_top.push_back(l.slab[m.slot].a);
                watch_.hold(m.seq);
            }
            g->dirty = false;
        }
        l.dirty.clear();
        l.pending = false;
    }

    template <typename Key>
    void report_groups(const Level& l, const std::map<Key, Group>& groups, const char* what) {
        std::vector<std::pair<const Key*, const Group*>> order;
        for (const auto& [key, g] : groups) {
            if (g.peak_bytes > 0) order.emplace_back(&key, &g);
        }
        std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
            return a.second->peak_bytes > b.second->peak_bytes;
        });
        if (order.size() > top_) order.resize(top_);
        for (std::size_t rank = 0; rank < order.size(); ++rank) {
            const Group& g = *order[rank].second;
            Finding f;
            f.severity = ALLOCSCOPE_SEVERITY_INFO;
            // A stack group is attributed to the tag of its biggest
            // allocation at the peak.
            const Allocation& biggest = g.peak_top.front();
            f.layer = strings_.text(biggest.layer);
            f.phase = strings_.text(biggest.phase);
            f.bytes = g.peak_bytes;
            f.count = g.peak_count;
            std::string owner = tag_text(f.layer, f.phase);
            if constexpr (std::is_same_v<Key, uint32_t>) {
                const uint32_t stack = *order[rank].first;
                owner = (stack ? "stack " + std::to_string(stack) : std::string("no stack")) +
                        " (biggest: " + owner + ")";
            } else if constexpr (std::is_same_v<Key, PhaseKey>) {
                // Attributed to the phase, not to one layer of it.
                f.layer.clear();
                f.phase = strings_.text(order[rank].first->id);
                owner = (f.phase.empty() ? std::string("(no phase)") : f.phase) + " (every layer)";
            }
            char share[32];
            std::snprintf(share, sizeof share, "%.1f%%",
                          100.0 * double(g.peak_bytes) / double(l.peak));
            f.summary = std::string("#") + std::to_string(rank + 1) + " by " + what + " at the " +
                        level_name_ + " peak of " + format_bytes(l.peak) + " (step " +
                        std::to_string(l.peak_step) + ", seq " + std::to_string(l.peak_seq) +
                        "): " + owner + " owns " + format_bytes(g.peak_bytes) + " (" + share +
                        ") in " + std::to_string(g.peak_count) + " allocations";
            for (const Allocation& a : g.peak_top) {
                f.evidence.push_back({a.size, strings_.text(a.layer), strings_.text(a.phase),
                                      a.step, a.seq, 0, a.stack, ""});
            }
            watch_.fill(f.evidence);
            emit(host_, f);
        }
    }

    static std::string tag_text(const std::string& layer, const std::string& phase) {
        if (layer.empty() && phase.empty()) return "(untagged)";
        return (layer.empty() ? std::string("(no layer)") : layer) + " " +
               (phase.empty() ? std::string("(no phase)") : phase);
    }

    void report(Level& l, const char* name) {
        if (!l.seen || l.peak == 0) return;
        if (l.pending) snapshot(l);
        level_name_ = name;
        report_groups(l, l.tags, "tag");
        report_groups(l, l.phases, "phase");
        report_groups(l, l.stacks, "stack");
    }

    const allocscope_host_v2& host_;
    uint64_t top_;
    Interner strings_;
    std::vector<Member> top_members_;
    Level blocks_;
    Level segments_;
    EvidenceWatch watch_;
    std::string level_name_;
};

}  // namespace
}  // namespace allocscope::plugins

ALLOCSCOPE_DEFINE_PLUGIN(
    allocscope::plugins::PeakOwner, "peak-owner",
    "who owns memory at the peak of live block (and segment) bytes: the top groups by (layer, "
    "phase) and by stack",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE));
