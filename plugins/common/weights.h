// What weight-copy-accumulation and transpose-cache-retention share: the
// options, the parameter table (common/plugin.h, WeightParams), the event
// routing, the following of weight-derived candidate allocations until they
// are freed, and the pieces of their findings. Header-only, like plugin.h.
#pragma once

#include <cmath>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/plugin.h"

namespace allocscope::plugins {

// A detector of weight-derived allocations kept past a phase. The subclass
// handles the events through enter/on_alloc/on_push/on_pop.
class WeightDetector {
  public:
    WeightDetector(const allocscope_host_v1& host, const char* threshold_key,
                   uint64_t default_threshold, WeightSizeRules rules, uint64_t default_min_numel)
        : host_(host),
          threshold_(option_bytes(host, threshold_key, default_threshold)),
          level_(option_level(host, "level")),
          params_(strings_, rules,
                  option_count(host, "min_numel", default_min_numel, 1, uint64_t{1} << 62)),
          retained_(watch_) {
        source_ = host.has_baseline ? ALLOCSCOPE_SOURCE_BASELINE : ALLOCSCOPE_SOURCE_RUN;
        params_.sync(host);
    }
    virtual ~WeightDetector() = default;
    WeightDetector(const WeightDetector&) = delete;
    WeightDetector& operator=(const WeightDetector&) = delete;

    void on_event(const allocscope_event_v1& e) {
        enter(e.source);
        switch (e.kind) {
            case ALLOCSCOPE_EVENT_ALLOC:
                on_alloc(e);
                break;
            case ALLOCSCOPE_EVENT_FREE:
                on_free(e);
                break;
            case ALLOCSCOPE_EVENT_TAG_PUSH:
                on_push(e);
                break;
            case ALLOCSCOPE_EVENT_TAG_POP:
                on_pop(e);
                break;
            case ALLOCSCOPE_EVENT_PARAM:
                if (const allocscope_param_v1* p = host_.param(host_.ctx, e.param_index))
                    params_.add(*p);
                break;
            default:
                break;
        }
    }

  protected:
    // A candidate allocation still alive (or a retained one, until freed).
    struct Record {
        uint64_t seq;
        uint64_t size;
        uint64_t step;
        uint32_t stack_id;
        uint32_t module;
        uint32_t phase;
    };

    virtual void enter(uint32_t source) = 0;
    virtual void on_alloc(const allocscope_event_v1& e) = 0;
    virtual void on_push(const allocscope_event_v1& e) = 0;
    virtual void on_pop(const allocscope_event_v1& e) = 0;

    bool analyzing() const { return source_ == ALLOCSCOPE_SOURCE_RUN; }
    // The id of an event's phase's base phase: compare with forward_ etc.
    // (phase_within(phase, "forward") is base_phase(phase) == forward_).
    uint32_t base_phase(const char* phase) { return strings_.base_phase(strings_.tag(phase)); }
    const std::string& text(uint32_t id) const { return strings_.text(id); }
    uint64_t live_bytes() const { return host_.live_bytes(host_.ctx, level_.level()); }

    void on_free(const allocscope_event_v1& e) {
        bool switched = false;
        // Filtered by level: a segment and its first block share an address.
        if (!level_.follow(e, &switched)) return;
        const Record* r = live_.find(e.address);
        if (!r) return;
        watch_.on_free(r->seq, e.seq);
        live_.erase(e.address);
    }

    // The parameter an allocation made in `phase` is derived from, with its
    // module (interned); nullopt when it is not a candidate. Drops a record
    // left at the allocation's address (stale: a missed free).
    std::optional<WeightParams::Match> match_alloc(const allocscope_event_v1& e, uint32_t phase,
                                                   uint32_t* module) {
        live_.erase(e.address);  // a record left at this address is stale (missed free)
        if (base_phase(e.phase) != phase || !e.layer || !*e.layer) return std::nullopt;
        *module = strings_.tag(e.layer);
        return params_.match(*module, e.size);
    }
    void follow(const allocscope_event_v1& e, uint32_t module) {
        live_[e.address] = Record{e.seq, e.size, e.step, e.stack_id, module, strings_.tag(e.phase)};
    }

