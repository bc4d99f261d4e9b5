// What weight-copy-accumulation and transpose-cache-retention share: the
// options, the parameter table (allocscope/sdk/weight_params.h), the event
// routing, the records of the allocations of the analysed phase (with their
// provenance), the following of candidates until they are freed, and the
// pieces of their findings. Header-only, on the plugin SDK (include/allocscope/sdk/).
#pragma once

#include <allocscope/allocscope.h>
#include <allocscope/sdk/evidence_watch.h>
#include <allocscope/sdk/finding.h>
#include <allocscope/sdk/flat_map.h>
#include <allocscope/sdk/interner.h>
#include <allocscope/sdk/level_filter.h>
#include <allocscope/sdk/options.h>
#include <allocscope/sdk/size_set.h>
#include <allocscope/sdk/tag_rules.h>
#include <allocscope/sdk/weight_params.h>
#include <allocscope/sdk/weight_sizes.h>

#include <cmath>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace allocscope::plugins {

// What a followed allocation is known to be.
struct Origin {
    static constexpr uint32_t kNoParam = UINT32_MAX;
    // proven: the host's parameter index (host->param()); size-matched: the
    // WeightParams index of the parameter whose form its size is.
    uint32_t param = kNoParam;
    uint32_t how = 0;  // proven: the derivation (interned), 0: none
    bool proven = false;
    bool data = false;  // size-matched: data-sized, else scale-sized
};

// A retained allocation and what it is.
struct WeightHeld : HeldAlloc {
    Origin origin;
};

// Text for the findings' `basis` and summaries.
inline constexpr const char* kProven = "proven";
inline constexpr const char* kSizeOnly = "size-only";
inline constexpr const char* kBaseline = "baseline";
// How to settle a size-only match, for a stream with provenance (some
// DERIVED event came: it named no parameter for these allocations) or
// without (it was off, or the program declares nothing).
inline std::string how_to_settle(bool provenance_on) {
    return provenance_on
               ? "provenance was on in this run and named no parameter for them; compare against "
                 "a baseline (allocscope diff BASE CAND)"
               : "provenance was off in this run (no derived events): run with it (on by "
                 "default under allocscope run where the PyTorch bridge loads; "
                 "allocscope_derived() declarations in C/C++) or compare against a baseline "
                 "(allocscope diff BASE CAND)";
}

// Per layer, the window (one forward or backward of it) that retained the
// most bytes (the latest among equals), with its evidence held in an
// EvidenceWatch; layers in the
// order first seen.
class RetentionByLayer {
  public:
    struct Entry {
        uint32_t layer = 0;
        uint64_t bytes = 0;
        uint64_t count = 0;
        uint64_t step = 0;
        uint64_t windows = 0;  // windows in which the layer retained anything
        std::vector<WeightHeld> evidence;
    };
    explicit RetentionByLayer(EvidenceWatch& watch) : watch_(watch) {}

    // One window's retained allocations of `layer` (non-empty).
    void record(uint32_t layer, uint64_t step, std::vector<WeightHeld> evidence) {
        uint64_t bytes = 0;
        for (const WeightHeld& e : evidence)
            bytes += e.size;
        auto [it, inserted] = index_.try_emplace(layer, entries_.size());
        if (inserted) {
            entries_.emplace_back();
            entries_.back().layer = layer;
        }
        Entry& entry = entries_[it->second];
        ++entry.windows;
        // Ties keep the latest window: its copies are the ones a run that
        // ends (or dies) now still holds, and an out-of-memory moment's
        // report can show them among what was live (analyze/report.h).
        if (bytes < entry.bytes) return;
        watch_.release(entry.evidence);
        entry.bytes = bytes;
        entry.count = evidence.size();
        entry.step = step;
        entry.evidence = std::move(evidence);
        watch_.hold(entry.evidence);
    }
    const std::vector<Entry>& entries() const { return entries_; }

  private:
    EvidenceWatch& watch_;
    std::vector<Entry> entries_;
    std::unordered_map<uint32_t, std::size_t> index_;
};

