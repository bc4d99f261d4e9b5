// The analysis of one trace (analyze/analysis.h): one streamed pass per
// question over the events (the live set, peaks, sites, tags, timeline,
// out-of-memory moments, the self-check against the allocator's counters).
// Longer than 600 lines: the passes share the live-set rules of one replay
// and are kept beside each other so that they count alike.
#include "analysis.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include <allocscope/allocscope.h>
#include <allocscope/sdk/flat_map.h>

#include "diff.h"
#include "segment_owners.h"
#include "trace_bound.h"

namespace allocscope {

namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

// An owner-pool allocation, live.
struct Live {
    uint64_t size = 0;
    uint32_t tag = kNone;    // index into the tag table
    uint32_t group = kNone;  // index into the layer groups
    uint32_t stack = 0;
    uint64_t seq = 0;  // of its allocation
    uint64_t step = 0;
};

// A tag scope open on a thread, in a slot of its own while open.
struct Scope {
    uint32_t tag = kNone;
    uint32_t id = kNone;  // the count of pushes before its; kNone: the slot is free
    uint64_t live = 0;    // bytes allocated directly in it, still alive
};

// One stack's allocations in the owner pool under one tag: all of them
// (`total`), and those live, now and at the latest of the pool's peaks so
// far. The first pass keeps the latter as it goes instead of replaying to
// the peak again: a new peak costs one increment of the pass's peak count,
// a change one comparison, for a site saves what it held the first time
// it changes after a peak (`peak`: the peak count then). A site first seen
// after the latest peak held nothing then.
struct TagSite {
    StackBytes total;
    uint64_t bytes = 0, count = 0;
    uint64_t bytes_then = 0, count_then = 0;
    uint64_t peak = 0;
};

// Ids of the trace's tags and layer groups, and the owner pool's live
// allocations; both passes share it.
class Tables {
  public:
    explicit Tables(const TraceTables& t) : trace_(t), group_of_layer_(t.strings.size(), kNone) {}

    uint32_t tag(uint32_t layer, uint32_t phase) {
        // Events come in runs of one tag: the last one is kept at hand.
        const uint64_t key = uint64_t(layer) << 32 | phase;
        if (last_tag_ != kNone && key == last_key_) return last_tag_;
        return tag_of(key);
    }
    uint32_t group(uint32_t layer) {
        // Inline where the layer's group is known, as it is but the first time.
        if (layer < group_of_layer_.size() && group_of_layer_[layer] != kNone)
            return group_of_layer_[layer];
        return new_group(layer);
    }

    std::vector<TagStats> tags;
    std::vector<std::string> groups;

  private:
    [[gnu::noinline]] uint32_t tag_of(uint64_t key) {
        uint32_t& index = tag_ids_[key];
        if (index == 0) {
            TagStats s;
            s.layer = trace_.str(uint32_t(key >> 32));
            s.phase = trace_.str(uint32_t(key));
            tags.push_back(std::move(s));
            index = uint32_t(tags.size());  // 1-based: 0 marks a new entry
        }
        last_key_ = key;
        last_tag_ = index - 1;
        return last_tag_;
    }
    [[gnu::noinline]] uint32_t new_group(uint32_t layer) {
        // A first pass's table grows as the events go.
        if (layer >= group_of_layer_.size() && layer < trace_.strings.size())
            group_of_layer_.resize(trace_.strings.size(), kNone);
        if (layer >= group_of_layer_.size()) return group_name("(untagged)");
        uint32_t& g = group_of_layer_[layer];
        if (g == kNone) g = group_name(layer_group(trace_.str(layer)));
        return g;
    }
    uint32_t group_name(const std::string& name) {
        auto [it, added] = group_ids_.try_emplace(name, uint32_t(groups.size()));
        if (added) groups.push_back(name);
        return it->second;
    }
    const TraceTables& trace_;
    FlatMap<uint64_t, uint32_t> tag_ids_;
    uint64_t last_key_ = 0;
    uint32_t last_tag_ = kNone;
    std::vector<uint32_t> group_of_layer_;
    std::unordered_map<std::string, uint32_t> group_ids_;
};

// The owner pool's live allocations: a view of the replay's table for that
// pool (the one live set, core/replay.h), each with its tag, layer group and
// the scope it was made in. The scope is the record's note in the table
// (Replay::note: no map of its own), entered and left as the replay
// reports the allocation's changes.
class OwnerLive {
  public:
    OwnerLive(Replay& replay, Pool owner, Tables& tables)
        : replay_(replay), owner_(owner), tables_(&tables) {}
    Pool owner() const noexcept { return owner_; }
    // The record's row.
    Live live_of(const LiveRecord& r) const {
        Live l;
        l.size = r.size;
        l.tag = tables_->tag(r.layer, r.phase);
        l.group = tables_->group(r.layer);
        l.stack = r.stack;
        l.seq = r.seq;
        l.step = r.step;
        return l;
    }
    // The scope of the allocation a change made (its note; 0: none).
    void entered(const LiveChange& c, uint64_t scope_note) {
        replay_.set_note(owner_, c.index, scope_note);
    }
    // An allocation released (or replaced: its record `r` shared the
    // change's index): its layer group and the note of the scope it was
    // made in.
    std::pair<uint32_t, uint64_t> leave(const LiveRecord& r, const LiveChange& c) const {
        return {tables_->group(r.layer), replay_.note(owner_, c.index)};
    }
    template <class F>
    void for_each(F&& f) const {
        replay_.table(owner_).any_of([&](const LiveRecord& r) {
            f(live_of(r));
            return false;
        });
    }

  private:
    Replay& replay_;
    Pool owner_;
    Tables* tables_;
};

// An owner-pool allocation as a timeline sample names it.
struct KeptAllocation {
    uint64_t size = 0, seq = 0, step = 0;
    uint32_t stack = 0, layer = 0, phase = 0;

    static KeptAllocation of(const LiveRecord& r) noexcept {
        return {r.size, r.seq, r.step, r.stack, r.layer, r.phase};
    }
    // Largest first, the older first among equals.
    static bool larger(const KeptAllocation& x, const KeptAllocation& y) noexcept {
        return x.size != y.size ? x.size > y.size : x.seq < y.seq;
    }
};

// Into `top`, largest first, `keep` at most.
void add_bounded(std::vector<KeptAllocation>& top, const KeptAllocation& x, size_t keep) {
    if (top.size() >= keep && !KeptAllocation::larger(x, top.back())) return;
    top.insert(std::upper_bound(top.begin(), top.end(), x, KeptAllocation::larger), x);
    if (top.size() > keep) top.pop_back();
}

// One layer group's largest live owner-pool allocations, largest first: the
// first `cap` of them at most, so that a sample reads its largest without
// a pass over everything live, and no node is allocated per allocation.
// What is kept is always the group's largest that many: an allocation
// enters when it is larger than the last one kept (or all of the group's
// are kept); one freed leaves; where fewer are kept than a sample needs
// while the group has more, one scan of the live set refills them (stale,
// start_refill, refill).
class LargestLive {
  public:
    explicit LargestLive(size_t cap) : cap_(cap) {}

