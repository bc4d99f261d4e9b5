// phase-retention: memory a (layer, phase) allocated that outlives the phase
// where it should have been released.
//
// Phase scopes. Per thread, a TAG_PUSH starts a new *scope* of key (layer,
// base phase) unless it only refines the enclosing scope: same base phase
// ("forward/quantize" is within "forward") and a layer within the scope's
// layer ("layers.3.attn.qkv" within "layers.3"). So TE's quantize and FSDP's
// all-gather sub-phases belong to their layer's forward, while a prefetch
// tagged with the next layer ("layers.4" inside "layers.3" forward) is a
// scope of layers.4, and a root module tagged "" does not swallow its
// children. The scope ends at the pop of the push that started it. A key
// may have several scopes in one step (a prefetch, then the layer's own).
//
// Two rules:
//
// * Recurring retention (always on). Much legitimately outlives its phase:
//   saved activations live from forward to backward, FSDP keeps the last
//   all-gather output until the next one (the last layer's until backward),
//   gradients live until the optimizer, optimizer state and parameters for
//   the whole run. What a healthy loop does not do is keep what a key's
//   scopes allocated in step s past the end of the key's last scope in the
//   next step it runs (s+1): by then the same layer has run the same phase
//   again and had every chance to release or replace it. That is the
//   retention of step s, measured at the end of each scope of the key in
//   step s+1 (the last one decides), less what is freed before step s+1
//   ends (known when the key runs in a later step): a step's output that a
//   variable holds until the next step's replaces it is alive at the end
//   of the next forward, but not after the next step. One retaining step is
//   expected (state
//   created lazily on first use: optimizer moments, caches); the key is
//   reported when `repeat` (default 2) steps each retained more than
//   `budget` (default 0) bytes: retention that recurs accumulates. Needs
//   step boundaries in the stream.
//
// * Excess over a baseline (baseline mode only). The bytes a scope
//   allocated that are still alive at its own end, against what the
//   baseline's scope of the same key and index (the n-th of that key; its
//   last when the baseline has fewer; 0 when the baseline has no such key)
//   kept, plus `tolerance` (default: the reference test's thresholds, 50 KiB
//   for forward and 256 KiB for every other phase). This is the seed's
//   method: an FP8 run keeps what a bf16 run keeps at each phase's end,
//   unless a weight copy or a transpose is retained. In baseline mode the
//   recurring rule's budget is raised by the baseline's own steady
//   retention of the key (its largest after its first evaluated step).
//
// Level: blocks when the stream has block events (caching allocators keep
// segments on purpose), otherwise segments (every tensor a cudaMalloc).
// Allocations made outside any tagged scope of their thread are not
// assessed. One finding per key and rule, emitted at finish.
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
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {
namespace {

constexpr std::size_t kEvidence = 8;
constexpr uint64_t kForwardTolerance = 50 * 1024;
constexpr uint64_t kOtherTolerance = 256 * 1024;

// Index of a level in per-level arrays: 0 blocks, 1 segments.
int level_index(uint32_t level) {
    return level == ALLOCSCOPE_LEVEL_BLOCK ? 0 : level == ALLOCSCOPE_LEVEL_SEGMENT ? 1 : -1;
}

struct Record {
    uint64_t size = 0;
    uint32_t key = 0;
    uint64_t instance = 0;  // the scope's index among the key's scopes
    uint64_t step = 0;      // the scope's step
    int level = 0;
    uint32_t layer = 0;  // the allocation's own tag
    uint32_t phase = 0;
    uint32_t stack = 0;
    // Where its seq is in the scope's and the step's bucket.
    uint32_t in_open = 0;
    uint32_t in_step = 0;
};

// Live allocations of one scope, or of one step's scopes, of a key.
struct Bucket {
    uint64_t bytes = 0;
    std::vector<uint64_t> seqs;  // unordered; each record knows its place
};

// A finding in the making: updated at each evaluation that counts.
struct Pending {
    uint64_t times = 0;      // steps (recurring) or scopes (excess) that exceeded
    uint64_t largest = 0;    // the largest amount compared
    uint64_t threshold = 0;  // at the largest
    uint64_t bytes = 0;
    uint64_t count = 0;
    uint64_t step = 0;
    uint64_t at_end = 0;    // excess: the run's bytes at the largest
    uint64_t baseline = 0;  // excess: the baseline's bytes at the largest
    std::vector<Evidence> evidence;
};

// The retention of the key's previous step as measured at the end of its
// latest scope; committed when the key's step changes (or at finish), so
// the last scope of the step decides.
struct Candidate {
    bool set = false;
    uint64_t retained = 0;  // of the previous step
    uint64_t bytes = 0;     // of every earlier step
    uint64_t count = 0;
    uint64_t previous = 0;  // the step retained from
    uint64_t step = 0;      // the step measured in
    uint64_t allowed = 0;   // the threshold it was compared with
    std::vector<Evidence> evidence;
};

struct LevelState {
    std::map<uint64_t, Bucket> open;     // by scope index, scopes not yet ended
    std::map<uint64_t, Bucket> by_step;  // by step
    uint64_t live_bytes = 0;
    uint64_t live_count = 0;
    Candidate candidate;
    // Baseline stream: bytes alive at each scope's end; the largest
    // retention after the key's first evaluated step.
    std::vector<uint64_t> at_end;
    uint64_t steady_retention = 0;
    // Run stream.
    Pending recurring;
    Pending excess;
};

struct KeyState {
    uint64_t scopes = 0;  // started
    bool ran = false;
    uint64_t step = 0;  // of the latest scope
    bool has_previous = false;
    uint64_t previous = 0;   // the step the key ran in before `step`
    uint64_t evaluated = 0;  // steps whose retention was committed
    uint32_t id = 0;
    LevelState levels[2];
};

struct Scope {
    uint32_t key = 0;
    uint64_t instance = 0;
    uint64_t step = 0;
    bool starts = false;  // the push that started the scope (its pop ends it)
};

struct Stream {
    FlatMap<uint32_t, std::vector<Scope>> threads;
    std::vector<std::unique_ptr<KeyState>> keys;  // by key id; null: not run here
    FlatMap<uint64_t, Record> records;            // live, by alloc seq
    bool saw_block = false;
};

class PhaseRetention {
  public:
    explicit PhaseRetention(const allocscope_host_v2& host)
        : host_(host),
          budget_(option_bytes(host, "budget", 0)),
          repeat_(option_count(host, "repeat", 2, 1, 1000000)) {
        if (host.option(host.ctx, "tolerance")) tolerance_ = option_bytes(host, "tolerance", 0);
    }

    void on_event(const allocscope_event_v2& e) {
        const bool baseline = e.source == ALLOCSCOPE_SOURCE_BASELINE;
        Stream& s = baseline ? baseline_ : run_;
        switch (e.kind) {
            case ALLOCSCOPE_EVENT_TAG_PUSH:
                push(s, e, baseline);
                break;
            case ALLOCSCOPE_EVENT_TAG_POP:
                pop(s, e, baseline);
                break;
            case ALLOCSCOPE_EVENT_ALLOC:
                alloc(s, e);
                break;
            case ALLOCSCOPE_EVENT_FREE:
                free(s, e, baseline);
                break;
            default:
                break;
        }
    }

    void on_step(uint64_t, uint32_t) {}

    void finish() {
        for (auto& key : run_.keys) {
            if (key) commit(*key, false, false);
        }
        const int li = run_.saw_block ? 0 : 1;
        // Keys in id order: findings come out in the order the keys were
        // first seen, the same on every run.
        for (uint32_t id = 0; id < run_.keys.size(); ++id) {
            if (!run_.keys[id]) continue;
            const KeyState& k = *run_.keys[id];
            const LevelState& l = k.levels[li];
            const std::string& layer = strings_.text(keys_[id].first);
            const std::string& phase = strings_.text(keys_[id].second);
            const std::string where = (layer.empty() ? std::string("(no layer)") : layer) + " " +
                                      (phase.empty() ? std::string("(no phase)") : phase);
            if (l.recurring.times >= repeat_) {
                const Pending& p = l.recurring;
                Finding f;
                f.layer = layer;
                f.phase = phase;
                f.bytes = p.bytes;
                f.count = p.count;
                f.summary = where + ": what " + std::to_string(p.times) + " of " +
                            std::to_string(k.evaluated) + " steps allocated in its scopes was " +
                            "still alive after the next step's scopes and that step's end (up to " +
                            format_bytes(p.largest) + " per step, allowed " +
                            format_bytes(p.threshold) + "); " + format_bytes(p.bytes) + " in " +
                            std::to_string(p.count) + " allocations retained at step " +
                            std::to_string(p.step);
                f.evidence = p.evidence;
                watch_.fill(f.evidence);
                emit(host_, f);
            }
            if (l.excess.times > 0) {
                const Pending& p = l.excess;
                Finding f;
                f.layer = layer;
                f.phase = phase;
                f.bytes = p.largest;
                f.count = p.count;
                f.summary = where + ": " + format_bytes(p.at_end) +
                            " allocated in a scope still alive at its end, " +
                            format_bytes(p.largest) + " more than the baseline's " +
                            format_bytes(p.baseline) + " (tolerance " +
                            format_bytes(p.threshold - p.baseline) + "), in " +
                            std::to_string(p.times) + " of " + std::to_string(k.scopes) +
                            " scopes (largest at step " + std::to_string(p.step) + ")";
                f.evidence = p.evidence;
                watch_.fill(f.evidence);
                emit(host_, f);
            }
        }
    }

  private:
    uint32_t key_id(uint32_t layer, uint32_t phase) {
        uint32_t& id = key_ids_[uint64_t(layer) << 32 | phase];
        if (id == 0) {
            keys_.push_back({layer, phase});
            id = uint32_t(keys_.size());  // 1-based here: 0 marks a new entry
        }
        return id - 1;
    }

    static KeyState& key_state(Stream& s, uint32_t id) {
        if (id >= s.keys.size()) s.keys.resize(id + 1);
        if (!s.keys[id]) s.keys[id] = std::make_unique<KeyState>();
        return *s.keys[id];
    }

    uint64_t tolerance(uint32_t key) const {
        if (tolerance_) return *tolerance_;
        return strings_.text(keys_[key].second) == "forward" ? kForwardTolerance : kOtherTolerance;
    }

    void push(Stream& s, const allocscope_event_v2& e, bool baseline) {
        std::vector<Scope>& stack = s.threads[e.tid];
        const uint32_t layer = strings_.tag(e.layer);
        const uint32_t phase = strings_.base_phase(strings_.tag(e.phase));
        if (!stack.empty()) {
            const Scope top = stack.back();
            const auto& [top_layer, top_phase] = keys_[top.key];
            if (top_phase == phase &&
                (top_layer == layer ||
                 layer_within(strings_.text(layer), strings_.text(top_layer)))) {
                stack.push_back({top.key, top.instance, top.step, false});
                return;
            }
        }
        const uint32_t id = key_id(layer, phase);
        KeyState& k = key_state(s, id);
        k.id = id;
        if (!k.ran || k.step != e.step) {
            commit(k, baseline, true);
            if (k.ran) {
                k.has_previous = true;
                k.previous = k.step;
            }
            k.ran = true;
            k.step = e.step;
        }
        stack.push_back({id, k.scopes++, e.step, true});
    }

    void pop(Stream& s, const allocscope_event_v2& e, bool baseline) {
        std::vector<Scope>* stack = s.threads.find(e.tid);
        if (!stack || stack->empty()) return;  // began mid-scope
        const Scope scope = stack->back();
        stack->pop_back();
        if (scope.starts) end_scope(s, scope, baseline);
    }

    void alloc(Stream& s, const allocscope_event_v2& e) {
        const int li = level_index(e.level);
        if (li < 0) return;
        if (li == 0) s.saw_block = true;
        const std::vector<Scope>* stack = s.threads.find(e.tid);
        if (!stack || stack->empty()) return;  // untagged
        const Scope& scope = stack->back();
        Record r;
        r.size = e.size;
        r.key = scope.key;
        r.instance = scope.instance;
        r.step = scope.step;
        r.level = li;
        r.layer = strings_.tag(e.layer);
        r.phase = strings_.tag(e.phase);
        r.stack = e.stack_id;
        LevelState& l = s.keys[scope.key]->levels[li];
        Bucket& open = l.open[scope.instance];
        Bucket& by_step = l.by_step[scope.step];
        r.in_open = uint32_t(open.seqs.size());
        r.in_step = uint32_t(by_step.seqs.size());
        for (Bucket* b : {&open, &by_step}) {
            b->bytes += e.size;
            b->seqs.push_back(e.seq);
        }
        l.live_bytes += e.size;
        ++l.live_count;
        s.records[e.seq] = r;
    }

    // Removes the seq at `at` of the bucket at `key` of `buckets` (dropping
    // the bucket when it empties); `place` is the member of Record that
    // holds the position.
    static void take(Stream& s, std::map<uint64_t, Bucket>& buckets, uint64_t key, uint32_t at,
                     uint64_t size, uint32_t Record::*place) {
        auto b = buckets.find(key);
        if (b == buckets.end()) return;
        std::vector<uint64_t>& seqs = b->second.seqs;
        b->second.bytes -= size;
        if (at + 1 < seqs.size()) {
            seqs[at] = seqs.back();
            s.records.find(seqs[at])->*place = at;
        }
        seqs.pop_back();
        if (seqs.empty()) buckets.erase(b);
    }

    void free_record(Stream& s, uint64_t seq, const Record r) {
        LevelState& l = s.keys[r.key]->levels[r.level];
        take(s, l.open, r.instance, r.in_open, r.size, &Record::in_open);
        take(s, l.by_step, r.step, r.in_step, r.size, &Record::in_step);
        l.live_bytes -= r.size;
        --l.live_count;
        s.records.erase(seq);
    }

    void free(Stream& s, const allocscope_event_v2& e, bool baseline) {
        if (e.alloc_seq == 0) return;  // allocated before the stream began
        if (!baseline) watch_.on_free(e.alloc_seq, e.seq);
        const Record* r = s.records.find(e.alloc_seq);
        if (!r) return;  // not assessed (untagged)
        free_record(s, e.alloc_seq, *r);
    }

    // The largest allocations of `b`, newest first among equals.
    std::vector<Evidence> evidence_of(const Stream& s, const Bucket& b) {
        std::vector<std::pair<uint64_t, uint64_t>> by_size;  // (size, seq)
        for (uint64_t seq : b.seqs)
            by_size.emplace_back(s.records.find(seq)->size, seq);
        const std::size_t n = std::min(kEvidence, by_size.size());
        std::partial_sort(by_size.begin(), by_size.begin() + std::ptrdiff_t(n), by_size.end(),
                          [](const auto& a, const auto& b) { return a > b; });
        std::vector<Evidence> out;
        for (std::size_t i = 0; i < n; ++i) {
            const Record& r = *s.records.find(by_size[i].second);
            out.push_back({r.size, strings_.text(r.layer), strings_.text(r.phase), r.step,
                           by_size[i].second, 0, r.stack, ""});
        }
        return out;
    }

    void replace_evidence(std::vector<Evidence>& held, std::vector<Evidence> evidence) {
        watch_.hold(evidence);
        watch_.release(held);
        held = std::move(evidence);
    }

    const LevelState* baseline_level(uint32_t key, int li) const {
        if (!host_.has_baseline) return nullptr;
        if (key >= baseline_.keys.size() || !baseline_.keys[key]) return nullptr;
        return &baseline_.keys[key]->levels[li];
    }

    // Commits the key's evaluation of its last step: the retention measured
    // at the end of its last scope of that step, less what was freed since
    // when `step_over` (the key runs in a later step: that step has ended).
    // What the program replaces during the next step, after the key's
    // scopes (the step's output a variable holds until the next step's is
    // assigned), is not retained. At the end of the stream the step is not
    // known to be over (the frees there are the program's teardown), so
    // the measurement stands.
    void commit(KeyState& k, bool baseline, bool step_over) {
        if (!k.ran || !k.has_previous) return;
        ++k.evaluated;
        for (int li = 0; li < 2; ++li) {
            LevelState& l = k.levels[li];
            Candidate c = std::move(l.candidate);
            l.candidate = {};
            if (step_over && (c.set || baseline)) {
                auto prev = l.by_step.find(c.previous);
                c.retained = std::min(c.retained, prev == l.by_step.end() ? 0 : prev->second.bytes);
                if (!baseline && c.retained <= c.allowed) c.set = false;
            }
            if (step_over && c.set && !baseline) accumulated(l, c.step, &c.bytes, &c.count);
            if (baseline) {
                if (k.evaluated > 1) l.steady_retention = std::max(l.steady_retention, c.retained);
                watch_.release(c.evidence);
                continue;
            }
            if (!c.set) {
                watch_.release(c.evidence);
                continue;
            }
            Pending& p = l.recurring;
            ++p.times;
            if (c.retained >= p.largest) {
                p.largest = c.retained;
                p.threshold = c.allowed;
            }
            p.bytes = c.bytes;
            p.count = c.count;
            p.step = c.step;
            watch_.release(p.evidence);
            p.evidence = std::move(c.evidence);  // already held
        }
    }

    // Everything of the key's steps before `step` still alive: the
    // accumulated retention.
    static void accumulated(const LevelState& l, uint64_t step, uint64_t* bytes, uint64_t* count) {
        *bytes = l.live_bytes;
        *count = l.live_count;
        for (auto it = l.by_step.lower_bound(step); it != l.by_step.end(); ++it) {
            *bytes -= it->second.bytes;
            *count -= it->second.seqs.size();
        }
    }

    void end_scope(Stream& s, const Scope& scope, bool baseline) {
        KeyState& k = *s.keys[scope.key];
        for (int li = 0; li < 2; ++li) {
            LevelState& l = k.levels[li];
            // Retention of the key's previous step, measured now.
            if (k.has_previous && scope.step == k.step) {
                Candidate c;
                auto prev = l.by_step.find(k.previous);
                c.retained = prev == l.by_step.end() ? 0 : prev->second.bytes;
                const LevelState* base = baseline ? nullptr : baseline_level(scope.key, li);
                const uint64_t allowed = budget_ + (base ? base->steady_retention : 0);
                c.allowed = allowed;
                c.set = baseline || c.retained > allowed;
                c.previous = k.previous;
                c.step = k.step;
                if (c.set && !baseline) {
                    accumulated(l, k.step, &c.bytes, &c.count);
                    c.evidence = evidence_of(s, prev->second);
                    watch_.hold(c.evidence);
                }
                watch_.release(l.candidate.evidence);
                l.candidate = std::move(c);
            }
            // Bytes of this scope alive at its end.
            auto own = l.open.find(scope.instance);
            const uint64_t at_end = own == l.open.end() ? 0 : own->second.bytes;
            if (baseline) {
                if (l.at_end.size() <= scope.instance) l.at_end.resize(scope.instance + 1, 0);
                l.at_end[scope.instance] = at_end;
            } else if (host_.has_baseline) {
                const LevelState* base = baseline_level(scope.key, li);
                uint64_t reference = 0;
                if (base && !base->at_end.empty()) {
                    reference =
                        base->at_end[std::min<uint64_t>(scope.instance, base->at_end.size() - 1)];
                }
                const uint64_t allowed = reference + tolerance(scope.key);
                if (at_end > allowed) {
                    Pending& p = l.excess;
                    ++p.times;
                    if (at_end - reference > p.largest) {
                        p.largest = at_end - reference;
                        p.threshold = allowed;
                        p.at_end = at_end;
                        p.baseline = reference;
                        p.count = own->second.seqs.size();
                        p.step = scope.step;
                        replace_evidence(p.evidence, evidence_of(s, own->second));
                    }
                }
            }
            if (own != l.open.end()) l.open.erase(own);
        }
    }

    const allocscope_host_v2& host_;
    uint64_t budget_;
    uint64_t repeat_;
    std::optional<uint64_t> tolerance_;
    Interner strings_;
    // Keys are shared by both streams so the run finds the baseline's.
    FlatMap<uint64_t, uint32_t> key_ids_;              // (layer, base phase) -> id + 1
    std::vector<std::pair<uint32_t, uint32_t>> keys_;  // (layer, base phase) by id
    Stream baseline_;
    Stream run_;
    EvidenceWatch watch_;  // run evidence only
};

}  // namespace
}  // namespace allocscope::plugins

ALLOCSCOPE_DEFINE_PLUGIN(
    allocscope::plugins::PhaseRetention, "phase-retention",
    "memory a (layer, phase) allocated that outlives the phase: retained past the next scope of "
    "the same layer and phase in more than one step, or (baseline mode) kept at the phase's end "
    "beyond the baseline's plus a tolerance",
    ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) | ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_PUSH) |
        ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_TAG_POP));