// A detector of weight-derived allocations kept past a phase (the analysed
// phase: forward for weight-copy-accumulation, backward for
// transpose-cache-retention). The subclass handles the events through
// enter/on_alloc/on_push/on_pop/on_proven.
//
// Every allocation of the followed level made in the analysed phase is
// recorded (live_) until it is freed, or until the phase ends without
// anything known about it. A record is a size-matched candidate (its tag is
// a parameter's module and its size one of that parameter's weight-derived
// sizes), or becomes proven when a DERIVED event names a registered
// parameter for it while it is live. Provenance belongs to the allocation
// live when it came: a later ALLOC at the address replaces the record.
class WeightDetector {
  public:
    WeightDetector(const allocscope_host_v2& host, const char* threshold_key,
                   uint64_t default_threshold, WeightSizeRules rules, uint64_t default_min_numel)
        : host_(host),
          threshold_(option_bytes(host, threshold_key, default_threshold)),
          level_(option_level(host, "level")),
          params_(strings_, rules,
                  option_count(host, "min_numel", default_min_numel, 1, uint64_t{1} << 62)),
          rules_(rules),
          proven_(watch_),
          sized_(watch_) {
        source_ = host.has_baseline ? ALLOCSCOPE_SOURCE_BASELINE : ALLOCSCOPE_SOURCE_RUN;
        params_.sync(host);
        any_param_ = host.param_count(host.ctx) > 0;
    }
    virtual ~WeightDetector() = default;
    WeightDetector(const WeightDetector&) = delete;
    WeightDetector& operator=(const WeightDetector&) = delete;

    void on_event(const allocscope_event_v2& e) {
        enter(e.source);
        switch (e.kind) {
            case ALLOCSCOPE_EVENT_ALLOC:
                on_alloc(e);
                break;
            case ALLOCSCOPE_EVENT_FREE:
                on_free(e);
                break;
            case ALLOCSCOPE_EVENT_TAG_PUSH:
                if (!saw_pass_) {
                    const uint32_t phase = base_phase(e.phase);
                    saw_pass_ = phase == forward_ || phase == backward_;
                }
                on_push(e);
                break;
            case ALLOCSCOPE_EVENT_TAG_POP:
                on_pop(e);
                break;
            case ALLOCSCOPE_EVENT_PARAM:
                any_param_ = true;
                if (const allocscope_param_v2* p = host_.param(host_.ctx, e.param_index))
                    params_.add(*p);
                break;
            case ALLOCSCOPE_EVENT_DERIVED:
                on_derived(e);
                break;
            case ALLOCSCOPE_EVENT_MARK:
                on_mark(e);
                break;
            default:
                break;
        }
    }

  protected:
    enum class State : uint8_t {
        pending,    // nothing known yet; dropped when the phase ends
        candidate,  // size-matched, in a window's candidate list
        proven,     // provenance came; waiting for its window to be judged
        kept,       // retained as evidence; followed until freed
    };
    // An allocation of the analysed phase (or a retained one, until freed).
    struct Record {
        uint64_t seq;
        uint64_t size;
        uint64_t step;
        uint32_t stack_id;
        uint32_t module;  // the allocation's layer tag
        uint32_t phase;
        uint32_t tid;
        Origin origin;
        State state;
    };
    // A proven allocation: the parameter's module and numbered layer
    // (interned; numbered 0 when the module has none).
    struct Proven {
        uint64_t address;
        uint64_t seq;
        uint32_t tid;
        uint32_t module;
        uint32_t numbered;
    };

    virtual void enter(uint32_t source) = 0;
    virtual void on_alloc(const allocscope_event_v2& e) = 0;
    virtual void on_push(const allocscope_event_v2& e) = 0;
    virtual void on_pop(const allocscope_event_v2& e) = 0;
    // A record became proven (its state is already State::proven).
    virtual void on_proven(const Proven& p) = 0;