    void insert(const LiveRecord& r) {
        const bool all = top_.size() == count_;
        ++count_;
        const KeptAllocation x = KeptAllocation::of(r);
        if (!top_.empty() && KeptAllocation::larger(x, top_.back())) {
            add_bounded(top_, x, cap_);
        } else if (all && top_.size() < cap_) {
            top_.push_back(x);  // the smallest of the group
        }
    }
    void erase(const LiveRecord& r) {
        --count_;
        // One ranked below the smallest kept is not kept.
        if (top_.empty() || KeptAllocation::larger(top_.back(), KeptAllocation::of(r))) return;
        for (auto it = top_.begin(); it != top_.end(); ++it) {
            if (it->seq == r.seq) {
                top_.erase(it);
                return;
            }
        }
    }
    // Fewer than `keep` kept while the group has more.
    bool stale(size_t keep) const noexcept { return top_.size() < keep && top_.size() < count_; }
    // Where stale: forget what is kept, then refill(r) every live record of
    // the group.
    void start_refill(size_t keep) {
        refilling_ = stale(keep);
        if (refilling_) top_.clear();
    }
    void refill(const LiveRecord& r) {
        if (refilling_) add_bounded(top_, KeptAllocation::of(r), cap_);
    }
    const std::vector<KeptAllocation>& top() const noexcept { return top_; }
    size_t count() const noexcept { return count_; }

  private:
    size_t cap_;
    size_t count_ = 0;  // the group's live allocations
    bool refilling_ = false;
    std::vector<KeptAllocation> top_;
};

// Each layer group's largest live owner-pool allocations at each timeline
// sample, kept in the accounting pass itself. A sample's moment is known
// only when its stretch ends (a later, larger total takes its place), so
// each group keeps its largest live allocations as they change
// (LargestLive), and since the latest candidate moment only which groups
// changed and, per group, the largest of the allocations older than the
// moment that were released since. When the stretch ends, a group's
// largest at the moment are then the largest of: its kept ones older than
// the moment and its released ones, wherever no allocation it did not
// keep could rank among them; else, and for a group whose kept ones were
// too few at the moment, of one scan of the live set (those older than
// the moment) and its released ones. At most one scan per sample, as a
// second pass over the trace took; it refills the groups whose kept ones
// are too few.
class MomentLargest {
  public:
    using Kept = KeptAllocation;
    // A sample's largest: (group, index into named()) for up to `keep` per
    // group that had any, largest first; an allocation named at many
    // samples is kept once.
    using Sample = std::vector<std::pair<uint32_t, uint32_t>>;

    explicit MomentLargest(size_t keep) : keep_(keep) {}

    void alloc(uint32_t g, const LiveRecord& r) {
        touch(g);
        groups_[g].cache.insert(r);
    }
    void release(uint32_t g, const LiveRecord& r) {
        Group& group = touch(g);
        group.cache.erase(r);
        if (r.seq <= moment_seq_) add_bounded(group.released, Kept::of(r), keep_);
    }
    // A candidate moment: after event `seq`, the largest total so far in
    // the current stretch.
    void moment(uint64_t seq) noexcept {
        ++moment_;
        moment_seq_ = seq;
    }
    // The stretch ended: its sample is the latest moment. `live` calls
    // f(record) for each live record of the owner pool; `group` gives a
    // record's group.
    template <class ForEachLive, class GroupOf>
    void finish(ForEachLive&& live, GroupOf&& group_of) {
        // Made in a buffer kept from sample to sample, then kept at its size.
        Sample& sample = sample_;
        sample.clear();
        find(sample, live, group_of);
        samples_.push_back(sample);
    }
    const std::vector<Sample>& samples() const noexcept { return samples_; }
    const std::vector<Kept>& named() const noexcept { return named_; }

  private:
    // The latest moment's largest of each group, into `sample`.
    template <class ForEachLive, class GroupOf>
    void find(Sample& sample, ForEachLive&& live, GroupOf&& group_of) {
        std::vector<uint32_t> scan;  // groups whose largest need the live set
        for (uint32_t g = 0; g < groups_.size(); ++g) {
            Group& group = groups_[g];
            const bool changed = group.mark == moment_;
            if (!changed && group.cache.count() == 0) continue;
            best_.clear();
            if (!exact_from_cache(group, changed, best_)) {
                scan.push_back(g);
                continue;
            }
            add_to(sample, g, best_);
        }
        bool stale = false;
        for (const Group& group : groups_)
            stale |= group.cache.stale(keep_);
        if (scan.empty() && !stale) return;
        // One scan: the groups' largest older than the moment, and the
        // groups now short of kept ones refilled.
        std::vector<std::vector<Kept>> found(scan.size());
        std::vector<int32_t> slot(groups_.size(), -1);
        for (size_t k = 0; k < scan.size(); ++k)
            slot[scan[k]] = int32_t(k);
        for (Group& group : groups_)
            group.cache.start_refill(keep_);
        live([&](const LiveRecord& r) {
            const uint32_t g = group_of(r);
            if (g >= groups_.size()) return;
            groups_[g].cache.refill(r);
            if (slot[g] >= 0 && r.seq <= moment_seq_)
                add_bounded(found[size_t(slot[g])], Kept::of(r), keep_);
        });
        for (size_t k = 0; k < scan.size(); ++k) {
            const Group& group = groups_[scan[k]];
            if (group.mark == moment_) {
                for (const Kept& x : group.released)
                    add_bounded(found[k], x, keep_);
            }
            add_to(sample, scan[k], found[k]);
        }
    }
    void add_to(Sample& sample, uint32_t g, const std::vector<Kept>& best) {
        for (const Kept& x : best) {
            uint32_t index;
            if (const uint32_t* known = index_.find(x.seq)) {
                index = *known;
            } else {
                index = uint32_t(named_.size());
                named_.push_back(x);
                index_[x.seq] = index;
            }
            sample.emplace_back(g, index);
        }
    }
    struct Group {
        explicit Group(size_t cap) : cache(cap) {}
        LargestLive cache;
        uint64_t mark = 0;           // the moment it last changed after
        std::vector<Kept> released;  // since then, older than the moment
    };
    Group& touch(uint32_t g) {
        if (g >= groups_.size()) add_groups(g);
        Group& group = groups_[g];
        if (group.mark != moment_) {
            group.mark = moment_;
            group.released.clear();
        }
        return group;
    }
    [[gnu::noinline]] void add_groups(uint32_t g) {
        groups_.resize(g + 1, Group(std::max<size_t>(2 * keep_, 8)));
    }
    // The group's largest at the moment from what it keeps, where they
    // are certain to be: none it does not keep (all smaller than its
    // smallest kept) could rank among them.
    bool exact_from_cache(const Group& group, bool changed, std::vector<Kept>& best) const {
        const std::vector<Kept>& top = group.cache.top();
        const bool all = top.size() == group.cache.count();
        if (!changed) {
            // As it was at the moment.
            if (group.cache.stale(keep_)) return false;
            best.assign(top.begin(), top.begin() + std::ptrdiff_t(std::min(keep_, top.size())));
            return true;
        }
        for (const Kept& x : top) {
            if (x.seq <= moment_seq_) add_bounded(best, x, keep_);
        }
        for (const Kept& x : group.released)
            add_bounded(best, x, keep_);
        if (all) return true;
        // Those not kept rank below the smallest kept one.
        if (top.empty() || best.size() < keep_) return false;
        return !Kept::larger(top.back(), best.back());
    }