    // The outermost scope of `frames` accepted by `in_phase` that encloses
    // parameter `param`'s module and lies within its numbered layer (when it
    // has one); nullptr when there is none.
    template <class Frame, class InPhase>
    Frame* enclosing_scope(std::vector<Frame>& frames, uint32_t param, InPhase in_phase) const {
        const std::string_view module = text(params_.module(param));
        const std::string_view numbered = text(params_.numbered(param));
        for (Frame& f : frames) {
            if (!in_phase(f) || f.layer == 0) continue;
            const std::string_view scope = text(f.layer);
            if (!layer_within(module, scope)) continue;
            if (!numbered.empty() && !layer_within(scope, numbered)) continue;
            return &f;
        }
        return nullptr;
    }

    // The phase window closed: each of `candidates` (address, seq, module,
    // data) still alive is retained, passed to keep(candidate, evidence);
    // scale-sized ones only in a module that retains a data-sized one too. A
    // scale belongs to a quantized form: small allocations of scale sizes
    // kept without one (a bias's gradient accumulated across micro-batches
    // has such a size) are not weight-derived.
    template <class Candidate, class Keep>
    void retain_alive(const std::vector<Candidate>& candidates, Keep keep) {
        // The candidate's record while the allocation is alive, else nullptr.
        auto alive = [&](const Candidate& c) -> const Record* {
            const Record* r = live_.find(c.address);
            return r && r->seq == c.seq ? r : nullptr;
        };
        std::vector<uint32_t> data_modules;
        for (const Candidate& c : candidates) {
            if (c.data && alive(c)) data_modules.push_back(c.module);
        }
        std::sort(data_modules.begin(), data_modules.end());
        for (const Candidate& c : candidates) {
            const Record* found = alive(c);
            if (!found) continue;
            if (!std::binary_search(data_modules.begin(), data_modules.end(), c.module)) {
                live_.erase(c.address);  // not derived after all; stop following it
                continue;
            }
            const Record& r = *found;
            keep(c, HeldAlloc{r.size, r.step, r.seq, r.stack_id, r.module, r.phase});
        }
    }

    std::string common_layer(const std::vector<uint32_t>& layers) const {
        if (layers.empty()) return {};
        std::string_view common = text(layers.front());
        for (uint32_t l : layers)
            common = common_module(common, text(l));
        return std::string(common);
    }

    // Every layer's most-retaining window, as one evidence list.
    std::vector<Evidence> all_layer_evidence(uint64_t* count) const {
        std::vector<Evidence> out;
        *count = 0;
        for (const RetentionByLayer::Entry& e : retained_.entries()) {
            for (const HeldAlloc& h : e.evidence)
                out.push_back(evidence(h));
            *count += e.count;
        }
        return out;
    }

    Evidence evidence(const HeldAlloc& h) const {
        return {h.size, text(h.layer), text(h.phase), h.step, h.alloc_seq, 0, h.stack_id};
    }
    std::vector<Evidence> evidence(const std::vector<HeldAlloc>& held) const {
        std::vector<Evidence> out;
        out.reserve(held.size());
        for (const HeldAlloc& h : held)
            out.push_back(evidence(h));
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

    // The baseline comparison's finding, evidence filled in and capped.
    Finding baseline_finding(const char* phase, double excess) {
        Finding f;
        f.severity = ALLOCSCOPE_SEVERITY_ERROR;
        f.phase = phase;
        f.bytes = uint64_t(std::llround(excess));
        f.evidence = all_layer_evidence(&f.count);
        finish_evidence(f);
        return f;
    }

    // A layer's most-retaining window as a finding, without its summary.
    Finding layer_finding(const RetentionByLayer::Entry& e, const char* phase) {
        Finding f;
        f.severity = ALLOCSCOPE_SEVERITY_ERROR;
        f.layer = text(e.layer);
        f.phase = phase;
        f.bytes = e.bytes;
        f.count = e.count;
        f.evidence = evidence(e.evidence);
        finish_evidence(f);
        return f;
    }

    void finish_evidence(Finding& f) {
        watch_.fill(f.evidence);
        f.evidence = capped_evidence(std::move(f.evidence));
    }

    const allocscope_host_v1& host_;
    const uint64_t threshold_;
    LevelFilter level_;
    Interner strings_;
    WeightParams params_;
    EvidenceWatch watch_;
    RetentionByLayer retained_;
    const uint32_t forward_ = strings_.intern("forward");
    const uint32_t backward_ = strings_.intern("backward");
    const uint32_t optimizer_ = strings_.intern("optimizer");
    uint32_t source_ = ALLOCSCOPE_SOURCE_RUN;
    FlatMap<uint64_t, Record> live_;  // by address, the followed level only
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