    bool analyzing() const { return source_ == ALLOCSCOPE_SOURCE_RUN; }
    // The id of an event's phase's base phase: compare with forward_ etc.
    // (phase_within(phase, "forward") is base_phase(phase) == forward_).
    uint32_t base_phase(const char* phase) { return strings_.base_phase(strings_.tag(phase)); }
    const std::string& text(uint32_t id) const { return strings_.text(id); }
    uint64_t live_bytes() const { return host_.live_bytes(host_.ctx, level_.level()); }

    void on_free(const allocscope_event_v2& e) {
        bool switched = false;
        // Filtered by level: a segment and its first block share an address.
        if (!level_.follow(e, &switched)) return;
        const Record* r = live_.find(e.address);
        if (!r) return;
        watch_.on_free(r->seq, e.seq);
        live_.erase(e.address);
    }

    // Provenance for the allocation at e.address: taken when that is a
    // record of the analysed phase not judged yet and the parameter is one
    // the host knows. Any registered parameter counts, whatever min_numel
    // (a declaration is evidence by itself; allocscope_derived() registers
    // an unknown parameter without sizes).
    void on_derived(const allocscope_event_v2& e) {
        saw_derived_ = true;
        if (!analyzing()) return;
        Record* r = live_.find(e.address);
        if (!r || (r->state != State::pending && r->state != State::candidate)) return;
        const ParamIds* ids = param_ids(e.param_index);
        if (!ids) return;
        r->origin = Origin{e.param_index, strings_.intern(e.text ? e.text : ""), true, false};
        r->state = State::proven;
        on_proven(Proven{e.address, r->seq, r->tid, ids->module, ids->numbered});
    }

    // Provenance that runs in some steps only marks its pauses
    // (allocscope.h, ALLOCSCOPE_PROVENANCE_PAUSED): while paused, an
    // unproven allocation says nothing (the observer was not looking), so
    // no size is matched. What the observed steps proved stands: per layer
    // the detectors report the step that kept the most.
    void on_mark(const allocscope_event_v2& e) {
        if (!e.text || e.source != ALLOCSCOPE_SOURCE_RUN) return;
        constexpr std::string_view kMark = ALLOCSCOPE_PROVENANCE_MARK;
        const std::string_view text = e.text;
        // Resumed, or a new word on provenance, ends a pause.
        if (text.substr(0, kMark.size()) == kMark)
            provenance_paused_ = text == ALLOCSCOPE_PROVENANCE_PAUSED;
    }
    // Whether sizes are matched now (not while provenance is paused).
    bool matching_sizes() const { return !provenance_paused_; }

    // Records an allocation of the analysed phase (the caller dropped any
    // record at the address first); `match`: its size match as a candidate.
    void record(const allocscope_event_v2& e, uint32_t module,
                const std::optional<WeightParams::Match>& match) {
        Origin origin;
        if (match) {
            origin.param = match->param;
            origin.data = match->data;
        }
        live_[e.address] = Record{e.seq,      e.size, e.step,
                                  e.stack_id, module, strings_.tag(e.phase),
                                  e.tid,      origin, match ? State::candidate : State::pending};
    }

    // The record of the allocation made at `seq` while it is alive, else nullptr.
    Record* alive(uint64_t address, uint64_t seq) {
        Record* r = live_.find(address);
        return r && r->seq == seq ? r : nullptr;
    }
    static WeightHeld held(const Record& r) {
        return {{r.size, r.step, r.seq, r.stack_id, r.module, r.phase}, r.origin};
    }

    // The analysed phase ended: records nothing was learnt about are dropped.
    void dismiss_pending() {
        scratch_.clear();
        live_.for_each([&](uint64_t address, const Record& r) {
            if (r.state == State::pending) scratch_.push_back(address);
        });
        for (uint64_t address : scratch_)
            live_.erase(address);
    }