    size_t keep_;
    uint64_t moment_ = 0, moment_seq_ = 0;
    std::vector<Group> groups_;
    std::vector<Sample> samples_;
    std::vector<Kept> named_;            // each once
    FlatMap<uint64_t, uint32_t> index_;  // by seq, into named_
    std::vector<Kept> best_;             // finish's, for one group at a time
    Sample sample_;                      // finish's, the sample being made
};

// The `top` sites with the most live bytes, of the rows that
// rows(add) gives as add(stack, tag, bytes, count): one per live allocation,
// or per (stack, tag) with what it holds.
template <class Rows>
std::vector<Site> top_sites_of(const TraceTables& t, const Tables& tables, size_t top,
                               Rows&& rows) {
    struct Acc {
        uint64_t bytes = 0, count = 0;
        std::map<uint32_t, uint64_t> by_tag;
    };
    std::map<uint32_t, Acc> by_stack;
    rows([&](uint32_t stack, uint32_t tag, uint64_t bytes, uint64_t count) {
        Acc& a = by_stack[stack];
        a.bytes += bytes;
        a.count += count;
        a.by_tag[tag] += bytes;
    });
    std::vector<Site> out;
    for (const auto& [stack, a] : by_stack) {
        Site s;
        s.stack = stack < t.stacks.size() ? stack : 0;
        s.bytes = a.bytes;
        s.count = a.count;
        uint32_t best = kNone;
        uint64_t best_bytes = 0;
        for (const auto& [tag, bytes] : a.by_tag) {
            if (bytes > best_bytes) best = tag, best_bytes = bytes;
        }
        if (best != kNone && best < tables.tags.size()) {
            s.layer = tables.tags[best].layer;
            s.phase = tables.tags[best].phase;
        }
        out.push_back(std::move(s));
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const Site& a, const Site& b) { return a.bytes > b.bytes; });
    if (out.size() > top) out.resize(top);
    return out;
}

std::vector<Site> top_sites(const TraceTables& t, const Tables& tables, const OwnerLive& live,
                            size_t top) {
    return top_sites_of(t, tables, top, [&](auto&& add) {
        live.for_each([&](const Live& l) { add(l.stack, l.tag, l.size, uint64_t{1}); });
    });
}

// The out-of-memory episodes of a trace (analysis.h, OomMoment): the
// index of each moment's event, and the failures recovered from.
struct OomSeed {
    size_t index = 0;
    bool by_allocator = false;
    bool continued = false;
    uint64_t failed_calls = 0;
};
struct OomSeeds {
    std::vector<OomSeed> moments;
    uint64_t recovered_failures = 0;
};

constexpr int32_t kOutOfMemoryCode = 2;

// Finds the episodes event by event (`index`: the event's, in the trace).
class OomEpisodes {
  public:
    // Inline: the events that matter here (failures, and allocations while
    // an episode may be open) are few.
    void add(const Event& e, size_t index) {
        if (e.kind == EventKind::oom || (e.kind == EventKind::alloc && !open_.empty()))
            add_episode_event(e, index);
    }
    // The events above.
    [[gnu::noinline]] void add_episode_event(const Event& e, size_t index) {
        // Out of memory: cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY
        // (both 2); a call refused for another reason (an invalid value) is
        // no shortage of memory.
        if (e.kind == EventKind::oom && e.result == kOutOfMemoryCode) {
            Episode& ep = open_[e.tid];
            ep.open = true;
            ep.last = index;
            if (e.level == Level::block) {
                ep.verdict = index;
                ep.has_verdict = true;
            } else {
                ++ep.calls;
            }
        } else if (e.kind == EventKind::alloc && !open_.empty()) {
            if (auto it = open_.find(e.tid); it != open_.end()) close(it->second, true);
        }
    }
    // The moments in trace order, once every event has been added.
    OomSeeds finish() {
        for (auto& [tid, ep] : open_)
            close(ep, false);
        std::sort(out_.moments.begin(), out_.moments.end(),
                  [](const OomSeed& a, const OomSeed& b) { return a.index < b.index; });
        return std::move(out_);
    }

  private:
    struct Episode {
        bool open = false;
        size_t last = 0;     // the last failed request
        size_t verdict = 0;  // the last allocator verdict
        bool has_verdict = false;
        uint64_t calls = 0;  // failed runtime/driver calls
    };
    void close(Episode& ep, bool continued) {
        if (!ep.open) return;
        if (ep.has_verdict) {
            out_.moments.push_back({ep.verdict, true, continued, ep.calls});
        } else if (continued) {
            out_.recovered_failures += ep.calls;
        } else {
            out_.moments.push_back({ep.last, false, false, ep.calls});
        }
        ep = Episode{};
    }
    OomSeeds out_;
    std::unordered_map<uint32_t, Episode> open_;
};

// The layer of the last event with one in the stretch of events of the
// current step (OomMoment::last_layer), kept event by event.
class LastLayer {
  public:
    // Before add(e): the layer an event of step `step` would name, 0: none.
    uint32_t layer(uint64_t step) const { return step == step_ && any_ ? layer_ : 0; }
    uint32_t phase() const { return phase_; }
    void add(const Event& e, size_t strings) {
        if (!any_ || e.step != step_) layer_ = 0, phase_ = 0;
        any_ = true;
        step_ = e.step;
        if (e.layer != 0 && e.layer < strings) layer_ = e.layer, phase_ = e.phase;
    }

  private:
    bool any_ = false;
    uint64_t step_ = 0;
    uint32_t layer_ = 0, phase_ = 0;
};

// The moment of `seed`, with the live set `live` and the pools' totals
// `replay` hold at its event.
// get_allocation_size of PyTorch's native caching allocator (its constants
// kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge).
uint64_t native_segment_for(uint64_t block) {
    constexpr uint64_t MiB = 1 << 20;
    if (block <= 1 * MiB) return 2 * MiB;
    if (block < 10 * MiB) return 20 * MiB;
    return (block + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

// What allocscope counts as the allocator's at one point of the replay.
// With blocks, reserved is the segments that have held one, and what else
// is in segments (a library's cudaMalloc, plain driver allocations) is
// outside, as PyTorch's own counters leave it out. Where the segments are
// the allocations (no blocks seen, cudaMallocAsync), allocated leaves the
// plain driver ones out.
struct AllocatorView {
    uint64_t allocated = 0;
    uint64_t allocated_count = 0;
    uint64_t reserved = 0;
    uint64_t outside = 0;
    bool allocated_known = true;
    bool reserved_known = false;
};

// Stream-ordered allocations (cudaMallocAsync and kin): under PyTorch's
// backend:cudaMallocAsync each tensor is one, so segments are what it has
// allocated; plain cudaMalloc segments of a caching allocator are its
// reserve.
bool is_async_segment_api(Api api) noexcept {
    switch (api) {
        case Api::cudaMallocAsync:
        case Api::cudaMallocAsync_ptsz:
        case Api::cudaMallocFromPoolAsync:
        case Api::cudaMallocFromPoolAsync_ptsz:
        case Api::cuMemAllocAsync:
        case Api::cuMemAllocAsync_ptsz:
        case Api::cuMemAllocFromPoolAsync:
        case Api::cuMemAllocFromPoolAsync_ptsz:
            return true;
        default:
            return false;
    }
}

// What the allocator had, by allocscope's count. `reserve`: the segments are
// a caching allocator's reserve whose blocks were not seen (PyTorch's native
// allocator without the bridge): reserved is known, allocated is not.
AllocatorView allocator_view(const Replay& replay, const SegmentOwners& owners, Pool owner,
                             uint64_t direct_driver_live, uint64_t direct_driver_count,
                             bool reserve) {
    AllocatorView v;
    v.allocated = replay.totals(owner).live_bytes;
    v.allocated_count = replay.totals(owner).live_count;
    const uint64_t segments = replay.totals(Pool::device_segment).live_bytes;
    if (owner == Pool::device_block) {
        v.reserved = std::min(owners.allocator_bytes(), segments);
        v.outside = segments - v.reserved;
        v.reserved_known = true;
    } else {
        v.outside = std::min(direct_driver_live, segments);
        v.allocated -= v.outside;
        v.allocated_count -= std::min(direct_driver_count, v.allocated_count);
        v.reserved = v.allocated;
        if (reserve) {
            v.allocated = 0;
            v.allocated_known = false;
            v.reserved_known = true;
        }
    }
    return v;
}

// An ALLOCSCOPE_OOM_PARAM_MARK: the parameter the thread was processing,
// for that thread's last moment of the step (none: the mark is ignored).
void name_oom_parameter(const TraceTables& t, const Event& e, std::vector<OomMoment>& ooms) {
    if (e.address >= t.params.size()) return;
    const ParamRecord& p = t.params[e.address];
    for (auto m = ooms.rbegin(); m != ooms.rend(); ++m) {
        if (m->step != e.step) return;
        if (m->tid != e.tid) continue;
        const std::string layer = p.layer < t.strings.size() ? t.str(p.layer) : "";
        const std::string name = p.name < t.strings.size() ? t.str(p.name) : "";
        m->parameter = layer.empty() ? name : layer + "." + name;
        m->parameter_count = e.size == 0 ? 1 : e.size;
        return;
    }
}

OomMoment oom_moment(const TraceTables& t, const Event& e, const OomSeed& seed,
                     const LastLayer& last, Tables& tables, const OwnerLive& live,
                     const Replay& replay, const SegmentOwners& owners, Pool owner,
                     uint64_t direct_driver_live, uint64_t direct_driver_count, bool async_segments,
                     const AnalysisOptions& options) {
    OomMoment m;
    m.seq = e.seq;
    m.t_ns = e.t_ns;
    m.step = e.step;
    m.tid = e.tid;
    m.layer = e.layer < t.strings.size() ? t.str(e.layer) : "";
    m.phase = e.phase < t.strings.size() ? t.str(e.phase) : "";
    if (m.layer.empty() && last.layer(e.step) != 0) {
        m.last_layer = t.str(last.layer(e.step));
        m.last_phase = last.phase() < t.strings.size() ? t.str(last.phase()) : "";
    }
    m.stack = e.stack < t.stacks.size() ? e.stack : 0;
    m.requested = e.size;
    m.device = e.device;
    m.device_free = e.address;
    m.api = std::string(to_string(e.api));
    m.by_allocator = seed.by_allocator;
    m.continued = seed.continued;
    m.failed_calls = seed.failed_calls;
    // A caching allocator's verdict on plain segments: they are its reserve.
    const AllocatorView view =
        allocator_view(replay, owners, owner, direct_driver_live, direct_driver_count,
                       seed.by_allocator && !async_segments);
    m.allocated = view.allocated;
    m.allocated_count = view.allocated_count;
    m.allocated_known = view.allocated_known;
    m.reserved_known = view.reserved_known;
    m.outside_allocator = view.outside;
    m.reserved = view.reserved;
    const bool mapped = replay.totals(Pool::physical).live_bytes > 0;
    if (m.by_allocator && owner == Pool::device_block && !mapped &&
        m.api == "allocscope_block_alloc")
        m.segment_asked = native_segment_for(m.requested);
    std::map<uint32_t, TagLive> by_tag;
    live.for_each([&](const Live& l) {
        TagLive& row = by_tag[l.tag];
        row.bytes += l.size;
        ++row.count;
        m.live_seqs.push_back(l.seq);
    });
    std::sort(m.live_seqs.begin(), m.live_seqs.end());
    for (auto& [tag, row] : by_tag) {
        row.layer = tables.tags[tag].layer;
        row.phase = tables.tags[tag].phase;
        m.by_tag.push_back(std::move(row));
    }
    std::stable_sort(m.by_tag.begin(), m.by_tag.end(),
                     [](const TagLive& a, const TagLive& b) { return a.bytes > b.bytes; });
    if (m.by_tag.size() > options.oom_tags) m.by_tag.resize(options.oom_tags);
    m.sites = top_sites(t, tables, live, options.top_sites);
    return m;
}

}  // namespace

std::string layer_group(const std::string& layer) {
    if (layer.empty()) return "(untagged)";
    size_t begin = 0;
    while (begin < layer.size()) {
        size_t end = layer.find('.', begin);
        if (end == std::string::npos) end = layer.size();
        bool digits = end > begin;
        for (size_t i = begin; i < end && digits; ++i)
            digits = layer[i] >= '0' && layer[i] <= '9';
        if (digits) return layer.substr(0, end);
        begin = end + 1;
    }
    return layer;
}

void ShapeCounter::add_push(const Event& e, const TraceTables& t) {
    auto& [forward, all] = pushes_[e.tid];
    ++all;
    if (e.phase >= forward_phase_.size() && e.phase < t.strings.size())
        forward_phase_.resize(t.strings.size(), -1);
    if (e.phase < forward_phase_.size()) {
        int8_t& f = forward_phase_[e.phase];
        if (f < 0) f = base_phase(t.str(e.phase)) == "forward";
        forward += uint64_t(f);
    }
}

TraceShape ShapeCounter::shape() const {
    TraceShape s;
    s.owner = any_block_ ? Pool::device_block : Pool::device_segment;
    std::pair<uint64_t, uint64_t> most{0, 0};
    for (const auto& [tid, n] : pushes_) {
        if (n > most || (n == most && tid < s.main_tid)) s.main_tid = tid, most = n;
    }
    if (pushes_.empty() && any_event_) s.main_tid = first_tid_;
    return s;
}

uint64_t ShapeCounter::pushes(uint32_t tid) const {
    const auto it = pushes_.find(tid);
    return it == pushes_.end() ? 0 : it->second.second;
}

TraceShape trace_shape(TraceStream& trace) {
    ShapeCounter counter;
    trace.for_each([&](const Event& e) { counter.add(e, trace.tables()); });
    return counter.shape();
}

TraceShape trace_shape(const Trace& trace) {
    TraceStream stream(trace);
    return trace_shape(stream);
}

const PoolSummary* TraceAnalysis::pool(Pool p) const {
    for (const PoolSummary& s : pools) {
        if (s.pool == p) return &s;
    }
    return nullptr;
}

TraceAnalysis analyze(const Trace& trace, const AnalysisOptions& options) {
    TraceStream stream(trace);
    return analyze(stream, options);
}

namespace {

// Pass 0 (a file's first: its tables too): the owner pool, the training
// thread, counts, the out-of-memory episodes. It runs on its own, or beside
// a speculative pass 1 (analyze).
class FirstPass {
  public:
    // Inline in the passes' loops: it runs for every event.
    [[gnu::always_inline]] void add(const Event& e, const TraceTables& t) {
        shape_.add(e, t);
        oom_.add(e, index_++);
        ++by_kind_[size_t(e.kind) << 8 | size_t(e.level)];
        if (e.kind == EventKind::alloc || e.kind == EventKind::oom) ++by_api_[size_t(e.api)];
        span_ns_ = e.t_ns;
        out_of_memory_ |= e.kind == EventKind::oom && e.result == kOutOfMemoryCode;
    }
    TraceShape shape() const { return shape_.shape(); }
    uint64_t pushes(uint32_t tid) const { return shape_.pushes(tid); }
    // Whether an out-of-memory failure was seen: an episode's moment then
    // needs the live set at its event, which only a pass that knows where
    // the episodes end can keep.
    bool out_of_memory() const noexcept { return out_of_memory_; }
    // The out-of-memory moments to keep in full (the last ones), once.
    OomSeeds moments(const AnalysisOptions& options) {
        OomSeeds oom = oom_.finish();
        oom_moments_total_ = oom.moments.size();
        recovered_failures_ = oom.recovered_failures;
        if (oom.moments.size() > options.oom_moments)
            oom.moments.erase(oom.moments.begin(),
                              oom.moments.end() - std::ptrdiff_t(options.oom_moments));
        return oom;
    }
    // What the analysis says of it, after moments().
    void fill(TraceAnalysis& a, const TraceStream& stream) const {
        const TraceTables& t = stream.tables();
        a.path = t.path;
        a.header = t.header;
        a.truncated = t.truncated;
        a.truncation_message = t.truncation_message;
        a.events = stream.size();
        a.span_ns = span_ns_;
        const TraceShape shape = shape_.shape();
        a.owner = shape.owner;
        a.main_tid = shape.main_tid;
        for (size_t key = 0; key < by_kind_.size(); ++key) {
            if (by_kind_[key] == 0) continue;
            std::string what(to_string(EventKind(key >> 8)));
            const Level level = Level(key & 0xff);
            if (level != Level::none) what += " " + std::string(to_string(level));
            a.events_by_kind.push_back({what, by_kind_[key]});
        }
        for (size_t api = 0; api < by_api_.size(); ++api) {
            if (by_api_[api] > 0)
                a.calls_by_api.push_back({std::string(to_string(Api(api))), by_api_[api]});
        }
        a.oom_moments_total = oom_moments_total_;
        a.recovered_failures = recovered_failures_;
    }

  private:
    ShapeCounter shape_;
    OomEpisodes oom_;
    // Counts by kind and level, and by api, in flat arrays: every event
    // passes here.
    std::vector<uint64_t> by_kind_ = std::vector<uint64_t>(size_t(256) * 256, 0);
    std::vector<uint64_t> by_api_ = std::vector<uint64_t>(256, 0);
    size_t index_ = 0;
    uint64_t span_ns_ = 0;
    bool out_of_memory_ = false;
    size_t oom_moments_total_ = 0;
    uint64_t recovered_failures_ = 0;
};

// What pass 1 takes from pass 0: known (pass 0 has run), or guessed by a
// speculative pass 1 that runs pass 0 beside it and holds the guesses to
// what it finds.
struct PassPlan {
    size_t events = 0;  // the trace's count
    Pool owner = Pool::device_segment;
    // The training thread; none: the first thread that pushes or pops a
    // tag (nothing pass 1 keeps depends on it before).
    std::optional<uint32_t> main_tid;
    size_t bands = 0;  // room for the timeline's bands
    OomSeeds oom;      // the moments to keep (none while guessing)
};

// The strings that name the marks pass 1 looks for (the first of each
// text), found as the table grows: a mark refers to a string defined
// before it, so the ids found by then are those of the whole table.
class MarkIds {
  public:
    void update(const TraceTables& t) {
        for (; scanned_ < t.strings.size(); ++scanned_) {
            const std::string& s = t.strings[scanned_];
            const uint32_t id = uint32_t(scanned_);
            if (counters == kNone && s == ALLOCSCOPE_COUNTERS_MARK) counters = id;
            if (oom_param == kNone && s == ALLOCSCOPE_OOM_PARAM_MARK) oom_param = id;
            if (bounded == kNone && s == kBoundedMark) bounded = id;
        }
    }
    uint32_t counters = kNone, oom_param = kNone, bounded = kNone;

  private:
    size_t scanned_ = 0;
};

// Events peeked at to guess the owner pool: a caching allocator's blocks
// come with its first segments.
constexpr uint64_t kOwnerPeekEvents = 1 << 16;
// And to guess the training thread: a training loop's first step's pushes.
constexpr uint64_t kThreadPeekEvents = 1 << 12;

// Pass 1: `account`, with the samples' largest allocations where the
// options ask for them (its own instance, so that the pass without them
// carries none of their code).
template <bool kLargest>
std::optional<TraceAnalysis> account_pass(TraceStream& stream, const AnalysisOptions& options,
                                          std::vector<StepMemory>* steps, PassPlan plan,
                                          FirstPass* speculative);
std::optional<TraceAnalysis> account(TraceStream& stream, const AnalysisOptions& options,
                                     std::vector<StepMemory>* steps, PassPlan plan,
                                     FirstPass* speculative) {
    if (options.timeline_allocations > 0)
        return account_pass<true>(stream, options, steps, std::move(plan), speculative);
    return account_pass<false>(stream, options, steps, std::move(plan), speculative);
}

}  // namespace

TraceAnalysis analyze(TraceStream& stream, const AnalysisOptions& options,
                      std::vector<StepMemory>* steps) {
    // Pass 0 finds what pass 1 needs to know before it starts: the event
    // count (the timeline's stretches), the owner pool, the training
    // thread, where the out-of-memory episodes end. Where the count is
    // known beforehand (an ended pass, the file's footer) pass 1 guesses
    // the rest (the owner and the training thread from the first events,
    // no out-of-memory failure) and runs with pass
    // 0 beside it, one pass over the events in all; it is kept only where
    // pass 0 finds the same, else pass 1 runs again with what it found.
    FirstPass first;
    if (const std::optional<uint64_t> expected = stream.expected_size()) {
        PassPlan guess;
        guess.events = size_t(*expected);
        // The training thread: the one that pushed the most among the first
        // events (the first to push or pop where none did); the owner: blocks
        // among them, or a little further.
        ShapeCounter peeked;
        uint64_t count = 0;
        bool blocks = false;
        stream.peek_until([&](const Event& e, const TraceTables& t) {
            blocks |= e.kind == EventKind::alloc && e.level == Level::block;
            if (count < kThreadPeekEvents) peeked.add(e, t);
            ++count;
            return count < kThreadPeekEvents || (!blocks && count < kOwnerPeekEvents);
        });
        guess.owner = blocks ? Pool::device_block : Pool::device_segment;
        const TraceShape shape = peeked.shape();
        if (peeked.pushes(shape.main_tid) > 0) guess.main_tid = shape.main_tid;
        // At most one band per event: address space only, as below.
        guess.bands = size_t(std::min<uint64_t>(*expected + 1, uint64_t{1} << 22));
        if (std::optional<TraceAnalysis> a =
                account(stream, options, steps, std::move(guess), &first)) {
            first.moments(options);
            first.fill(*a, stream);
            return std::move(*a);
        }
    } else {
        stream.for_each([&](const Event& e) { first.add(e, stream.tables()); });
    }
    PassPlan plan;
    plan.events = stream.size();
    const TraceShape shape = first.shape();
    plan.owner = shape.owner;
    plan.main_tid = shape.main_tid;
    // A band begins at a push or pop of the training thread's, and a pop
    // begins one only back in a scope pushed: room for as many as can be
    // (up to 4 M, 256 MB of address space), so the bands never move; pages
    // never written are never mapped.
    plan.bands =
        size_t(std::min<uint64_t>(2 * first.pushes(shape.main_tid) + 1, uint64_t{1} << 22));
    plan.oom = first.moments(options);
    std::optional<TraceAnalysis> a = account(stream, options, steps, std::move(plan), nullptr);
    first.fill(*a, stream);
    return std::move(*a);
}

namespace {

// Pass 1, the samples' largest allocations in it where kLargest.
// Speculative (with pass 0 beside it): none where a guess of `plan` turns
// out wrong.
template <bool kLargest>
std::optional<TraceAnalysis> account_pass(TraceStream& stream, const AnalysisOptions& options,
                                          std::vector<StepMemory>* steps, PassPlan plan,
                                          FirstPass* speculative) {
    TraceAnalysis a;
    const TraceTables& t = stream.tables();
    const Pool owner = plan.owner;
    uint32_t main_tid = plan.main_tid.value_or(0);
    bool main_known = plan.main_tid.has_value();
    std::map<std::pair<const char*, Api>, uint64_t> odd_frees;
    OomSeeds& oom = plan.oom;
    size_t next_oom = 0;
    // The event index of the next moment to keep (SIZE_MAX: none left).
    size_t next_oom_index = oom.moments.empty() ? SIZE_MAX : oom.moments[0].index;
    const bool any_oom = !oom.moments.empty();
    a.owner = owner;

    // Pass 1: totals, tags, scopes, bands, steps, sample points, the
    // layer groups' bytes at each sample and the tags' and sites' at the
    // peak, and step_memory's samples where asked for (saving its pass).
    Tables tables(t);
    Replay replay;
    OwnerLive live(replay, a.owner, tables);
    // The scopes open, each in a slot (a free one reused), and each
    // thread's open scopes' slots, innermost last. An allocation's note
    // names the scope it was made in (scope_note: its id and slot; 0:
    // none), which may have ended since: then its slot is free or holds a
    // scope of another id.
    std::vector<Scope> scope_slots;
    std::vector<uint32_t> free_scope_slots;
    uint32_t scopes_pushed = 0;
    FlatMap<uint32_t, std::vector<uint32_t>> thread_scopes;
    auto scope_note = [](const Scope& scope, uint32_t slot) {
        return (uint64_t{scope.id} + 1) << 32 | slot;
    };
    auto scope_left = [&](uint64_t note, uint64_t size) {
        if (note == 0) return;
        Scope& scope = scope_slots[uint32_t(note)];
        if (uint64_t{scope.id} + 1 == note >> 32) scope.live -= size;
    };
    std::vector<uint64_t> group_live, group_peak, groups_at_step;
    // Each group's live bytes at the latest timeline sample, kept as the
    // pass goes as TagSite keeps the peak's: group_then holds a group's
    // value then once it has changed since (group_mark: the sample count
    // then), and each sample's values per group, once its stretch ends.
    std::vector<uint64_t> group_then, group_mark;
    uint64_t sample_moment = 0;
    std::vector<std::vector<uint64_t>> sample_groups;
    auto group_change = [&](uint32_t g) {
        if (group_mark[g] != sample_moment) {
            group_then[g] = group_live[g];
            group_mark[g] = sample_moment;
        }
    };
    // Each group's largest live allocations at each sample (the timeline's
    // columns are known only at the end).
    MomentLargest largest_at(options.timeline_allocations);
    auto finish_sample = [&] {
        std::vector<uint64_t>& at = sample_groups.emplace_back(group_live.size());
        for (size_t g = 0; g < at.size(); ++g)
            at[g] = group_mark[g] == sample_moment ? group_then[g] : group_live[g];
        if constexpr (kLargest) {
            largest_at.finish(
                [&](auto&& f) {
                    replay.table(a.owner).any_of([&](const LiveRecord& r) {
                        f(r);
                        return false;
                    });
                },
                [&](const LiveRecord& r) { return tables.group(r.layer); });
        }
    };
    // Per tag, by stack: allocated in all, and live (TagSite).
    std::vector<FlatMap<uint32_t, TagSite>> tag_stacks;
    uint64_t peaks = 0;  // the owner pool's so far
    auto site_change = [&](TagSite& s, uint64_t size, bool enters) {
        if (s.peak != peaks) {
            s.bytes_then = s.bytes;
            s.count_then = s.count;
            s.peak = peaks;
        }
        if (enters) {
            s.bytes += size;
            ++s.count;
        } else {
            s.bytes -= size;
            --s.count;
        }
    };
    auto site_left = [&](const LiveRecord& r) {
        const uint32_t tag = tables.tag(r.layer, r.phase);
        if (tag >= tag_stacks.size()) return;
        if (TagSite* s = tag_stacks[tag].find(r.stack)) site_change(*s, r.size, false);
    };
    auto group_slot = [&](uint32_t g) {
        if (g >= group_live.size()) {
            group_live.resize(g + 1, 0);
            group_peak.resize(g + 1, 0);
            group_then.resize(g + 1, 0);
            group_mark.resize(g + 1, 0);
        }
    };
    const size_t n = plan.events;
    const size_t bucket = std::max<size_t>(
        1, (n + options.timeline_points - 1) / std::max<size_t>(1, options.timeline_points));
    std::vector<TimelinePoint> samples;
    uint64_t bucket_best = 0;
    size_t in_bucket = 0;  // i % bucket, kept without a division per event
    std::string band_phase;
    a.timeline.bands.reserve(plan.bands);
    uint64_t last_step = std::numeric_limits<uint64_t>::max();

    auto close_band = [&](uint64_t seq, uint64_t t_ns) {
        if (!band_phase.empty() && !a.timeline.bands.empty())
            a.timeline.bands.back().seq_end = seq, a.timeline.bands.back().t_end_ns = t_ns;
    };
    // A view of the tag's phase: valid until the next new tag.
    auto main_thread_phase = [&]() -> std::string_view {
        const std::vector<uint32_t>* s = thread_scopes.find(main_tid);
        if (!s || s->empty()) return {};
        return base_phase(tables.tags[scope_slots[s->back()].tag].phase);
    };

    // The allocator's counter marks, and the devices allocated on so far
    // (bit d: device d; the replay's totals are the process's).
    MarkIds marks;
    uint64_t devices_seen = 0;
    SegmentOwners segment_owners;
    LastLayer last_layer;
    uint64_t last_own_step = 0;   // the step of the last event not carried
    bool async_segments = false;  // stream-ordered allocations seen so far
    uint64_t last_seq = 0, last_t_ns = 0;
    std::optional<StepCounter> step_counter;
    if (steps) step_counter.emplace(t, TraceShape{owner, main_tid});
    // The owner pool's changes, as the replay makes them (nothing after
    // the replay but the tags' scopes and bands reads what they change,
    // and an event that changes the live set opens or closes no scope).
    auto owner_change = [&](const LiveChange& c, uint32_t tid) {
        if (c.kind == LiveChange::Kind::alloc) {
            const Live l = live.live_of(c.record);
            if constexpr (kLargest) {
                if (c.replaced) largest_at.release(tables.group(c.old.layer), c.old);
                largest_at.alloc(l.group, c.record);
            }
            uint64_t made_in = 0;  // the scope's note
            if (const std::vector<uint32_t>* s = thread_scopes.find(tid); s && !s->empty()) {
                Scope& scope = scope_slots[s->back()];
                scope.live += l.size;
                made_in = scope_note(scope, s->back());
            }
            TagStats& ts = tables.tags[l.tag];
            ts.allocated_bytes += l.size;
            ++ts.allocations;
            if (l.tag >= tag_stacks.size()) tag_stacks.resize(l.tag + 1);
            TagSite& site = tag_stacks[l.tag][l.stack];
            StackBytes& sb = site.total;
            sb.stack = l.stack;
            sb.bytes += l.size;
            ++sb.count;
            group_slot(l.group);
            group_change(l.group);
            group_live[l.group] += l.size;
            group_peak[l.group] = std::max(group_peak[l.group], group_live[l.group]);
            site_change(site, l.size, true);
            if (c.replaced) {  // its free was never recorded
                const auto [group, scope] = live.leave(c.old, c);
                scope_left(scope, c.old.size);
                group_change(group);
                group_live[group] -= c.old.size;
                site_left(c.old);
            }
            live.entered(c, made_in);
        } else if (c.released()) {
            const auto [group, scope] = live.leave(c.record, c);
            if constexpr (kLargest) largest_at.release(group, c.record);
            scope_left(scope, c.record.size);
            group_change(group);
            group_live[group] -= c.record.size;
            site_left(c.record);
        }
    };
    size_t i = 0;
    bool guessing = speculative != nullptr;  // the guesses hold so far
    stream.for_each_run([&](std::span<const Event> events) {
        for (const Event& e : events) {
            if (speculative) {
                speculative->add(e, t);
                if (!guessing) continue;
                // Wrong already: blocks where the owner was guessed to be the
                // segments, a failure out of memory, more events than counted.
                if ((e.kind == EventKind::alloc && e.level == Level::block &&
                     owner != Pool::device_block) ||
                    speculative->out_of_memory() || i >= n) {
                    guessing = false;
                    continue;
                }
            }
            if (!main_known && (e.kind == EventKind::tag_push || e.kind == EventKind::tag_pop)) {
                main_tid = e.tid;
                main_known = true;
                if (step_counter) step_counter->set_main_tid(main_tid);
            }
            if (e.kind == EventKind::mark) marks.update(t);
            if (e.flags & kFlagCarried) {
                BoundedSummary& b = a.bounded;
                if (e.kind == EventKind::alloc) {
                    ++b.carried_allocations;
                    b.carried_bytes += e.size;
                }
                b.carried_scopes += e.kind == EventKind::tag_push;
                if (e.kind == EventKind::mark && e.aux == marks.bounded) {
                    ++b.gaps;
                    b.events_dropped = e.address;
                    b.bytes_dropped = e.size;
                    b.last_step_before = last_own_step;
                    b.first_step_after = e.step;
                }
            } else {
                last_own_step = e.step;
            }
            const uint64_t owner_before = replay.totals(a.owner).live_bytes;
            const uint64_t peak_before = replay.totals(a.owner).peak_bytes;
            const FreeOutcome outcome = replay.apply(e, [&](const LiveChange& c) {
                segment_owners.apply(c);
                if (c.pool == a.owner) owner_change(c, e.tid);
            });
            if (step_counter) step_counter->add(e, owner_before, replay.totals(a.owner).live_bytes);
            if (replay.totals(a.owner).peak_bytes > peak_before) ++peaks;
            // Plain driver allocations live (is_direct_driver_allocation): device
            // memory that is not the caching allocator's.
            const uint64_t direct_driver_live = replay.direct_driver_live_bytes();
            const uint64_t direct_driver_count = replay.direct_driver_live_count();
            if (e.kind == EventKind::alloc && e.level == Level::segment &&
                is_async_segment_api(e.api))
                async_segments = true;
            if (e.kind == EventKind::alloc && e.level != Level::none && e.device >= 0)
                devices_seen |= uint64_t{1} << (e.device & 63);
            if (e.kind == EventKind::mark && e.aux == marks.oom_param)
                name_oom_parameter(t, e, a.ooms);
            if (e.kind == EventKind::mark && e.aux == marks.counters) {
                CounterSummary& cs = a.counters;
                if ((devices_seen & (devices_seen - 1)) != 0) {
                    ++cs.uncompared;
                } else {
                    // The counters are a caching allocator's: plain segments
                    // without blocks are its reserve.
                    const AllocatorView view =
                        allocator_view(replay, segment_owners, a.owner, direct_driver_live,
                                       direct_driver_count, !async_segments);
                    CounterCheck c;
                    c.step = e.step;
                    c.seq = e.seq;
                    c.device = e.device;
                    c.allocated = e.address;
                    c.reserved = e.size;
                    c.device_used = e.stream;
                    c.seen_allocated = view.allocated;
                    c.seen_reserved = view.reserved;
                    c.seen_outside = view.outside;
                    c.allocated_compared = view.allocated_known;
                    c.reserved_compared = view.reserved_known;
                    ++cs.checks;
                    if (c.agrees())
                        ++cs.agree;
                    else if (!cs.first_difference)
                        cs.first_difference = c;
                    cs.last = c;
                }
            }
            if (e.kind == EventKind::free && outcome != FreeOutcome::freed)
                ++odd_frees[{outcome == FreeOutcome::unknown ? "unknown " : "double ", e.api}];
            switch (e.kind) {
                case EventKind::tag_push: {
                    const uint32_t tag = tables.tag(e.layer, e.phase);
                    ++tables.tags[tag].scopes;
                    std::vector<uint32_t>& open = thread_scopes[e.tid];
                    uint32_t slot;
                    if (free_scope_slots.empty()) {
                        slot = uint32_t(scope_slots.size());
                        scope_slots.emplace_back();
                    } else {
                        slot = free_scope_slots.back();
                        free_scope_slots.pop_back();
                    }
                    scope_slots[slot] = {tag, scopes_pushed++, 0};
                    open.push_back(slot);
                    break;
                }
                case EventKind::tag_pop: {
                    std::vector<uint32_t>* s = thread_scopes.find(e.tid);
                    if (!s || s->empty()) break;
                    const Scope scope = scope_slots[s->back()];
                    scope_slots[s->back()].id = kNone;
                    free_scope_slots.push_back(s->back());
                    s->pop_back();
                    if (scope.live > 0) {
                        TagStats& ts = tables.tags[scope.tag];
                        ++ts.retained_scopes;
                        ts.retained_max = std::max(ts.retained_max, scope.live);
                    }
                    break;
                }
                case EventKind::step:
                    if (e.step != last_step) {
                        a.timeline.steps.push_back({e.step, e.seq, e.t_ns});
                        a.step_starts.push_back({e.step, replay.totals(a.owner).live_bytes});
                        groups_at_step = group_live;
                        ++a.steps;
                        last_step = e.step;
                    }
                    break;
                default:
                    break;
            }
            if (e.tid == main_tid &&
                (e.kind == EventKind::tag_push || e.kind == EventKind::tag_pop)) {
                const std::string_view phase = main_thread_phase();
                if (phase != band_phase) {
                    close_band(e.seq, e.t_ns);
                    band_phase = phase;
                    if (!band_phase.empty())
                        a.timeline.bands.push_back({band_phase, e.seq, e.seq, e.t_ns, e.t_ns});
                }
            }
            if (i == next_oom_index) {
                a.ooms.push_back(oom_moment(t, e, oom.moments[next_oom++], last_layer, tables, live,
                                            replay, segment_owners, a.owner, direct_driver_live,
                                            direct_driver_count, async_segments, options));
                next_oom_index =
                    next_oom < oom.moments.size() ? oom.moments[next_oom].index : SIZE_MAX;
            }
            if (any_oom) last_layer.add(e, t.strings.size());  // the moments' only
            // The sample of this stretch: where the owner total is largest.
            const uint64_t owner_now = replay.totals(a.owner).live_bytes;
            if (in_bucket == 0 || owner_now > bucket_best) {
                if (in_bucket == 0) {
                    if (!samples.empty()) finish_sample();
                    samples.emplace_back();
                }
                bucket_best = owner_now;
                ++sample_moment;
                if constexpr (kLargest) largest_at.moment(e.seq);
                TimelinePoint& p = samples.back();
                p.seq = e.seq;
                p.t_ns = e.t_ns;
                p.segment_bytes = replay.totals(Pool::device_segment).live_bytes;
                p.block_bytes = replay.totals(Pool::device_block).live_bytes;
            }
            last_seq = e.seq;
            last_t_ns = e.t_ns;
            ++i;
            if (++in_bucket == bucket) in_bucket = 0;
        }
    });
    if (speculative) {
        // Pass 0's findings against the guesses.
        const TraceShape found = speculative->shape();
        if (!guessing || stream.size() != n || found.owner != owner ||
            (main_known && found.main_tid != main_tid))
            return std::nullopt;
    }
    if (n > 0) close_band(last_seq, last_t_ns);
    if (!samples.empty()) finish_sample();
    if (steps) *steps = step_counter->finish(replay.totals(a.owner).live_bytes);
    for (size_t g = 0; g < groups_at_step.size(); ++g) {
        if (groups_at_step[g] > 0)
            a.groups_at_last_step.push_back({tables.groups[g], groups_at_step[g]});
    }

    // Totals and peaks.
    for (const auto& [key, count] : odd_frees)
        a.odd_frees.push_back({key.first + std::string(to_string(key.second)), count});
    a.unknown_frees = replay.unknown_frees();
    a.double_frees = replay.double_frees();
    a.failed_frees = replay.failed_frees();
    a.oom_events = replay.oom_events();
    a.largest_failed_request = replay.largest_failed_request();
    for (int p = 0; p < kPoolCount; ++p) {
        const PoolTotals& pt = replay.totals(Pool(p));
        if (pt.allocations == 0) continue;
        PoolSummary s;
        s.pool = Pool(p);
        s.allocations = pt.allocations;
        s.allocated_bytes = pt.allocated_bytes;
        s.peak_bytes = pt.peak_bytes;
        s.peak_seq = pt.peak_event.seq;
        s.peak_t_ns = pt.peak_event.t_ns;
        s.peak_step = pt.peak_event.step;
        s.peak_layer = pt.peak_event.layer < t.strings.size() ? t.str(pt.peak_event.layer) : "";
        s.peak_phase = pt.peak_event.phase < t.strings.size() ? t.str(pt.peak_event.phase) : "";
        s.live_bytes_at_exit = pt.live_bytes;
        s.live_count_at_exit = pt.live_count;
        a.pools.push_back(std::move(s));
    }
    a.graph_pools = replay.graph_pools();

    for (size_t tag = 0; tag < tag_stacks.size(); ++tag) {
        std::vector<StackBytes>& sites = tables.tags[tag].sites;
        tag_stacks[tag].for_each([&](uint32_t, const TagSite& s) { sites.push_back(s.total); });
        std::sort(sites.begin(), sites.end(), [](const StackBytes& x, const StackBytes& y) {
            return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack < y.stack;
        });
        if (sites.size() > options.tag_sites) sites.resize(options.tag_sites);
    }

    // Live at the owner pool's peak (its latest: the one the totals name).
    if (peaks > 0) {
        auto at_peak = [&](auto&& add) {
            for (uint32_t tag = 0; tag < tag_stacks.size(); ++tag) {
                tag_stacks[tag].for_each([&](uint32_t stack, const TagSite& s) {
                    const bool since = s.peak == peaks;
                    const uint64_t count = since ? s.count_then : s.count;
                    if (count > 0) add(stack, tag, since ? s.bytes_then : s.bytes, count);
                });
            }
        };
        at_peak([&](uint32_t, uint32_t tag, uint64_t bytes, uint64_t count) {
            tables.tags[tag].at_peak += bytes;
            tables.tags[tag].count_at_peak += count;
        });
        a.sites_at_peak = top_sites_of(t, tables, options.top_sites, at_peak);
    }

    // Live at exit.
    live.for_each([&](const Live& l) { tables.tags[l.tag].at_exit += l.size; });
    a.sites_at_exit = top_sites(t, tables, live, options.top_sites);

    // The timeline's layers: the largest groups by their own peak.
    std::vector<uint32_t> order(tables.groups.size());
    for (uint32_t g = 0; g < order.size(); ++g)
        order[g] = g;
    if (group_peak.size() < tables.groups.size()) group_peak.resize(tables.groups.size(), 0);
    if (group_live.size() < tables.groups.size()) group_live.resize(tables.groups.size(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t x, uint32_t y) { return group_peak[x] > group_peak[y]; });
    std::vector<uint32_t> column(tables.groups.size(), kNone);
    const size_t shown = std::min(order.size(), options.timeline_layers);
    for (size_t k = 0; k < shown; ++k) {
        column[order[k]] = uint32_t(k);
        a.timeline.layers.push_back(tables.groups[order[k]]);
    }
    const bool folded = order.size() > shown;
    if (folded) a.timeline.layers.push_back("(other)");
    for (uint32_t g = 0; g < column.size(); ++g) {
        if (column[g] == kNone) column[g] = uint32_t(shown);
    }

    // Each sample's live bytes per column, from the first pass.
    for (size_t k = 0; k < samples.size(); ++k) {
        TimelinePoint& p = samples[k];
        p.layer_bytes.assign(a.timeline.layers.size(), 0);
        for (size_t g = 0; g < sample_groups[k].size(); ++g)
            p.layer_bytes[column[g]] += sample_groups[k][g];
        p.largest.assign(a.timeline.layers.size(), {});
    }

    // Each sample's largest allocations per column: a shown column's are
    // its group's, "(other)"'s the largest of its groups'.
    if constexpr (kLargest) {
        const size_t keep = options.timeline_allocations;
        FlatMap<uint64_t, uint32_t> allocation_index;  // by seq
        auto allocation_id = [&](const MomentLargest::Kept& x) {
            if (const uint32_t* known = allocation_index.find(x.seq)) return *known;
            const uint32_t id = uint32_t(a.timeline.allocations.size());
            const TagStats& tag = tables.tags[tables.tag(x.layer, x.phase)];
            a.timeline.allocations.push_back(
                {x.seq, x.size, x.step, x.stack, tag.layer, tag.phase});
            allocation_index[x.seq] = id;
            return id;
        };
        std::vector<std::vector<MomentLargest::Kept>> by_column(a.timeline.layers.size());
        for (size_t k = 0; k < samples.size(); ++k) {
            for (std::vector<MomentLargest::Kept>& c : by_column)
                c.clear();
            for (const auto& [g, named] : largest_at.samples()[k])
                add_bounded(by_column[column[g]], largest_at.named()[named], keep);
            for (size_t c = 0; c < by_column.size(); ++c) {
                std::vector<uint32_t>& ids = samples[k].largest[c];
                ids.reserve(by_column[c].size());
                for (const MomentLargest::Kept& x : by_column[c])
                    ids.push_back(allocation_id(x));
            }
        }
    }
    a.timeline.points = std::move(samples);

    a.tags = std::move(tables.tags);
    std::stable_sort(a.tags.begin(), a.tags.end(), [](const TagStats& x, const TagStats& y) {
        return x.allocated_bytes != y.allocated_bytes ? x.allocated_bytes > y.allocated_bytes
                                                      : x.at_peak > y.at_peak;
    });
    return a;
}

}  // namespace

}  // namespace allocscope