    // The outermost scope of `frames` accepted by `in_phase` that encloses
    // `module` (a parameter's) and lies within its numbered layer
    // `numbered` (when it has one); nullptr when there is none.
    template <class Frame, class InPhase>
    Frame* enclosing_scope(std::vector<Frame>& frames, uint32_t module, uint32_t numbered,
                           InPhase in_phase) const {
        for (Frame& f : frames) {
            if (!in_phase(f) || !scope_of(f.layer, module, numbered)) continue;
            return &f;
        }
        return nullptr;
    }
    template <class Frame, class InPhase>
    Frame* enclosing_scope(std::vector<Frame>& frames, uint32_t param, InPhase in_phase) const {
        return enclosing_scope(frames, params_.module(param), params_.numbered(param), in_phase);
    }
    // Whether a scope of layer `scope` encloses `module` within its numbered
    // layer `numbered` (0: none).
    bool scope_of(uint32_t scope, uint32_t module, uint32_t numbered) const {
        if (scope == 0) return false;
        const std::string_view s = text(scope);
        if (!layer_within(text(module), s)) return false;
        return numbered == 0 || layer_within(s, text(numbered));
    }
    // The layer a proven allocation is attributed to outside any scope of
    // it: the parameter's numbered layer, else its module.
    static uint32_t param_layer(const Proven& p) { return p.numbered != 0 ? p.numbered : p.module; }

    // The phase window closed: each of `candidates` (address, seq, module,
    // data) still alive and not proven since is retained, passed to
    // keep(candidate, evidence); scale-sized ones only in a module that
    // retains a data-sized one too. A scale belongs to a quantized form:
    // small allocations of scale sizes kept without one (a bias's gradient
    // accumulated across micro-batches has such a size) are not
    // weight-derived.
    template <class Candidate, class Keep>
    void retain_alive(const std::vector<Candidate>& candidates, Keep keep) {
        std::vector<uint32_t> data_modules;
        for (const Candidate& c : candidates) {
            if (c.data && alive(c.address, c.seq)) data_modules.push_back(c.module);
        }
        std::sort(data_modules.begin(), data_modules.end());
        for (const Candidate& c : candidates) {
            Record* r = alive(c.address, c.seq);
            if (!r || r->state != State::candidate) continue;  // freed, or proven: judged apart
            if (!std::binary_search(data_modules.begin(), data_modules.end(), c.module)) {
                live_.erase(c.address);  // not derived after all; stop following it
                continue;
            }
            r->state = State::kept;
            keep(c, held(*r));
        }
    }

    // The layers with retained evidence of either kind, each once, sorted.
    std::vector<uint32_t> retained_layers() const {
        std::vector<uint32_t> layers;
        for (const RetentionByLayer* table : {&proven_, &sized_}) {
            for (const RetentionByLayer::Entry& e : table->entries())
                layers.push_back(e.layer);
        }
        std::sort(layers.begin(), layers.end());
        layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
        return layers;
    }

    std::string common_layer(const std::vector<uint32_t>& layers) const {
        if (layers.empty()) return {};
        std::string_view common = text(layers.front());
        for (uint32_t l : layers)
            common = common_module(common, text(l));
        return std::string(common);
    }

    // The note of a retained allocation: what it is (the derivation, or
    // which parameter's form its size is) and `why` it is alive.
    std::string note(const WeightHeld& h, std::string_view why) const {
        std::string out;
        if (h.origin.proven) {
            const allocscope_param_v2* p = host_.param(host_.ctx, h.origin.param);
            out = "derived from " + param_text(p);
            if (h.origin.how != 0) out += ": " + text(h.origin.how);
        } else if (h.origin.param != Origin::kNoParam) {
            out = "size of " + text(params_.module(h.origin.param)) + "." +
                  text(params_.name(h.origin.param)) + "'s " + form(h.origin, h.size) +
                  " (size only)";
        }
        if (!why.empty()) {
            if (!out.empty()) out += "; ";
            out += why;
        }
        return out;
    }
    std::vector<Evidence> evidence(const std::vector<WeightHeld>& held,
                                   std::string_view why) const {
        std::vector<Evidence> out;
        out.reserve(held.size());
        for (const WeightHeld& h : held)
            out.push_back({h.size, text(h.layer), text(h.phase), h.step, h.alloc_seq, 0, h.stack_id,
                           note(h, why)});
        return out;
    }

    // Every layer's most-retaining window of both kinds, as one evidence
    // list; `why(layer)`: why an allocation of that layer is alive.
    template <class Why>
    std::vector<Evidence> all_layer_evidence(uint64_t* count, Why why) const {
        std::vector<Evidence> out;
        *count = 0;
        for (const RetentionByLayer* table : {&proven_, &sized_}) {
            for (const RetentionByLayer::Entry& e : table->entries()) {
                for (Evidence& ev : evidence(e.evidence, why(e.layer)))
                    out.push_back(std::move(ev));
                *count += e.count;
            }
        }
        return out;
    }

    // Baseline mode could not measure one stream (`baseline_ok`: the
    // baseline could, so the run could not); `lacks`: what it lacks.
    void log_no_baseline(bool baseline_ok, const char* lacks) const {
        host_.log(host_.ctx, (std::string("baseline mode: the ") +
                              (baseline_ok ? "run" : "baseline") + " stream has " + lacks +
                              "; reporting weight-derived allocations without the baseline")
                                 .c_str());
    }

    // How to settle this stream's size-only matches.
    std::string how_to_settle() const { return plugins::how_to_settle(saw_derived_); }

    // At finish: a stream of forward or backward passes that registered no
    // parameter and declared no provenance gave these detectors nothing to
    // recognise weights by. A program that never tags a pass (any CUDA
    // program that is not training) is not told about weights.
    void log_if_no_params() const {
        if (any_param_ || saw_derived_ || !saw_pass_) return;
        host_.log(host_.ctx,
                  "no parameters were registered, so weight-derived allocations could not be "
                  "looked for: under allocscope run the PyTorch shim registers them (not with "
                  "--no-python; or allocscope.torch.enable(model, optimizer)); C/C++ programs "
                  "call allocscope_register_param()");
    }

    // The baseline comparison's finding, evidence filled in and capped.
    template <class Why>
    Finding baseline_finding(const char* phase, double excess, Why why) {
        Finding f;
        f.severity = ALLOCSCOPE_SEVERITY_ERROR;
        f.basis = kBaseline;
        f.phase = phase;
        f.bytes = uint64_t(std::llround(excess));
        f.evidence = all_layer_evidence(&f.count, why);
        finish_evidence(f);
        return f;
    }

    // A layer's most-retaining window as a finding, without its summary:
    // an error over proven evidence, an info over size-only evidence.
    // Whether proven evidence holds a copy of a parameter's data, not only
    // statistics of it (an amax, a scale, which a compiled graph may save
    // for backward instead of recomputing): an allocation of at least half
    // a byte per element of its parameter's shard (an FP4 copy). A
    // parameter registered without sizes counts: nothing to compare with.
    bool holds_copy(const std::vector<WeightHeld>& evidence) const {
        for (const WeightHeld& h : evidence) {
            if (!h.origin.proven) continue;
            const allocscope_param_v2* p = host_.param(host_.ctx, h.origin.param);
            if (!p || p->numel == 0) return true;
            const uint64_t shard =
                p->sharded_numel != 0 && p->sharded_numel < p->numel ? p->sharded_numel : p->numel;
            if (h.size * 2 >= shard) return true;
        }
        return false;
    }

    // A proven finding whose evidence holds no copy is an info (holds_copy):
    // its summary says why.
    static void note_statistics_only(Finding& f) {
        if (f.basis == kProven && f.severity != ALLOCSCOPE_SEVERITY_ERROR)
            f.summary +=
                "; none of them holds as much as half a byte per element of its "
                "parameter: statistics of the weights (scales, amax), not copies";
    }

    Finding layer_finding(const RetentionByLayer::Entry& e, bool proven, const char* phase,
                          std::string_view why) {
        Finding f;
        f.severity =
            proven && holds_copy(e.evidence) ? ALLOCSCOPE_SEVERITY_ERROR : ALLOCSCOPE_SEVERITY_INFO;
        f.basis = proven ? kProven : kSizeOnly;
        f.layer = text(e.layer);
        f.phase = phase;
        f.bytes = e.bytes;
        f.count = e.count;
        f.evidence = evidence(e.evidence, why);
        finish_evidence(f);
        return f;
    }

    void finish_evidence(Finding& f) {
        watch_.fill(f.evidence);
        f.evidence = capped_evidence(std::move(f.evidence));
    }

    const allocscope_host_v2& host_;
    const uint64_t threshold_;
    LevelFilter level_;
    Interner strings_;
    WeightParams params_;
    const WeightSizeRules rules_;
    EvidenceWatch watch_;
    RetentionByLayer proven_;  // windows' proven evidence
    RetentionByLayer sized_;   // windows' size-only evidence
    const uint32_t forward_ = strings_.intern("forward");
    const uint32_t backward_ = strings_.intern("backward");
    const uint32_t optimizer_ = strings_.intern("optimizer");
    uint32_t source_ = ALLOCSCOPE_SOURCE_RUN;
    // By address, the followed level only: allocations of the analysed
    // phase (see State).
    FlatMap<uint64_t, Record> live_;

  private:
    struct ParamIds {
        uint32_t module = 0;
        uint32_t numbered = 0;
        bool known = false;
    };
    // The interned module and numbered layer of the host's parameter
    // `index`, cached; nullptr when the host has no such parameter or it
    // has no module.
    const ParamIds* param_ids(uint32_t index) {
        if (index < param_ids_.size() && param_ids_[index].known) return &param_ids_[index];
        const allocscope_param_v2* p = host_.param(host_.ctx, index);
        if (!p || !p->layer || !*p->layer) return nullptr;
        if (index >= param_ids_.size()) param_ids_.resize(std::size_t(index) + 1);
        ParamIds& ids = param_ids_[index];
        ids.module = strings_.intern(p->layer);
        ids.numbered = strings_.intern(numbered_layer(p->layer));
        ids.known = true;
        return &ids;
    }
    static std::string param_text(const allocscope_param_v2* p) {
        if (!p) return "an unknown parameter";
        std::string out = p->layer ? p->layer : "";
        if (p->name && *p->name) out += std::string(".") + p->name;
        return out;
    }
    // Which of the parameter's forms a size-matched allocation's size is.
    const char* form(const Origin& o, uint64_t size) const {
        if (!o.data) return "scale";
        const uint64_t n = params_.numel(o.param);
        auto is = [&](uint64_t raw) {
            const uint64_t r = caching_round(raw);
            return raw > 0 &&
                   (size == raw || size == r ||
                    (r > kCachingSmallSize && size > r && size - r <= kCachingSmallSize));
        };
        if (is(n)) return "FP8 data or transpose";
        if (is((n + 1) / 2)) return "NVFP4 data";
        if (rules_.bf16_copy && is(2 * n)) return "bf16 copy";
        return "per-shard form";
    }

    std::vector<ParamIds> param_ids_;
    std::vector<uint64_t> scratch_;
    bool any_param_ = false;
    bool saw_derived_ = false;
    bool provenance_paused_ = false;  // ALLOCSCOPE_PROVENANCE_PAUSED until resumed
    bool saw_pass_ = false;           // a forward or backward (sub-)phase was pushed
};

// Steps measured in baseline mode: the first is dropped as warm-up when
// there are two or more; true when it was.
template <class T>
bool drop_warmup(std::vector<T>& steps) {
    if (steps.size() < 2) return false;
    steps.erase(steps.begin());
    return true;
}

// "N steps after the warm-up step)" or "N steps, no warm-up step excluded)".
inline std::string steps_basis(uint64_t steps, bool warmup_excluded) {
    return std::to_string(steps) + (steps == 1 ? " step" : " steps") +
           (warmup_excluded ? " after the warm-up step)" : ", no warm-up step excluded)");
}

}  // namespace allocscope::plugins
